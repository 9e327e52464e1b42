"""What a zoo entry is: a named builder of a real architecture, and what a build returns.

A ``ZooModel`` builds its model in one of two sizes: ``tiny`` (1-2 layers, hidden 32-64, 32x32
images or 16-token sequences: seconds on a CPU in Triton's interpreter) and ``real`` (the standard
size of the architecture at a usual batch, for a GPU). The weights are random (seeded), the
configuration is written out here: nothing is downloaded.

``build(size, device, dtype)`` returns a ``Built``:

- ``model``: in train mode, dropout off everywhere (configuration probabilities 0 and every
  ``nn.Dropout`` at ``p=0``), so that compiled and eager runs can be compared. Batch norm stays as
  the mode says (train mode updates running statistics). Batch norm is first made to keep its
  activations' scale, as a trained model's does (``calibrate_batch_norm``): otherwise a deep
  random network's activations fade layer by layer (transformers initializes EfficientNet's
  batch-norm scales at about 0.02, and its logits were 1e-33 in fp32 and exactly 0 in bf16), and
  an error measured on them tells nothing.
- ``inputs``: keyword arguments of ``model(**inputs)`` for inference.
- ``train_inputs``: keyword arguments for the training step (``inputs`` plus labels where the
  model computes its own loss).
- ``loss(output)``: the training loss from ``model(**train_inputs)``'s output. A loss that holds
  its own targets (labels, noise, a target image) takes the first as many rows of them as the output
  has, so that a batch cut by ``narrow`` (which cuts the inputs) still finds its targets.

A model whose library does not import here (torchvision, timm on a CPU machine) raises
``Unavailable`` with the reason, from ``build`` or from ``available()``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any, Callable, Literal

import torch
import torch.nn as nn

Size = Literal["tiny", "real"]
SIZES: tuple[Size, ...] = ("tiny", "real")


class Unavailable(RuntimeError):
    """The model's library cannot be imported here; the message says why."""


@dataclasses.dataclass(frozen=True)
class Built:
    model: nn.Module
    inputs: dict[str, torch.Tensor]
    train_inputs: dict[str, torch.Tensor]
    loss: Callable[[Any], torch.Tensor]
    shapes: str  # the batch in words, for reports ("b8 s512", "b64 3x224x224")


Builder = Callable[[Size, torch.device, torch.dtype], Built]


@dataclasses.dataclass(frozen=True)
class ZooModel:
    name: str
    library: str  # "transformers", "torchvision" or "timm": the package that must import
    description: str  # the architecture, and what "real" is
    builder: Builder

    def available(self) -> str | None:
        """None when the library imports here, else the reason it does not."""
        try:
            importlib.import_module(self.library)
        except Exception as exc:  # ImportError, or a broken install that fails while importing
            return f"{self.library} does not import here: {type(exc).__name__}: {exc}"
        return None

    def build(self, size: Size, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Built:
        if size not in SIZES:
            raise ValueError(f"size {size!r}: choose from {SIZES}")
        reason = self.available()
        if reason is not None:
            raise Unavailable(reason)
        built = self.builder(size, torch.device(device), dtype)
        calibrate_batch_norm(built)
        return built


def calibrate_batch_norm(built: Built, seed: int = 2) -> None:
    """Make every batch norm keep the scale of its activations, as in a trained model: its affine
    scale about 1 and shift about 0 (``1 + 0.1 z`` and ``0.1 z``, ``z`` standard normal from a fixed
    seed, so that channels differ), and its running mean and variance those of ``built.inputs`` (one
    forward pass in train mode without gradients, a cumulative average over that one batch:
    ``momentum=None``). The model is left in train mode; a model without batch norm is untouched."""
    norms = [m for m in built.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    draw = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in norms:
            if m.affine:
                z = torch.randn(2, m.num_features, generator=draw)
                m.weight.copy_(1 + 0.1 * z[0])
                m.bias.copy_(0.1 * z[1])
    norms = [m for m in norms if m.track_running_stats]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    built.model.train()
    with torch.no_grad():
        built.model(**built.inputs)
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum


def narrow(built: Built, batch: int | None = None, seq: int | None = None) -> Built:
    """``built`` at a smaller batch and sequence length (the runner's ``--batch`` and ``--seq``):
    the first ``batch`` rows of every input, and the first ``seq`` positions of every integer or
    boolean input of two or more dims (token ids, masks, labels), each made contiguous. Images and
    audio keep their sizes; a size larger than the built one is an error."""

    def cut(t: torch.Tensor) -> torch.Tensor:
        if batch is not None:
            if batch > t.shape[0]:
                raise ValueError(f"--batch {batch}: the built batch is {t.shape[0]}")
            t = t[:batch]
        if seq is not None and t.dim() >= 2 and not t.is_floating_point():
            t = t[:, :seq]
        return t.contiguous()

    shapes = built.shapes
    if batch is not None:
        shapes = re.sub(r"^b\d+", f"b{batch}", shapes)
    if seq is not None:
        shapes = re.sub(r"s(\d+)", lambda m: f"s{min(seq, int(m.group(1)))}", shapes)
    inputs = {k: cut(v) for k, v in built.inputs.items()}
    train_inputs = {k: inputs[k] if v is built.inputs.get(k) else cut(v) for k, v in built.train_inputs.items()}
    return dataclasses.replace(built, inputs=inputs, train_inputs=train_inputs, shapes=shapes)
