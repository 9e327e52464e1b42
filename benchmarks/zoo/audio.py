"""Speech models from transformers: Whisper (its encoder alone, and encoder-decoder), wav2vec 2.0
and HuBERT. Every one computes its own loss from ``labels=``.

- ``whisper_encoder`` (``WhisperForAudioClassification``): two strided 1-d convolutions over log-mel
  features, sinusoidal positions, a pre-norm transformer encoder, then a projection, mean pooling
  over time and a linear classifier. Tiny: 8 mel bins, 32 frames, 2 layers of 32. Real:
  Whisper-base's encoder (6 layers, 512 wide, 80 mel bins, 30 s = 3000 frames) at batch 8.
- ``whisper`` (``WhisperForConditionalGeneration``): the same encoder and a decoder with learned
  positions and cross-attention, trained on token targets (cross-entropy). Tiny: as above, 8 target
  tokens. Real: Whisper-base (74M), batch 8, 128 target tokens.
- ``wav2vec2`` (``Wav2Vec2ForCTC``): a stack of strided 1-d convolutions over the raw waveform (the
  first one group-normed, one group per channel), a grouped convolution as relative position
  embedding (weight-normed), a post-norm encoder, trained with CTC against character targets (the
  loss computed from the logits by the builder, in float64).
  SpecAugment's random masking of time steps is off (``apply_spec_augment=False``): it would draw
  different masks in each run. Tiny: 2 convolutions, 2 layers of 32, 1/40 s at 16 kHz. Real:
  wav2vec 2.0 base (95M), batch 8 x 10 s.
- ``hubert`` (``HubertForSequenceClassification``): HuBERT's encoder (wav2vec 2.0's layout) with
  mean pooling over time and a linear classifier. Tiny and real as wav2vec2's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.zoo.common import drop_nothing, floats, instantiate, labels, model_loss, tokens
from benchmarks.zoo.spec import Built, Size


# Tiny and real Whisper: the encoder's layers, and a small decoder that WhisperForAudioClassification
# builds and does not use
WHISPER_TINY = {"num_mel_bins": 8, "d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 2,
                "encoder_ffn_dim": 64, "decoder_layers": 1, "decoder_attention_heads": 2, "decoder_ffn_dim": 64,
                "max_source_positions": 16, "max_target_positions": 16, "vocab_size": 128}
# Whisper-base: 6 + 6 layers, 512 wide, 8 heads, 80 mel bins, 30 s of audio (1500 positions)
WHISPER_BASE = {"num_mel_bins": 80, "d_model": 512, "encoder_layers": 6, "encoder_attention_heads": 8,
                "encoder_ffn_dim": 2048, "decoder_layers": 6, "decoder_attention_heads": 8, "decoder_ffn_dim": 2048,
                "max_source_positions": 1500, "max_target_positions": 448, "vocab_size": 51865}


def whisper_encoder(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import WhisperConfig, WhisperForAudioClassification

    if size == "tiny":
        config = WhisperConfig(**WHISPER_TINY, classifier_proj_size=16, num_labels=10)
        batch = 2
    else:
        config = WhisperConfig(**WHISPER_BASE, classifier_proj_size=256, num_labels=1000)
        batch = 8
    config = drop_nothing(config)
    model = instantiate(lambda: WhisperForAudioClassification(config), device, dtype)
    # the first convolution keeps the length, the second halves it: 2 frames per source position
    frames = 2 * config.max_source_positions
    features = floats((batch, config.num_mel_bins, frames), device, dtype)
    target = labels(batch, config.num_labels, device)
    return Built(model, {"input_features": features}, {"input_features": features, "labels": target}, model_loss,
                 f"b{batch} {config.num_mel_bins}x{frames}")


def whisper(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """Whisper's encoder-decoder. Inference: log-mel features and the decoder's ids (the targets
    shifted right behind the start token); training: ``labels=`` (the model shifts them)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    if size == "tiny":
        # special ids inside the tiny vocabulary (the defaults are Whisper's, past 50000)
        config = WhisperConfig(**WHISPER_TINY, bos_token_id=0, eos_token_id=1, pad_token_id=1,
                               decoder_start_token_id=0)
        batch, target_seq = 2, 8
    else:
        config = WhisperConfig(**WHISPER_BASE, bos_token_id=50257, eos_token_id=50257, pad_token_id=50257,
                               decoder_start_token_id=50258)
        batch, target_seq = 8, 128
    config = drop_nothing(config)
    model = instantiate(lambda: WhisperForConditionalGeneration(config), device, dtype)
    frames = 2 * config.max_source_positions
    features = floats((batch, config.num_mel_bins, frames), device, dtype)
    target = tokens(batch, target_seq, config.vocab_size, device, offset=1)
    start = torch.full_like(target[:, :1], config.decoder_start_token_id)
    decoder_ids = torch.cat([start, target[:, :-1]], dim=1)
    return Built(model, {"input_features": features, "decoder_input_ids": decoder_ids},
                 {"input_features": features, "labels": target}, model_loss,
                 f"b{batch} {config.num_mel_bins}x{frames} -> s{target_seq}")


# The convolutional feature encoder: wav2vec 2.0 base's 7 layers (a stride of 320 samples, 20 ms at
# 16 kHz) and a tiny one of 2 (a stride of 10)
SPEECH_TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
               "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3), "num_conv_pos_embeddings": 16,
               "num_conv_pos_embedding_groups": 2, "feat_extract_norm": "group"}
SPEECH_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
               "conv_dim": (512,) * 7, "conv_stride": (5, 2, 2, 2, 2, 2, 2), "conv_kernel": (10, 3, 3, 3, 3, 2, 2),
               "num_conv_pos_embeddings": 128, "num_conv_pos_embedding_groups": 16, "feat_extract_norm": "group"}


def _speech_size(size: Size) -> tuple[dict[str, object], int, int]:
    """The encoder's configuration, the batch and the samples per clip (16 kHz)."""
    return (SPEECH_TINY, 2, 400) if size == "tiny" else (SPEECH_BASE, 8, 160000)


def wav2vec2(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """wav2vec 2.0 with a CTC head over 32 characters (id 0 the blank, as in the published English
    models); each clip's target is a fifth as many characters as the encoder has frames.

    The CTC loss is computed here from the logits, in float64 whatever their dtype (``ctc_loss`` as
    the model computes it with ``labels=``, which does so in fp32 inside the model's graph). CTC's
    forward-backward recursion in fp32 rounds at every frame, and that rounding alone moved the
    head's gradient by up to 1.6e-5 (eager fp32, the input perturbed by one unit in the last place:
    2026-11, CPU), a hundred times what the model's layers did (1.5e-7 with the loss in float64); the
    compiled step's distance measured the loss's rounding, not the compiled graph's.
    """
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    layers, batch, samples = _speech_size(size)
    config = Wav2Vec2Config(**layers, vocab_size=32, apply_spec_augment=False, mask_time_prob=0.0, pad_token_id=0)
    config = drop_nothing(config)
    model = instantiate(lambda: Wav2Vec2ForCTC(config), device, dtype)
    audio = floats((batch, samples), device, dtype)
    frames = int(model._get_feat_extract_output_lengths(torch.tensor(samples)))
    target = tokens(batch, max(frames // 5, 2), config.vocab_size, device, offset=1)  # ids from 2: no blanks
    frame_counts = torch.full((batch,), frames, dtype=torch.long, device=device)
    target_counts = torch.full((batch,), target.shape[1], dtype=torch.long, device=device)

    def ctc(output: Any) -> torch.Tensor:
        log_probs = F.log_softmax(output.logits.double(), dim=-1)
        n = log_probs.shape[0]
        return F.ctc_loss(log_probs.transpose(0, 1), target[:n], frame_counts[:n], target_counts[:n],
                          blank=config.pad_token_id, reduction="mean")

    return Built(model, {"input_values": audio}, {"input_values": audio}, ctc, f"b{batch} {samples} samples")


def hubert(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """HuBERT classifying clips into 10 classes (mean over time, then a linear layer)."""
    from transformers import HubertConfig, HubertForSequenceClassification

    layers, batch, samples = _speech_size(size)
    config = HubertConfig(**layers, num_labels=10, classifier_proj_size=16 if size == "tiny" else 256,
                          apply_spec_augment=False, mask_time_prob=0.0)
    config = drop_nothing(config)
    model = instantiate(lambda: HubertForSequenceClassification(config), device, dtype)
    audio = floats((batch, samples), device, dtype)
    target = labels(batch, config.num_labels, device)
    return Built(model, {"input_values": audio}, {"input_values": audio, "labels": target}, model_loss,
                 f"b{batch} {samples} samples")
