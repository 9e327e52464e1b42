"""Encoder-decoder language models from transformers, beside ``text.py``'s T5.

- BART: learned positions (offset by 2), post-norm layers, GELU, tied embeddings.
- Pegasus: sinusoidal positions, pre-norm layers, embeddings scaled by sqrt(width).
- Marian (the OPUS-MT translation models): sinusoidal positions, post-norm, SiLU, a bias on the
  logits.
- mT5: T5's relative position buckets with a gated-GELU MLP and a 250k-token vocabulary (its head
  tied to the embedding: transformers 5 ties mT5's and LongT5's always, published weights or not).
- LongT5 (transient-global attention): every encoder token attends to its local block of
  neighbours and to one summary token per block of 16 (the tiny model: blocks of 4).

Inference takes the encoder's token ids (with an attention mask that pads the end of every other
sequence, as in a real batch) and the decoder's ids (the targets shifted right behind the start
token); the training step passes ``labels=`` and the model shifts them itself and computes the
cross-entropy. Tiny: 2 + 2 layers of 32, vocabulary 128, batch 2, 16 tokens in and 8 out. Real:
the size named in ``registry.py``, at the lengths it names.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.zoo.common import drop_nothing, instantiate, model_loss, tokens
from benchmarks.zoo.spec import Built, Size
from benchmarks.zoo.text import TINY_BATCH, TINY_SEQ, TINY_VOCAB

TINY_TARGET = 8
# Ids inside the tiny vocabulary (the defaults are those of the real vocabularies): BART's order
TINY_SPECIAL = {"bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}


def _seq2seq(model_cls: type, config: Any, batch: int, seq: int, target_seq: int, device: torch.device,
             dtype: torch.dtype) -> Built:
    config = drop_nothing(config)
    model = instantiate(lambda: model_cls(config), device, dtype)
    ids = tokens(batch, seq, config.vocab_size, device)
    # targets from 3 on: none is the padding id, which the loss would skip in some models
    target = tokens(batch, target_seq, config.vocab_size, device, offset=1).clamp(min=3)
    start = torch.full_like(target[:, :1], config.decoder_start_token_id)
    decoder_ids = torch.cat([start, target[:, :-1]], dim=1)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1::2, seq - seq // 4:] = 0
    mask = mask.to(device)
    return Built(model, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_ids},
                 {"input_ids": ids, "attention_mask": mask, "labels": target}, model_loss,
                 f"b{batch} s{seq} -> s{target_seq}")


def _tiny(model_cls: type, config: Any, device: torch.device, dtype: torch.dtype) -> Built:
    return _seq2seq(model_cls, config, TINY_BATCH, TINY_SEQ, TINY_TARGET, device, dtype)


TINY_LAYERS = {"vocab_size": TINY_VOCAB, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
               "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
               "decoder_ffn_dim": 64, "max_position_embeddings": 64}


def bart(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import BartConfig, BartForConditionalGeneration

    if size == "tiny":
        return _tiny(BartForConditionalGeneration, BartConfig(**TINY_LAYERS, **TINY_SPECIAL), device, dtype)
    # BART-base: 6 + 6 layers, 768 wide, 12 heads, 140M parameters; 512 tokens in, 128 out
    config = BartConfig(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                        decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                        max_position_embeddings=1024)
    return _seq2seq(BartForConditionalGeneration, config, 8, 512, 128, device, dtype)


def pegasus(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    if size == "tiny":
        config = PegasusConfig(**TINY_LAYERS, **TINY_SPECIAL, scale_embedding=True)
        return _tiny(PegasusForConditionalGeneration, config, device, dtype)
    # Pegasus-large: 16 + 16 layers, 1024 wide, 16 heads, 568M parameters; 512 tokens in, 128 out
    config = PegasusConfig(vocab_size=96103, d_model=1024, encoder_layers=16, decoder_layers=16,
                           encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                           decoder_ffn_dim=4096, max_position_embeddings=1024, scale_embedding=True,
                           pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return _seq2seq(PegasusForConditionalGeneration, config, 8, 512, 128, device, dtype)


def marian(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import MarianConfig, MarianMTModel

    if size == "tiny":
        config = MarianConfig(**TINY_LAYERS, **TINY_SPECIAL, scale_embedding=True, activation_function="swish")
        return _tiny(MarianMTModel, config, device, dtype)
    # OPUS-MT en-de: 6 + 6 layers, 512 wide, 8 heads, 58k shared vocabulary, 74M parameters; sentences
    # of 128 tokens both ways
    config = MarianConfig(vocab_size=58101, decoder_vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
                          encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                          decoder_ffn_dim=2048, max_position_embeddings=512, scale_embedding=True,
                          activation_function="swish", pad_token_id=58100, eos_token_id=0,
                          decoder_start_token_id=58100)
    return _seq2seq(MarianMTModel, config, 32, 128, 128, device, dtype)


def mt5(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import MT5Config, MT5ForConditionalGeneration

    if size == "tiny":
        config = MT5Config(vocab_size=TINY_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                           relative_attention_num_buckets=8, relative_attention_max_distance=16,
                           feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        return _tiny(MT5ForConditionalGeneration, config, device, dtype)
    # mT5-base: 12 + 12 layers, 768 wide, gated-GELU MLP of 2048, 250k vocabulary; 390M parameters with
    # the head tied (580M as published, untied)
    config = MT5Config(vocab_size=250112, d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_heads=12,
                       feed_forward_proj="gated-gelu", decoder_start_token_id=0)
    return _seq2seq(MT5ForConditionalGeneration, config, 8, 512, 128, device, dtype)


def longt5(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import LongT5Config, LongT5ForConditionalGeneration

    # tie_word_embeddings=False: T5 1.1's decoder output, not scaled by 1/sqrt(width) before the head
    # (which transformers 5 ties to the embedding all the same)
    if size == "tiny":
        # blocks of 4 around each token (radius 3), one summary token per 4 tokens
        config = LongT5Config(vocab_size=TINY_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                              relative_attention_num_buckets=8, relative_attention_max_distance=16,
                              encoder_attention_type="transient-global", local_radius=3, global_block_size=4,
                              feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0,
                              pad_token_id=0, eos_token_id=1)
        return _tiny(LongT5ForConditionalGeneration, config, device, dtype)
    # LongT5-TGlobal-base: 12 + 12 layers, 768 wide, local radius 127, global blocks of 16; 223M
    # parameters with the head tied; 4096 tokens in, 256 out
    config = LongT5Config(vocab_size=32128, d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_heads=12,
                          encoder_attention_type="transient-global", local_radius=127, global_block_size=16,
                          feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0)
    return _seq2seq(LongT5ForConditionalGeneration, config, 4, 4096, 256, device, dtype)
