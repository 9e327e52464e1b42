"""Image classifiers from timm (imported only when built: timm is not installed on every machine,
and never by this project).

Real: ``timm.create_model(name, pretrained=False)`` (random weights, nothing downloaded) at batch
64, 224x224. Called as ``model(x=images)``; the loss is cross-entropy against random labels. Tiny:
the same architecture, fewer layers and narrower, at 32x32, batch 2, 10 classes: made by keyword
overrides of ``create_model`` (``TINY_ARGS``), or, where the named model's function passes its own
sizes beside the caller's keywords (``dict(patch_size=16, ..., **kwargs)``: an override is a
repeated keyword), by the model's class with the same settings at a tiny size (``TINY_MAKERS``).
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

# name -> keyword overrides that make the tiny configuration
TINY_ARGS: dict[str, dict[str, Any]] = {
    "vit_base_patch16_224": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2},
    # EfficientNet's stage list is fixed by the name; only the image and the batch shrink
    "efficientnet_b0": {},
    "convnext_tiny": {"depths": (1, 1, 1, 1), "dims": (16, 32, 64, 128)},
    # CoAtNet-0: two MBConv stages, two transformer stages with relative position bias
    "coatnet_0_rw_224": {"img_size": 32, "embed_dim": (16, 32, 64, 128), "depths": (1, 1, 1, 1),
                         "stem_width": (8, 16)},
    # EfficientViT-B0 is 3.4M parameters already; it downsamples 32 times. At 64x64 (a 2x2 map)
    # eager itself, its weights moved by one rounding, fell outside the gradient bound on 5 of 120
    # tensors (its linear attention divides by sums of few products); at 128x128, none
    "efficientvit_b0": {},
    # XCiT: cross-covariance attention (over channels), local patch interaction (depthwise 3x3
    # convolutions between batch norms), class attention; its patch embedding takes 16 or 8
    "xcit_tiny_12_p16_224": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2,
                             "cls_attn_layers": 1},
    # MaxViT (keywords over its config; transformer_* its attention's): MBConv, then attention in
    # blocks and in a grid, windows of img_size / 32 = 2
    # EVA-02: rotary embedding over the patch grid, SwiGLU MLPs; its model function lets keywords
    # override its sizes. Its head starts at a thousandth of its init (head_init_scale): logits of
    # 2e-4, too small to compare against eager; the tiny one starts at its init
    "eva02_tiny_patch14_224": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2,
                               "head_init_scale": 1.0},
    "maxvit_tiny_tf_224": {"img_size": 64, "embed_dim": (16, 32, 64, 128), "depths": (1, 1, 1, 1),
                           "stem_width": (8, 16), "head_hidden_size": 128, "transformer_dim_head": 8},
}
# GhostNet at 64 (EfficientViT at 128, above): at 32x32 its last stages are 1x1, where training-mode batch norm normalizes 2
# values a channel and the gradient through it is rounding noise (the compiled one's 5x eager's)
TINY_SIDE = {"efficientvit_b0": 128, "maxvit_tiny_tf_224": 64, "ghostnet_100": 64}

# models whose class takes no drop_path_rate (create_model passes its keywords on to the class)
NO_DROP_PATH = {"efficientvit_b0", "convmixer_768_32", "ghostnet_100"}


def _mixer(classes: int) -> nn.Module:
    from timm.models.mlp_mixer import MlpMixer

    return MlpMixer(num_classes=classes, img_size=32, patch_size=8, num_blocks=2, embed_dim=32)


def _resmlp(classes: int) -> nn.Module:
    from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

    return MlpMixer(num_classes=classes, img_size=32, patch_size=8, num_blocks=2, embed_dim=32, mlp_ratio=4,
                    block_layer=ResBlock, norm_layer=Affine)


def _poolformer(classes: int) -> nn.Module:
    from timm.models.metaformer import GroupNorm1, MetaFormer

    # poolformer_s12's settings, one block per stage and a quarter of the widths
    return MetaFormer(num_classes=classes, depths=(1, 1, 1, 1), dims=(16, 32, 80, 128), downsample_norm=None,
                      mlp_act=nn.GELU, mlp_bias=True, norm_layers=GroupNorm1, layer_scale_init_values=1e-5,
                      res_scale_init_values=None, use_mlp_head=False)


def _nf_resnet(classes: int) -> nn.Module:
    from timm.models.nfnet import NfCfg, NormFreeNet

    # nf_resnet50's settings, one block per stage and an eighth of the widths
    cfg = NfCfg(depths=(1, 1, 1, 1), channels=(32, 64, 128, 256), stem_type="7x7_pool", stem_chs=8,
                bottle_ratio=0.25, group_size=None, act_layer="relu", attn_layer=None)
    return NormFreeNet(cfg, num_classes=classes)


def _convmixer(classes: int) -> nn.Module:
    from timm.models.convmixer import ConvMixer

    # convmixer_768_32's settings (ReLU, 7x7 depthwise, 7x7 patches) at 32 wide and 2 deep, 4x4 patches
    return ConvMixer(dim=32, depth=2, kernel_size=7, patch_size=4, num_classes=classes, act_layer=nn.ReLU)


def _ghostnet(classes: int) -> nn.Module:
    from timm.models.ghostnet import _create_ghostnet

    # ghostnet_100's stages (its function passes width=1.0 itself) at a quarter of the width
    return _create_ghostnet("ghostnet_100", width=0.25, num_classes=classes, drop_rate=0.0)


def _volo(classes: int) -> nn.Module:
    from timm.models.volo import VOLO

    # volo_d1_224's settings (outlook attention in the first stage, two class-attention layers, the
    # token head) at one block per stage, 32x32, patches of 8
    return VOLO(layers=[1, 1, 1, 1], img_size=32, patch_size=8, stem_hidden_dim=16, embed_dims=[16, 32, 32, 32],
                num_heads=[1, 2, 2, 2], num_classes=classes)


# name -> the tiny model's constructor, given the number of classes
TINY_MAKERS: dict[str, Callable[[int], nn.Module]] = {
    "mixer_b16_224": _mixer,
    "resmlp_12_224": _resmlp,
    "poolformer_s12": _poolformer,
    "nf_resnet50": _nf_resnet,
    "convmixer_768_32": _convmixer,
    "ghostnet_100": _ghostnet,
    "volo_d1_224": _volo,
}


def _create(name: str, size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    import timm

    batch, side, classes = TINY if size == "tiny" else REAL
    drops = {"drop_rate": 0.0} if name in NO_DROP_PATH else {"drop_rate": 0.0, "drop_path_rate": 0.0}
    side = TINY_SIDE.get(name, side) if size == "tiny" else side
    if size == "tiny" and name in TINY_MAKERS:
        factory = lambda: TINY_MAKERS[name](classes)  # noqa: E731
    else:
        overrides = TINY_ARGS[name] if size == "tiny" else {}
        factory = lambda: timm.create_model(name, pretrained=False, num_classes=classes, **drops,  # noqa: E731
                                            **overrides)
    model = instantiate(factory, device, dtype)
    images = floats((batch, 3, side, side), device, dtype)
    target = labels(batch, classes, device)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), target[: logits.shape[0]])

    return Built(model, {"x": images}, {"x": images}, loss, f"b{batch} 3x{side}x{side}")


def _named(name: str, doc: str) -> Callable[[Size, torch.device, torch.dtype], Built]:
    def build(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
        return _create(name, size, device, dtype)

    build.__name__, build.__doc__ = name, doc
    return build


vit_base_patch16_224 = _named("vit_base_patch16_224", "timm ViT-B/16.")
efficientnet_b0 = _named("efficientnet_b0", "timm EfficientNet-B0.")
convnext_tiny = _named("convnext_tiny", "timm ConvNeXt-T.")
mixer_b16_224 = _named("mixer_b16_224", "timm MLP-Mixer B/16: token-mixing and channel-mixing MLPs, LayerNorm.")
resmlp_12_224 = _named("resmlp_12_224", "timm ResMLP-12: a linear layer across patches, affine norms, layer scale.")
poolformer_s12 = _named("poolformer_s12", "timm PoolFormer-S12: average-pool token mixer, one-group GroupNorm.")
nf_resnet50 = _named("nf_resnet50", "timm NF-ResNet-50: no normalization; scaled weight-standardized "
                     "convolutions, residual branches scaled by alpha and 1/beta.")
coatnet_0_rw_224 = _named("coatnet_0_rw_224", "timm CoAtNet-0: MBConv stages, then transformer stages with "
                          "relative position bias.")
efficientvit_b0 = _named("efficientvit_b0", "timm EfficientViT-B0 (MIT): MBConv and ReLU linear attention with "
                         "multi-scale tokens from depthwise convolutions.")
convmixer_768_32 = _named("convmixer_768_32", "timm ConvMixer-768/32: patch embedding, then depthwise and "
                          "pointwise convolutions with batch norm.")
ghostnet_100 = _named("ghostnet_100", "timm GhostNet-1.0: ghost modules (a 1x1 convolution, then a 3x3 depthwise "
                      "one over its output, the two concatenated), depthwise convolutions between them, "
                      "squeeze-and-excitation.")
xcit_tiny_12_p16_224 = _named("xcit_tiny_12_p16_224", "timm XCiT-T12/16: cross-covariance attention, local patch "
                              "interaction, class attention.")
volo_d1_224 = _named("volo_d1_224", "timm VOLO-D1: outlook attention (attention weights per window, applied over "
                     "unfolded windows and folded back), then transformer and class-attention stages.")
eva02_tiny_patch14_224 = _named("eva02_tiny_patch14_224", "timm EVA-02-T/14: rotary position embedding on the "
                                "patch tokens (the class token left alone), SwiGLU MLPs.")
maxvit_tiny_tf_224 = _named("maxvit_tiny_tf_224", "timm MaxViT-T: MBConv, then attention within blocks and across "
                            "a grid, with relative position bias.")
