"""Convolutional image classifiers from transformers, beside ``vision.py``'s ResNet, ConvNeXt,
MobileNetV2 and EfficientNet.

- PoolFormer: MetaFormer blocks whose token mixer is an average pool (minus its input), GroupNorm
  with one group (a LayerNorm over channels and positions), layer scale.
- ConvNeXt V2: ConvNeXt's blocks with global response normalization (GRN: each channel scaled by
  its spatial L2 norm over the channels' mean norm) in place of layer scale.
- RegNet (Y): bottlenecks of grouped 3x3 convolutions (64 channels a group) with
  squeeze-and-excitation, batch norm.
- BiT: pre-activation ResNet with weight-standardized convolutions (each kernel normalized by its
  own mean and variance at every call) and GroupNorm of 32 groups, "same" padding computed per call.

Built with ``vision.image_classifier``. Tiny: 32x32 images, batch 2, 10 classes, two stages of one
block. Real: the size named in ``registry.py`` at batch 64, 224x224.
"""

from __future__ import annotations

from benchmarks.zoo.spec import Size
from benchmarks.zoo.vision import Made, image_classifier


@image_classifier
def poolformer(size: Size) -> Made:
    """PoolFormer: average-pool token mixer, one-group GroupNorm, layer scale."""
    from transformers import PoolFormerConfig, PoolFormerForImageClassification

    if size == "tiny":
        config = PoolFormerConfig(num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
                                  strides=[4, 2], padding=[2, 1], mlp_ratio=2.0)
        return PoolFormerForImageClassification, config
    # PoolFormer-S12: depths 2-2-6-2, widths 64-512, 12M parameters
    return PoolFormerForImageClassification, PoolFormerConfig(depths=[2, 2, 6, 2], hidden_sizes=[64, 128, 320, 512])


@image_classifier
def convnextv2(size: Size) -> Made:
    """ConvNeXt V2: depthwise 7x7, LayerNorm, inverted MLP with global response normalization."""
    from transformers import ConvNextV2Config, ConvNextV2ForImageClassification

    if size == "tiny":
        return ConvNextV2ForImageClassification, ConvNextV2Config(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                                                                  image_size=32)
    # ConvNeXt V2-T: widths 96-768, depths 3-3-9-3, 28.6M parameters
    return ConvNextV2ForImageClassification, ConvNextV2Config(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3])


@image_classifier
def regnet(size: Size) -> Made:
    """RegNetY: grouped-convolution bottlenecks with squeeze-and-excitation."""
    from transformers import RegNetConfig, RegNetForImageClassification

    if size == "tiny":
        return RegNetForImageClassification, RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                          groups_width=8, layer_type="y")
    # RegNetY-4GF: widths 128-1088, depths 2-6-12-2, groups of 64 channels, 20.6M parameters
    return RegNetForImageClassification, RegNetConfig(embedding_size=32, hidden_sizes=[128, 192, 512, 1088],
                                                      depths=[2, 6, 12, 2], groups_width=64, layer_type="y")


@image_classifier
def bit(size: Size) -> Made:
    """BiT: pre-activation bottlenecks, weight-standardized convolutions, GroupNorm."""
    from transformers import BitConfig, BitForImageClassification

    shared = {"layer_type": "preactivation", "global_padding": "SAME", "embedding_dynamic_padding": True}
    if size == "tiny":
        # 8 groups: the bottlenecks' inner widths are 16 and 32
        return BitForImageClassification, BitConfig(embedding_size=32, hidden_sizes=[64, 128], depths=[1, 1],
                                                    num_groups=8, **shared)
    # BiT-M R50x1: ResNet-50's layout, GroupNorm of 32 groups, 25.5M parameters
    return BitForImageClassification, BitConfig(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048],
                                                depths=[3, 4, 6, 3], num_groups=32, **shared)
