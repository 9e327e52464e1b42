"""Image models from transformers built on attention, beside ``vision.py``'s ViT, CLIP and Swin.

- DeiT: ViT with a distillation token beside the class token.
- BEiT: relative position biases per layer, layer scale, mean pooling of the patch tokens.
- DINOv2: 14x14 patches, layer scale, position embeddings made for 518x518 and interpolated
  (bicubic) to the image's grid, a classifier on the class token and the patches' mean.
- Swin v2: cosine attention with a learned temperature, position biases from a small MLP over
  log-spaced offsets, norms after attention and MLP (res-post-norm).
- LeViT: a convolutional stem, attention whose projections are linear layers with batch norm,
  attention biases indexed by offset, shrinking attention between stages, hard-swish.
- MobileViT: MobileNetV2 blocks, and blocks that unfold the map into 2x2 patches, run a
  transformer across patches, and fold back.
- Segformer: semantic segmentation; a hierarchical encoder with overlapping patch embeddings and
  attention over spatially reduced keys (a strided convolution), Mix-FFN (a depthwise convolution
  inside the MLP), and an all-MLP decoder upsampling every stage to a quarter of the image.

Classifiers are built with ``vision.classifier`` (inference on ``pixel_values``, training with
class ``labels=``). Segformer is trained against a label per pixel (its own cross-entropy, after
upsampling its logits to the labels' size). Tiny: 32x32 images (64x64 for MobileViT and 128x128
for LeViT, which downsample further), batch 2 (4 for LeViT), 10 classes. Real: the size named in
``registry.py``, at batch 64 for the classifiers.
"""

from __future__ import annotations

import torch

from benchmarks.zoo.common import drop_nothing, floats, generator, instantiate, model_loss
from benchmarks.zoo.spec import Built, Size
from benchmarks.zoo.vision import Made, classifier, image_classifier

# MobileViT downsamples 32 times: a 2x2 map at the end of a 64x64 image. LeViT's stem downsamples 16
# times and its stages twice more; at 64x64 its last stage's batch norms would normalize 2 values a
# channel (a 1x1 map, batch 2) and its eval logits reached 6e4 after calibration; at 128x128, 8 values
# and logits of about 8.
TINY_SIDE_MOBILEVIT = 64
TINY_SIDE_LEVIT = 128
# LeViT's classifier batch-normalizes the pooled features over the batch alone. Over 2 samples each
# normalized value is +-1 whatever the inputs, and the fp32 gradient through it is so ill-conditioned
# that the compiled training step landed up to 6.4x eager's distance from float64 (2026-11, CPU), while
# a compiled float64 step matched eager's to 1e-11 of the largest gradient. Over 4 samples the compiled
# step is within 0.36 of the bound.
TINY_BATCH_LEVIT = 4


@image_classifier
def deit(size: Size) -> Made:
    """DeiT: ViT with class and distillation tokens (classified on the class token)."""
    from transformers import DeiTConfig, DeiTForImageClassification

    if size == "tiny":
        return DeiTForImageClassification, DeiTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                      intermediate_size=64, image_size=32, patch_size=8)
    # DeiT-S/16: 12 layers, 384 wide, 6 heads, 22M parameters
    return DeiTForImageClassification, DeiTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                                                  intermediate_size=1536)


@image_classifier
def beit(size: Size) -> Made:
    """BEiT: relative position bias in every layer, layer scale, mean-pooled patches."""
    from transformers import BeitConfig, BeitForImageClassification

    shared = {"use_relative_position_bias": True, "use_mean_pooling": True, "layer_scale_init_value": 0.1}
    if size == "tiny":
        return BeitForImageClassification, BeitConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                      intermediate_size=64, image_size=32, patch_size=8, **shared)
    # BEiT-B/16: 12 layers, 768 wide, 12 heads, 86M parameters
    return BeitForImageClassification, BeitConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                  intermediate_size=3072, **shared)


@image_classifier
def dinov2(size: Size) -> Made:
    """DINOv2: layer scale, interpolated position embeddings, class token and patch mean classified."""
    from transformers import Dinov2Config, Dinov2ForImageClassification

    if size == "tiny":
        # positions made for an 8x8 grid, interpolated to the 32x32 image's 4x4
        return Dinov2ForImageClassification, Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                          mlp_ratio=2, image_size=64, patch_size=8)
    # DINOv2 ViT-B/14: 12 layers, 768 wide, positions for 518x518 (37x37) interpolated to 16x16
    return Dinov2ForImageClassification, Dinov2Config(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                      mlp_ratio=4, image_size=518, patch_size=14)


@image_classifier
def swinv2(size: Size) -> Made:
    """Swin v2: scaled cosine attention, continuous (MLP) position bias, res-post-norm."""
    from transformers import Swinv2Config, Swinv2ForImageClassification

    if size == "tiny":
        return Swinv2ForImageClassification, Swinv2Config(image_size=32, patch_size=4, embed_dim=16, depths=[2, 1],
                                                          num_heads=[1, 2], window_size=4)
    # Swin v2-T at 256x256, windows of 8: embed 96, depths 2-2-6-2, 28M parameters
    return Swinv2ForImageClassification, Swinv2Config(image_size=256, embed_dim=96, depths=[2, 2, 6, 2],
                                                      num_heads=[3, 6, 12, 24], window_size=8), 256


def levit(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """LeViT: convolutional stem, attention with batch-normed projections and learned biases."""
    from transformers import LevitConfig, LevitForImageClassification

    if size == "tiny":
        config = LevitConfig(image_size=TINY_SIDE_LEVIT, hidden_sizes=[16, 32, 48], num_attention_heads=[2, 2, 2],
                             depths=[1, 1, 1], key_dim=[8, 8, 8])
        return classifier(LevitForImageClassification, config, TINY_SIDE_LEVIT, size, device, dtype,
                          batch=TINY_BATCH_LEVIT)
    # LeViT-128S: widths 128-256-384, depths 2-3-4, 7.4M parameters (without the distillation head)
    config = LevitConfig(hidden_sizes=[128, 256, 384], num_attention_heads=[4, 6, 8], depths=[2, 3, 4],
                         key_dim=[16, 16, 16])
    return classifier(LevitForImageClassification, config, 224, size, device, dtype)


@image_classifier
def mobilevit(size: Size) -> Made:
    """MobileViT: inverted residuals and unfold-transformer-fold blocks."""
    from transformers import MobileViTConfig, MobileViTForImageClassification

    if size == "tiny":
        config = MobileViTConfig(image_size=TINY_SIDE_MOBILEVIT, hidden_sizes=[16, 24, 32],
                                 neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 64], num_attention_heads=2, expand_ratio=2.0)
        return MobileViTForImageClassification, config, TINY_SIDE_MOBILEVIT
    # MobileViT-S at 256x256: 5.6M parameters
    return MobileViTForImageClassification, MobileViTConfig(image_size=256, hidden_sizes=[144, 192, 240],
                                                            neck_hidden_sizes=[16, 32, 64, 96, 128, 160, 640]), 256


def segformer(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """Segformer with its decode head: labels per pixel, 255 (ignored) on a border of each image
    as on unlabelled pixels of a real data set."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    if size == "tiny":
        config = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                 patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                                 decoder_hidden_size=32, num_labels=10)
        batch, side = 2, 32
    else:  # MiT-b0 with the all-MLP head: 3.7M parameters; ADE20K's 150 classes at 512x512
        config = SegformerConfig(depths=[2, 2, 2, 2], hidden_sizes=[32, 64, 160, 256], decoder_hidden_size=256,
                                 num_labels=150)
        batch, side = 8, 512
    config = drop_nothing(config)
    model = instantiate(lambda: SegformerForSemanticSegmentation(config), device, dtype)
    pixels = floats((batch, 3, side, side), device, dtype)
    target = torch.randint(0, config.num_labels, (batch, side, side), generator=generator(100))
    border = side // 16
    target[:, :border] = config.semantic_loss_ignore_index
    return Built(model, {"pixel_values": pixels}, {"pixel_values": pixels, "labels": target.to(device)}, model_loss,
                 f"b{batch} 3x{side}x{side}")
