"""Latent diffusion models from diffusers: Stable Diffusion's denoising UNet and its VAE decoder
(imported only when built).

- ``sd_unet`` (``UNet2DConditionModel``): ResNet blocks with GroupNorm (32 groups) and SiLU,
  conditioned on a sinusoidal timestep embedding; transformer blocks with self-attention,
  cross-attention to the text encoder's states and a GEGLU MLP; strided down-sampling and
  nearest up-sampling with skip connections. Inference: noisy latents, one timestep per sample and
  the text states; training: the MSE between the predicted and a drawn noise (the denoising
  objective). Real: Stable Diffusion 1.5's UNet (860M), latents 4x64x64 at batch 2, text states of
  77 x 768.
- ``sd_vae_decoder`` (``AutoencoderKL.decode``): latents (divided by the scaling factor, as a
  pipeline decodes them) through a convolution, a mid block with one single-head attention over
  every position, and up blocks of ResNet blocks with GroupNorm (32 groups), to an RGB image;
  training: the MSE to a target image. Real: Stable Diffusion's VAE (the decoder: 49M), latents
  4x64x64 at batch 2, 512x512 images out.

Tiny: two resolution levels of 32 and 64 channels (GroupNorm of 32 groups still), one layer per
block, latents 4x8x8 at batch 2, text states of 8 x 32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.zoo.common import floats, generator, instantiate
from benchmarks.zoo.spec import Built, Size

BATCH = 2
LATENT_CHANNELS = 4


class VaeDecode(nn.Module):
    """``vae.decode(latents / scaling_factor).sample`` as a module's forward: the VAE's decoder as a
    pipeline calls it after the last denoising step (the encoder is kept but not run)."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents / self.vae.config.scaling_factor).sample


def _mse_to(target: torch.Tensor) -> Any:
    def loss(output: Any) -> torch.Tensor:
        predicted = output if isinstance(output, torch.Tensor) else output.sample
        return F.mse_loss(predicted.float(), target[: predicted.shape[0]])

    return loss


def sd_unet(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from diffusers import UNet2DConditionModel

    if size == "tiny":
        config: dict[str, Any] = {
            "sample_size": 8, "block_out_channels": (32, 64), "layers_per_block": 1,
            "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
            "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"), "cross_attention_dim": 32,
            "attention_head_dim": 2, "norm_num_groups": 32}
        side, text_len = 8, 8
    else:
        # Stable Diffusion 1.5: four levels of 320-1280 channels, two ResNet blocks a level, attention
        # at the first three with 8 heads (diffusers reads attention_head_dim as the head count here)
        config = {
            "sample_size": 64, "block_out_channels": (320, 640, 1280, 1280), "layers_per_block": 2,
            "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
            "cross_attention_dim": 768, "attention_head_dim": 8, "norm_num_groups": 32}
        side, text_len = 64, 77
    config.update(in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, dropout=0.0)
    model = instantiate(lambda: UNet2DConditionModel(**config), device, dtype)
    latents = floats((BATCH, LATENT_CHANNELS, side, side), device, dtype)
    timesteps = torch.tensor([981, 261][:BATCH], device=device)
    text = floats((BATCH, text_len, config["cross_attention_dim"]), device, dtype, offset=1)
    noise = torch.randn(latents.shape, generator=generator(2)).to(device)
    inputs = {"sample": latents, "timestep": timesteps, "encoder_hidden_states": text}
    return Built(model, inputs, inputs, _mse_to(noise),
                 f"b{BATCH} {LATENT_CHANNELS}x{side}x{side} text {text_len}x{config['cross_attention_dim']}")


def sd_vae_decoder(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from diffusers import AutoencoderKL

    if size == "tiny":
        config: dict[str, Any] = {"block_out_channels": (32, 64), "layers_per_block": 1, "sample_size": 16}
        side = 8
    else:  # Stable Diffusion's VAE: four levels of 128-512 channels, 8x up-sampling, 84M (decoder 49M)
        config = {"block_out_channels": (128, 256, 512, 512), "layers_per_block": 2, "sample_size": 512}
        side = 64
    levels = len(config["block_out_channels"])
    config.update(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS, norm_num_groups=32,
                  down_block_types=("DownEncoderBlock2D",) * levels, up_block_types=("UpDecoderBlock2D",) * levels,
                  scaling_factor=0.18215)
    model = instantiate(lambda: VaeDecode(AutoencoderKL(**config)), device, dtype)
    # latents as the UNet leaves them: about the scaling factor's size
    latents = floats((BATCH, LATENT_CHANNELS, side, side), device, dtype) * config["scaling_factor"]
    image_side = side * 2 ** (levels - 1)
    target = torch.rand((BATCH, 3, image_side, image_side), generator=generator(2)).mul(2).sub(1).to(device)
    return Built(model, {"latents": latents}, {"latents": latents}, _mse_to(target),
                 f"b{BATCH} {LATENT_CHANNELS}x{side}x{side} -> 3x{image_side}x{image_side}")
