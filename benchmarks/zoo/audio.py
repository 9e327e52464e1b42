"""Whisper's audio encoder with a classification head (transformers' ``WhisperForAudioClassification``).

Two strided 1-d convolutions over log-mel features, sinusoidal positions, a pre-norm transformer
encoder, then a projection, mean pooling over time and a linear classifier; training with
``labels=`` (the model's own cross-entropy). Tiny: 8 mel bins, 32 frames, 2 layers of 32. Real:
Whisper-base's encoder (6 layers, 512 wide, 80 mel bins, 30 s = 3000 frames) at batch 8.
"""

from __future__ import annotations

import torch

from benchmarks.zoo.common import drop_nothing, floats, instantiate, labels, model_loss
from benchmarks.zoo.spec import Built, Size


def whisper_encoder(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import WhisperConfig, WhisperForAudioClassification

    if size == "tiny":
        config = WhisperConfig(num_mel_bins=8, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                               encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
                               max_source_positions=16, max_target_positions=16, classifier_proj_size=16,
                               vocab_size=128, num_labels=10)
        batch = 2
    else:
        config = WhisperConfig(num_mel_bins=80, d_model=512, encoder_layers=6, encoder_attention_heads=8,
                               encoder_ffn_dim=2048, decoder_layers=6, decoder_attention_heads=8, decoder_ffn_dim=2048,
                               max_source_positions=1500, classifier_proj_size=256, num_labels=1000)
        batch = 8
    config = drop_nothing(config)
    model = instantiate(lambda: WhisperForAudioClassification(config), device, dtype)
    # the first convolution keeps the length, the second halves it: 2 frames per source position
    frames = 2 * config.max_source_positions
    features = floats((batch, config.num_mel_bins, frames), device, dtype)
    target = labels(batch, config.num_labels, device)
    return Built(model, {"input_features": features}, {"input_features": features, "labels": target}, model_loss,
                 f"b{batch} {config.num_mel_bins}x{frames}")
