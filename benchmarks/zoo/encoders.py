"""More encoder-only language models from transformers, beside ``text.py``'s BERT and DistilBERT.

- RoBERTa: BERT's layers with positions counted from the padding id, no token types.
- XLM-RoBERTa: the same with a 250k-token vocabulary (the masked-LM head's matrix product and
  cross-entropy dominate).
- ALBERT: one layer's weights shared by every layer, a factorized embedding (128 wide, projected).
- ELECTRA: the discriminator (``ElectraForPreTraining``): a per-token binary classifier of replaced
  tokens, trained with binary cross-entropy over the unpadded positions.
- DeBERTa-v2: disentangled attention (content-to-position and position-to-content scores gathered
  from relative position embeddings in log buckets), no absolute positions.
- ConvBERT: half of each layer's heads are span-based dynamic convolutions: a kernel for each
  position, computed from the tokens, applied over the unfolded windows of a projection.

Masked-LM models are built with ``text.masked_lm`` (a padded batch, about 15% of the positions
labelled). Tiny: 2 layers of 32, vocabulary 128, batch 2 x 16 tokens. Real: the base size of each
(named in ``registry.py``) at batch 16 x 512 tokens.
"""

from __future__ import annotations

import torch

from benchmarks.zoo.common import drop_nothing, instantiate, model_loss, tokens
from benchmarks.zoo.spec import Built, Size
from benchmarks.zoo.text import TINY_BATCH, TINY_SEQ, TINY_VOCAB, masked_lm

REAL_BATCH, REAL_SEQ = 16, 512


def _shape(size: Size) -> tuple[int, int]:
    return (TINY_BATCH, TINY_SEQ) if size == "tiny" else (REAL_BATCH, REAL_SEQ)


def roberta(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import RobertaConfig, RobertaForMaskedLM

    if size == "tiny":
        # positions start after the padding id (1): 16 tokens take positions 2-17
        config = RobertaConfig(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64, type_vocab_size=1)
    else:  # RoBERTa-base: 12 layers, 768 wide, 12 heads, 125M parameters
        config = RobertaConfig(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                               intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1,
                               layer_norm_eps=1e-5)
    return masked_lm(RobertaForMaskedLM, config, config.vocab_size, *_shape(size), device, dtype, False)


def xlm_roberta(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import XLMRobertaConfig, XLMRobertaForMaskedLM

    if size == "tiny":
        config = XLMRobertaConfig(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64, type_vocab_size=1)
    else:  # XLM-R base: 12 layers, 768 wide, 250k vocabulary, 278M parameters
        config = XLMRobertaConfig(vocab_size=250002, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                  intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1,
                                  layer_norm_eps=1e-5)
    return masked_lm(XLMRobertaForMaskedLM, config, config.vocab_size, *_shape(size), device, dtype, False)


def albert(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import AlbertConfig, AlbertForMaskedLM

    if size == "tiny":
        config = AlbertConfig(vocab_size=TINY_VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    else:  # ALBERT-base v2: 12 layers sharing one set of weights, 768 wide, embeddings of 128, 12M parameters
        config = AlbertConfig(vocab_size=30000, embedding_size=128, hidden_size=768, num_hidden_layers=12,
                              num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512)
    return masked_lm(AlbertForMaskedLM, config, config.vocab_size, *_shape(size), device, dtype, True)


def deberta_v2(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    shared = {"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "norm_rel_ebd": "layer_norm",
              "share_att_key": True, "position_biased_input": False, "type_vocab_size": 0, "layer_norm_eps": 1e-7}
    if size == "tiny":
        # 8 log buckets over 16 tokens: near positions exact, far ones shared
        config = DebertaV2Config(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64, position_buckets=8,
                                 max_relative_positions=-1, **shared)
    else:  # DeBERTa-v3-base: 12 layers, 768 wide, 256 position buckets, 128k vocabulary, 184M parameters
        config = DebertaV2Config(vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                 intermediate_size=3072, max_position_embeddings=512, position_buckets=256,
                                 max_relative_positions=-1, **shared)
    return masked_lm(DebertaV2ForMaskedLM, config, config.vocab_size, *_shape(size), device, dtype, False)


def electra(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """ELECTRA's discriminator: inputs as for the masked-LM encoders (the end of every other sequence
    padded), labels 1 on about 15% of the tokens (those a generator would have replaced), 0 elsewhere;
    the model's own loss is binary cross-entropy over the unpadded positions."""
    from transformers import ElectraConfig, ElectraForPreTraining

    if size == "tiny":
        config = ElectraConfig(vocab_size=TINY_VOCAB, embedding_size=32, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    else:  # ELECTRA-base discriminator: 12 layers, 768 wide, 12 heads, 110M parameters
        config = ElectraConfig(vocab_size=30522, embedding_size=768, hidden_size=768, num_hidden_layers=12,
                               num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512)
    batch, seq = _shape(size)
    config = drop_nothing(config)
    model = instantiate(lambda: ElectraForPreTraining(config), device, dtype)
    ids = tokens(batch, seq, config.vocab_size, device)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1::2, seq - seq // 4:] = 0
    replaced = (torch.rand(batch, seq, generator=torch.Generator().manual_seed(7)) < 0.15).long()
    types = torch.zeros(batch, seq, dtype=torch.long)
    types[:, seq // 2:] = 1
    inputs = {"input_ids": ids, "attention_mask": mask.to(device), "token_type_ids": types.to(device)}
    return Built(model, inputs, {**inputs, "labels": replaced.to(device)}, model_loss, f"b{batch} s{seq}")


def convbert(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """ConvBERT: half of each layer's heads are span-based dynamic convolutions (a kernel per
    position, computed from the tokens, applied over unfolded windows)."""
    from transformers import ConvBertConfig, ConvBertForMaskedLM

    if size == "tiny":
        config = ConvBertConfig(vocab_size=TINY_VOCAB, hidden_size=32, embedding_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                conv_kernel_size=5)
    else:  # ConvBERT-base: 12 layers, 768 wide, dynamic convolutions of 9
        config = ConvBertConfig(vocab_size=30522, hidden_size=768, embedding_size=768, num_hidden_layers=12,
                                num_attention_heads=12, intermediate_size=3072, conv_kernel_size=9)
    return masked_lm(ConvBertForMaskedLM, config, config.vocab_size, *_shape(size), device, dtype, True)
