"""Image classifiers, a segmentation model and a video model from torchvision (imported only when
built: torchvision is not installed on every machine, and never by this project).

Called as ``model(x=images)``; the loss is cross-entropy against random labels (per pixel for
DeepLabV3). Tiny: the same classes at 32x32, batch 2, 10 classes, one or two blocks per stage.
Real: the library's standard constructors (``weights=None``, and ``weights_backbone=None`` for
DeepLabV3: random weights, nothing downloaded) at batch 64, 224x224 (DeepLabV3: batch 8, 512x512,
21 classes as in Pascal VOC; R3D-18: batch 8 clips of 16 frames at 112x112). Stochastic depth is
set to 0 after construction (``common.zero_dropout_modules``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.zoo.common import floats, generator, instantiate, labels
from benchmarks.zoo.spec import Built, Size

TINY = (2, 32, 10)  # batch, image side, classes
REAL = (64, 224, 1000)


def _classifier(factory: Callable[[int], nn.Module], size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    batch, side, classes = TINY if size == "tiny" else REAL
    model = instantiate(lambda: factory(classes), device, dtype)
    images = floats((batch, 3, side, side), device, dtype)
    target = labels(batch, classes, device)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), target[: logits.shape[0]])

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


@_builder
def densenet121(size: Size, classes: int) -> Any:
    """torchvision DenseNet-121: dense blocks concatenating every layer's features, batch norm
    before each convolution (tiny: two dense blocks of 2 layers, growth rate 8)."""
    from torchvision.models import densenet

    if size == "tiny":
        return densenet.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2,
                                 num_classes=classes)
    return densenet.densenet121(weights=None, num_classes=classes)


@_builder
def resnext50_32x4d(size: Size, classes: int) -> Any:
    """torchvision ResNeXt-50 32x4d: bottlenecks with grouped 3x3 convolutions, 32 groups of 4 channels
    (tiny: one block per stage, 4 groups of 8)."""
    from torchvision.models import resnet

    if size == "tiny":
        return resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], groups=4, width_per_group=8, num_classes=classes)
    return resnet.resnext50_32x4d(weights=None, num_classes=classes)


@_builder
def regnet_x_1_6gf(size: Size, classes: int) -> Any:
    """torchvision RegNetX-1.6GF: grouped-convolution bottlenecks without squeeze-and-excitation
    (tiny: 3 blocks over widths 8-32, groups of 8)."""
    from torchvision.models import regnet

    if size == "tiny":
        params = regnet.BlockParams.from_init_params(depth=3, w_0=8, w_a=8.0, w_m=2.0, group_width=8)
        return regnet.RegNet(params, num_classes=classes, stem_width=8)
    return regnet.regnet_x_1_6gf(weights=None, num_classes=classes)


@_builder
def efficientnet_v2_s(size: Size, classes: int) -> Any:
    """torchvision EfficientNetV2-S: fused MBConv (one full 3x3 convolution) in the early stages,
    MBConv with squeeze-and-excitation after (tiny: two fused stages and one MBConv stage)."""
    from torchvision.models import efficientnet as en

    if size == "tiny":
        stages = [en.FusedMBConvConfig(1, 3, 1, 16, 16, 1), en.FusedMBConvConfig(4, 3, 2, 16, 24, 1),
                  en.MBConvConfig(4, 3, 2, 24, 32, 1)]
        return en.EfficientNet(stages, dropout=0.0, stochastic_depth_prob=0.0, num_classes=classes, last_channel=64)
    return en.efficientnet_v2_s(weights=None, num_classes=classes)


SEGMENTATION_TINY = (2, 32, 10)  # batch, image side, classes
SEGMENTATION_REAL = (8, 512, 21)


def deeplabv3_resnet50(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """torchvision DeepLabV3 with a ResNet-50 backbone: dilated convolutions in the last two stages
    (output stride 8), atrous spatial pyramid pooling (rates 12, 24, 36 and a global pool), the
    logits upsampled (bilinear) to the image. Trained with per-pixel cross-entropy on its "out"
    logits. Tiny: a ResNet of one bottleneck per stage, its inner widths a quarter of ResNet-50's."""
    from torchvision.models import resnet
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation import deeplabv3

    batch, side, classes = SEGMENTATION_TINY if size == "tiny" else SEGMENTATION_REAL

    def make() -> nn.Module:
        if size == "real":
            return deeplabv3.deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=classes,
                                                aux_loss=False)
        backbone = resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], width_per_group=16,
                                 replace_stride_with_dilation=[False, True, True])
        body = IntermediateLayerGetter(backbone, return_layers={"layer4": "out"})
        return deeplabv3.DeepLabV3(body, deeplabv3.DeepLabHead(backbone.inplanes, classes))

    return _segmentation(make, (batch, side, classes), device, dtype, "x")


def lraspp_mobilenet_v3_large(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """torchvision LR-ASPP with a MobileNetV3-Large backbone (its last stages dilated, output stride
    16): the high features through a 1x1 convolution, gated by a sigmoid of their global average
    pool, upsampled to the low features' size (bilinear) and added to a 1x1 classifier of those,
    the logits upsampled to the image. Tiny: the backbone at a quarter of its width, 64x64 (at
    32x32 the high features are 2x2)."""
    from torchvision.models import mobilenetv3
    from torchvision.models.segmentation import lraspp

    batch, side, classes = (SEGMENTATION_TINY[0], 64, SEGMENTATION_TINY[2]) if size == "tiny" else SEGMENTATION_REAL

    def make() -> nn.Module:
        if size == "real":
            return lraspp.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=classes)
        backbone = mobilenetv3.mobilenet_v3_large(weights=None, dilated=True, width_mult=0.25)
        return lraspp._lraspp_mobilenetv3(backbone, classes)

    return _segmentation(make, (batch, side, classes), device, dtype, "input")


def _segmentation(make: Callable[[], nn.Module], shape: tuple[int, int, int], device: torch.device,
                  dtype: torch.dtype, argument: str) -> Built:
    """A segmentation model of torchvision's (its logits under "out") on random images, trained
    with per-pixel cross-entropy against random classes. ``shape``: batch, image side, classes;
    ``argument``: the name its forward gives the images."""
    batch, side, classes = shape
    model = instantiate(make, device, dtype)
    images = floats((batch, 3, side, side), device, dtype)
    target = torch.randint(0, classes, (batch, side, side), generator=generator(100)).to(device)

    def loss(output: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = output["out"]
        return F.cross_entropy(logits.float(), target[: logits.shape[0]])

    return Built(model, {argument: images}, {argument: images}, loss, f"b{batch} 3x{side}x{side}")


@_builder
def shufflenet_v2_x1_0(size: Size, classes: int) -> Any:
    """torchvision ShuffleNetV2 1.0: each unit splits its channels, convolves one half, and
    shuffles the two back together (tiny: one unit per stage, narrow)."""
    from torchvision.models import shufflenetv2

    if size == "tiny":
        return shufflenetv2.ShuffleNetV2([1, 1, 1], [8, 16, 32, 64, 128], num_classes=classes)
    return shufflenetv2.shufflenet_v2_x1_0(weights=None, num_classes=classes)


def r3d_18(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """torchvision R3D-18: 3-d convolutions over video clips (real: b8 3x16x112x112, Kinetics-400's
    400 classes; tiny: one block per stage over 2 clips of 3x4x32x32, 10 classes)."""
    from torchvision.models.video import resnet as video

    if size == "tiny":
        batch, clip, classes = 2, (3, 4, 32, 32), 10
        make = lambda: video.VideoResNet(video.BasicBlock, [video.Conv3DSimple] * 4, [1, 1, 1, 1],  # noqa: E731
                                         video.BasicStem, num_classes=classes)
    else:
        batch, clip, classes = 8, (3, 16, 112, 112), 400
        make = lambda: video.r3d_18(weights=None, num_classes=classes)  # noqa: E731
    model = instantiate(make, device, dtype)
    clips = floats((batch, *clip), device, dtype)
    target = labels(batch, classes, device)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), target[: logits.shape[0]])

    return Built(model, {"x": clips}, {"x": clips}, loss, f"b{batch} {'x'.join(map(str, clip))}")
