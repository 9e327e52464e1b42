"""Models outside the zoo, by their library's name: ``timm:NAME`` and ``tv:NAME``.

A user trying the backend on a model of their own names it as their library does:
``python -m benchmarks.zoo --models timm:regnety_032,tv:vgg16_bn``. The runner treats it as it
treats a zoo model (checked against eager, timed, profiled and audited), at the real size only:
there is no tiny configuration of an arbitrary architecture.

- ``timm:NAME``: ``timm.create_model(NAME, pretrained=False)`` (random weights, nothing
  downloaded), dropout and stochastic depth off, at batch 64 and the image size of the model's
  own configuration (``pretrained_cfg["input_size"]``: 224 for most, 240, 256 or 299 for some).
- ``tv:NAME``: ``torchvision.models.get_model(NAME, weights=None)``, batch 64, 224x224; a
  classifier whose training output carries auxiliary logits (GoogLeNet, Inception v3) is built
  without them.

Both are image classifiers of 1000 classes called as ``model(x=images)``; the loss is
cross-entropy against random labels.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.zoo.common import floats, instantiate, labels
from benchmarks.zoo.spec import Built, Size, Unavailable, ZooModel

BATCH, CLASSES, SIDE = 64, 1000, 224
PREFIXES = {"timm": "timm", "tv": "torchvision"}  # prefix -> the library that must import
# torchvision classifiers with auxiliary heads: built without them, so that one tensor comes out
_NO_AUX = {"googlenet", "inception_v3"}


def is_by_name(name: str) -> bool:
    prefix, _, rest = name.partition(":")
    return prefix in PREFIXES and bool(rest)


def model(name: str) -> ZooModel:
    """The ``ZooModel`` of ``timm:NAME`` or ``tv:NAME``; ``ValueError`` for any other name."""
    if not is_by_name(name):
        raise ValueError(f"{name!r}: a model by name is timm:NAME or tv:NAME")
    prefix, _, rest = name.partition(":")
    make = _timm if prefix == "timm" else _torchvision

    def build(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
        if size != "real":
            raise Unavailable(f"{name}: a model by name has no tiny configuration (run it at the real size)")
        return make(rest, device, dtype)

    library = PREFIXES[prefix]
    return ZooModel(name, library, f"{library} {rest} by name, random weights, b{BATCH}", build)


def _timm(name: str, device: torch.device, dtype: torch.dtype) -> Built:
    import timm

    def factory() -> nn.Module:
        try:
            return timm.create_model(name, pretrained=False, num_classes=CLASSES, drop_rate=0.0,
                                     drop_path_rate=0.0)
        except TypeError:  # a class that takes no drop_path_rate
            return timm.create_model(name, pretrained=False, num_classes=CLASSES, drop_rate=0.0)

    built = instantiate(factory, device, dtype)
    size = getattr(built, "pretrained_cfg", {}).get("input_size") or (3, SIDE, SIDE)
    return _classifier(built, tuple(size), device, dtype)


def _torchvision(name: str, device: torch.device, dtype: torch.dtype) -> Built:
    import torchvision

    options: dict[str, Any] = {"weights": None, "num_classes": CLASSES}
    if name in _NO_AUX:
        options.update(aux_logits=False, init_weights=False)
    built = instantiate(lambda: torchvision.models.get_model(name, **options), device, dtype)
    return _classifier(built, (3, SIDE, SIDE), device, dtype)


def _classifier(net: nn.Module, image: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Built:
    images = floats((BATCH, *image), device, dtype)
    target = labels(BATCH, CLASSES, device)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), target[: logits.shape[0]])

    return Built(net, {"x": images}, {"x": images}, loss, f"b{BATCH} {'x'.join(map(str, image))}")

