"""Image classifiers from transformers: vision transformers and convolutional networks.

Every model is the library's ``...ForImageClassification``: inference on ``pixel_values``, training
with ``labels=`` (the model's own cross-entropy). Tiny: 32x32 images, batch 2, 10 classes, one or two
blocks per stage and few channels. Real: the standard ImageNet size at batch 64, 224x224, 1000
classes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from benchmarks.zoo.common import drop_nothing, floats, instantiate, labels, model_loss
from benchmarks.zoo.spec import Built, Size

TINY = (2, 32, 10)  # batch, image side, classes
REAL = (64, 224, 1000)
# MobileNetV2 downsamples 32 times: at 32x32 a batch of 2 leaves the last stages' batch norms 2
# values per channel, where the float32 gradient is so ill-conditioned that eager's own distance
# from float64 reaches 7e-6 of the largest gradient and a correct reordering of the sums lands up to
# 4x further (a compiled float64 step matched eager's to 2e-13 there). At 64x64 they normalize 8
# values or more, in about the same time.
TINY_SIDE_MOBILENET = 64


def classifier(model_cls: type, config: Any, side: int, size: Size, device: torch.device, dtype: torch.dtype,
               batch: int | None = None) -> Built:
    """``model_cls(config)`` on ``pixel_values`` of ``side`` x ``side``, trained with ``labels=``; the
    batch is the size's (``TINY`` or ``REAL``) unless given."""
    default_batch, _, classes = TINY if size == "tiny" else REAL
    batch = batch or default_batch
    config.num_labels = classes
    config = drop_nothing(config)
    model = instantiate(lambda: model_cls(config), device, dtype)
    pixels = floats((batch, 3, side, side), device, dtype)
    target = labels(batch, classes, device)
    return Built(model, {"pixel_values": pixels}, {"pixel_values": pixels, "labels": target}, model_loss,
                 f"b{batch} 3x{side}x{side}")


Made = tuple[type, Any] | tuple[type, Any, int]  # the model class, its configuration[, the image side]


def image_classifier(make: Callable[[Size], Made]) -> Callable[[Size, torch.device, torch.dtype], Built]:
    """A zoo builder from ``make(size)``, which names the model class, its configuration and the
    image side where it is not the size's (decorator; ``classifier`` builds)."""

    def build(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
        made = make(size)
        side = made[2] if len(made) == 3 else (TINY if size == "tiny" else REAL)[1]
        return classifier(made[0], made[1], side, size, device, dtype)

    build.__doc__ = make.__doc__
    return build


@image_classifier
def vit(size: Size) -> Made:
    """ViT: patch embedding, pre-norm encoder, classifier on the [CLS] token."""
    from transformers import ViTConfig, ViTForImageClassification

    if size == "tiny":
        return ViTForImageClassification, ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                    intermediate_size=64, image_size=32, patch_size=8)
    return ViTForImageClassification, ViTConfig()  # ViT-B/16: 12 layers, 768 wide, 86M parameters


@image_classifier
def swin(size: Size) -> Made:
    """Swin: windowed attention with shifted windows (every second block) and patch merging."""
    from transformers import SwinConfig, SwinForImageClassification

    if size == "tiny":
        # 8x8 patches in windows of 4: the second block of stage 1 shifts; stage 2 is one 4x4 window
        return SwinForImageClassification, SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2, 1],
                                                      num_heads=[1, 2], window_size=4)
    # Swin-T: embed 96, depths 2-2-6-2, windows of 7, 28M parameters
    return SwinForImageClassification, SwinConfig(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])


@image_classifier
def convnext(size: Size) -> Made:
    """ConvNeXt: 7x7 depthwise convolutions, LayerNorm over channels, inverted MLP, layer scale."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    if size == "tiny":
        return ConvNextForImageClassification, ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                                                              image_size=32)
    return ConvNextForImageClassification, ConvNextConfig()  # ConvNeXt-T: 96-768 wide, depths 3-3-9-3


@image_classifier
def resnet(size: Size) -> Made:
    """ResNet with bottleneck blocks and batch norm."""
    from transformers import ResNetConfig, ResNetForImageClassification

    if size == "tiny":
        return ResNetForImageClassification, ResNetConfig(embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1],
                                                          layer_type="bottleneck")
    return ResNetForImageClassification, ResNetConfig()  # ResNet-50: depths 3-4-6-3, 25.6M parameters


@image_classifier
def mobilenet_v2(size: Size) -> Made:
    """MobileNetV2: inverted residuals, depthwise convolutions, ReLU6, batch norm, TF-style padding."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    if size == "tiny":
        # the 17 blocks are fixed by the architecture; a quarter of the channels
        config = MobileNetV2Config(depth_multiplier=0.25, image_size=TINY_SIDE_MOBILENET)
        return MobileNetV2ForImageClassification, config, TINY_SIDE_MOBILENET
    return MobileNetV2ForImageClassification, MobileNetV2Config()  # width 1.0 at 224: 3.5M parameters


# MobileNetV2 downsamples 32 times: at 32x32 a batch of 2 leaves the last stages' batch norms 2
# values per channel, where the float32 gradient is so ill-conditioned that eager's own distance
# from float64 reaches 7e-6 of the largest gradient and a correct reordering of the sums lands up to
# 4x further (the compiled float64 step matched eager's to 2e-13 there). At 64x64 they normalize 8
# values or more; this costs no more time in the interpreter (fewer, larger blocks dominate).


@image_classifier
def efficientnet(size: Size) -> Made:
    """EfficientNet: MBConv blocks with squeeze-and-excitation, SiLU, batch norm."""
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    if size == "tiny":
        return EfficientNetForImageClassification, EfficientNetConfig(
            image_size=32, width_coefficient=0.25, depth_coefficient=1.0, kernel_sizes=[3, 5, 3],
            in_channels=[32, 16, 24], out_channels=[16, 24, 40], strides=[1, 2, 2], num_block_repeats=[1, 2, 1],
            expand_ratios=[1, 6, 6], hidden_dim=320)  # hidden_dim: the head's width, 1280 x 0.25
    # EfficientNet-B0: width and depth coefficients 1.0, 1280 features, 5.3M parameters
    return EfficientNetForImageClassification, EfficientNetConfig(image_size=224, width_coefficient=1.0,
                                                                  depth_coefficient=1.0, hidden_dim=1280)


@image_classifier
def clip_vision(size: Size) -> Made:
    """CLIP's image tower (ViT with a pre-LayerNorm and quick-GELU) with a linear classifier."""
    from transformers import CLIPConfig, CLIPForImageClassification

    if size == "tiny":
        vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "image_size": 32, "patch_size": 8}
    else:  # CLIP ViT-B/32: 12 layers, 768 wide, 32x32 patches
        vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "image_size": 224, "patch_size": 32}
    return CLIPForImageClassification, CLIPConfig(vision_config=vision)
