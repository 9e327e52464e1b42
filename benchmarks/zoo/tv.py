"""Image classifiers from torchvision (imported only when built: torchvision is not installed on
every machine, and never by this project).

Called as ``model(x=images)``; the loss is cross-entropy against random labels. Tiny: the same
classes at 32x32, batch 2, 10 classes, one or two blocks per stage. Real: the library's standard
constructors (``weights=None``: random weights, nothing downloaded) at batch 64, 224x224.
Stochastic depth is set to 0 after construction (``common.zero_dropout_modules``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.zoo.common import floats, instantiate, labels
from benchmarks.zoo.spec import Built, Size

TINY = (2, 32, 10)  # batch, image side, classes
REAL = (64, 224, 1000)


def _classifier(factory: Callable[[int], nn.Module], size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    batch, side, classes = TINY if size == "tiny" else REAL
    model = instantiate(lambda: factory(classes), device, dtype)
    images = floats((batch, 3, side, side), device, dtype)
    target = labels(batch, classes, device)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), target)

    return Built(model, {"x": images}, {"x": images}, loss, f"b{batch} 3x{side}x{side}")


def _builder(make: Callable[[Size, int], nn.Module]) -> Callable[[Size, torch.device, torch.dtype], Built]:
    def build(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
        return _classifier(lambda classes: make(size, classes), size, device, dtype)

    build.__doc__ = make.__doc__
    return build


@_builder
def resnet50(size: Size, classes: int) -> Any:
    """torchvision ResNet-50 (tiny: one bottleneck block per stage)."""
    from torchvision.models import resnet

    if size == "tiny":
        return resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=classes)
    return resnet.resnet50(weights=None, num_classes=classes)


@_builder
def vit_b_16(size: Size, classes: int) -> Any:
    """torchvision ViT-B/16 (tiny: 2 layers of 32, 8x8 patches)."""
    from torchvision.models import vision_transformer as vt

    if size == "tiny":
        return vt.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                    mlp_dim=64, num_classes=classes)
    return vt.vit_b_16(weights=None, num_classes=classes)


@_builder
def mobilenet_v3_large(size: Size, classes: int) -> Any:
    """torchvision MobileNetV3-Large: hard-swish, squeeze-and-excitation (tiny: a quarter of the width)."""
    from torchvision.models import mobilenetv3

    if size == "tiny":
        return mobilenetv3.mobilenet_v3_large(weights=None, num_classes=classes, width_mult=0.25)
    return mobilenetv3.mobilenet_v3_large(weights=None, num_classes=classes)


@_builder
def swin_t(size: Size, classes: int) -> Any:
    """torchvision Swin-T (tiny: embed 16, depths 2-1, windows of 4)."""
    from torchvision.models import swin_transformer as st

    if size == "tiny":
        return st.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 1], num_heads=[1, 2],
                                  window_size=[4, 4], stochastic_depth_prob=0.0, num_classes=classes)
    return st.swin_t(weights=None, num_classes=classes)


@_builder
def convnext_tiny(size: Size, classes: int) -> Any:
    """torchvision ConvNeXt-T (tiny: two stages of one block, 16 and 32 channels)."""
    from torchvision.models import convnext

    if size == "tiny":
        stages = [convnext.CNBlockConfig(16, 32, 1), convnext.CNBlockConfig(32, None, 1)]
        return convnext.ConvNeXt(stages, stochastic_depth_prob=0.0, num_classes=classes)
    return convnext.convnext_tiny(weights=None, num_classes=classes)
