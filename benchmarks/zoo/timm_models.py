"""Image classifiers from timm (imported only when built: timm is not installed on every machine,
and never by this project).

``timm.create_model(name, pretrained=False)``: random weights, nothing downloaded. Called as
``model(x=images)``; the loss is cross-entropy against random labels. Tiny: the same architecture
with keyword overrides (fewer layers, narrower, 32x32 images, batch 2, 10 classes). Real: the
named model at batch 64, 224x224.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.zoo.common import floats, instantiate, labels
from benchmarks.zoo.spec import Built, Size

TINY = (2, 32, 10)  # batch, image side, classes
REAL = (64, 224, 1000)

# name -> keyword overrides that make the tiny configuration
TINY_ARGS: dict[str, dict[str, Any]] = {
    "vit_base_patch16_224": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2},
    # EfficientNet's stage list is fixed by the name; only the image and the batch shrink
    "efficientnet_b0": {},
    "convnext_tiny": {"depths": (1, 1, 1, 1), "dims": (16, 32, 64, 128)},
}


def _create(name: str, size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    import timm

    batch, side, classes = TINY if size == "tiny" else REAL
    overrides = TINY_ARGS[name] if size == "tiny" else {}
    model = instantiate(lambda: timm.create_model(name, pretrained=False, num_classes=classes, drop_rate=0.0,
                                                  drop_path_rate=0.0, **overrides), device, dtype)
    images = floats((batch, 3, side, side), device, dtype)
    target = labels(batch, classes, device)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), target)

    return Built(model, {"x": images}, {"x": images}, loss, f"b{batch} 3x{side}x{side}")


def vit_base_patch16_224(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """timm ViT-B/16."""
    return _create("vit_base_patch16_224", size, device, dtype)


def efficientnet_b0(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """timm EfficientNet-B0."""
    return _create("efficientnet_b0", size, device, dtype)


def convnext_tiny(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """timm ConvNeXt-T."""
    return _create("convnext_tiny", size, device, dtype)
