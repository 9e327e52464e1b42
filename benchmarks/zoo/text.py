"""Language models from transformers: decoders, encoders and an encoder-decoder.

Each builder returns the model with its language-modelling head, so that the training step's
loss is the model's own (``labels=`` in the call: shifted cross-entropy for the decoders, masked
positions for the encoders, the decoder's targets for T5). Attention is transformers' default
implementation (``sdpa``), the one users get.

Tiny: 2 layers, hidden 32-64, vocabulary 128, batch 2 x 16 tokens. Real: the standard published
size of each family (named in ``benchmarks/zoo/registry.py``) at batch 8 x 512 tokens (16 x 512
for the encoders, 4 x 512 for the 0.5-1B decoders).
"""

from __future__ import annotations

import torch

from benchmarks.zoo.common import drop_nothing, instantiate, model_loss, tokens
from benchmarks.zoo.spec import Built, Size

TINY_VOCAB = 128
TINY_BATCH, TINY_SEQ = 2, 16


def causal_lm(model_cls: type, config: object, vocab: int, batch: int, seq: int,
              device: torch.device, dtype: torch.dtype) -> Built:
    """A decoder-only LM: inference on token ids, training with ``labels=input_ids`` (the model
    shifts them)."""
    config = drop_nothing(config)
    model = instantiate(lambda: model_cls(config), device, dtype)
    ids = tokens(batch, seq, vocab, device)
    return Built(model, {"input_ids": ids}, {"input_ids": ids, "labels": ids}, model_loss, f"b{batch} s{seq}")


def special_ids(vocab: int) -> dict[str, int]:
    # inside the tiny vocabulary (the defaults, e.g. GPT-2's 50256, are not)
    return {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1} if vocab == TINY_VOCAB else {}


def gpt2(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    if size == "tiny":
        config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=TINY_VOCAB,
                            **special_ids(TINY_VOCAB))
        return causal_lm(GPT2LMHeadModel, config, TINY_VOCAB, TINY_BATCH, TINY_SEQ, device, dtype)
    config = GPT2Config()  # GPT-2 small: 12 layers, 768 wide, 12 heads, 124M parameters
    return causal_lm(GPT2LMHeadModel, config, config.vocab_size, 8, 512, device, dtype)


def llama(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    if size == "tiny":
        config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             **special_ids(TINY_VOCAB))
        return causal_lm(LlamaForCausalLM, config, TINY_VOCAB, TINY_BATCH, TINY_SEQ, device, dtype)
    # Llama 3.2 1B: 16 layers, 2048 wide, 32 query heads sharing 8 key/value heads, tied embeddings
    config = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                         bos_token_id=128000, eos_token_id=128001)
    return causal_lm(LlamaForCausalLM, config, config.vocab_size, 4, 512, device, dtype)


def qwen2(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if size == "tiny":
        config = Qwen2Config(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                             **special_ids(TINY_VOCAB))
        return causal_lm(Qwen2ForCausalLM, config, TINY_VOCAB, TINY_BATCH, TINY_SEQ, device, dtype)
    # Qwen2 0.5B: 24 layers, 896 wide, 14 query heads over 2 key/value heads, biased q/k/v
    config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return causal_lm(Qwen2ForCausalLM, config, config.vocab_size, 4, 512, device, dtype)


def gpt_neox(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    if size == "tiny":
        config = GPTNeoXConfig(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64, **special_ids(TINY_VOCAB))
        return causal_lm(GPTNeoXForCausalLM, config, TINY_VOCAB, TINY_BATCH, TINY_SEQ, device, dtype)
    # Pythia 160M: 12 layers, 768 wide, parallel attention and MLP, rotary on a quarter of each head
    config = GPTNeoXConfig(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           intermediate_size=3072, max_position_embeddings=2048)
    return causal_lm(GPTNeoXForCausalLM, config, config.vocab_size, 8, 512, device, dtype)


def masked_lm(model_cls: type, config: object, vocab: int, batch: int, seq: int, device: torch.device,
              dtype: torch.dtype, token_types: bool) -> Built:
    """An encoder with its masked-LM head. Inputs carry an attention mask that pads the end of
    every other sequence (a real batch has padding); the loss is over about 15% of the positions
    (the others are labelled -100, ignored)."""
    config = drop_nothing(config)
    model = instantiate(lambda: model_cls(config), device, dtype)
    ids = tokens(batch, seq, vocab, torch.device("cpu"))  # drawn and masked here, then moved
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1::2, seq - seq // 4:] = 0
    chosen = torch.rand(batch, seq, generator=torch.Generator().manual_seed(7)) < 0.15
    chosen[:, 0] = True  # at least one labelled position per sequence
    target = torch.where(chosen & mask.bool(), ids, torch.full_like(ids, -100)).to(device)
    inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if token_types:
        types = torch.zeros(batch, seq, dtype=torch.long)
        types[:, seq // 2:] = 1  # two segments, as in sentence-pair inputs
        inputs["token_type_ids"] = types.to(device)
    return Built(model, inputs, {**inputs, "labels": target}, model_loss, f"b{batch} s{seq}")


def bert(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import BertConfig, BertForMaskedLM

    if size == "tiny":
        config = BertConfig(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64)
        return masked_lm(BertForMaskedLM, config, TINY_VOCAB, TINY_BATCH, TINY_SEQ, device, dtype, True)
    config = BertConfig()  # BERT-base: 12 layers, 768 wide, 12 heads, 110M parameters
    return masked_lm(BertForMaskedLM, config, config.vocab_size, 16, 512, device, dtype, True)


def distilbert(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    if size == "tiny":
        config = DistilBertConfig(vocab_size=TINY_VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=2,
                                  max_position_embeddings=64)
        return masked_lm(DistilBertForMaskedLM, config, TINY_VOCAB, TINY_BATCH, TINY_SEQ, device, dtype, False)
    config = DistilBertConfig()  # DistilBERT-base: 6 layers, 768 wide, 66M parameters
    return masked_lm(DistilBertForMaskedLM, config, config.vocab_size, 16, 512, device, dtype, False)


def t5(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    """T5 with its LM head. Inference: encoder input ids and decoder input ids. Training: the
    decoder's inputs are the labels shifted right (done by the model)."""
    from transformers import T5Config, T5ForConditionalGeneration

    if size == "tiny":
        config = T5Config(vocab_size=TINY_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, relative_attention_max_distance=16,
                          decoder_start_token_id=0)
        vocab, batch, seq, target_seq = TINY_VOCAB, TINY_BATCH, TINY_SEQ, 8
    else:
        # T5-base: 12 + 12 layers, 768 wide, 12 heads, 220M parameters; 512 tokens in, 128 out
        config = T5Config(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12,
                          decoder_start_token_id=0)
        vocab, batch, seq, target_seq = config.vocab_size, 8, 512, 128
    config = drop_nothing(config)
    model = instantiate(lambda: T5ForConditionalGeneration(config), device, dtype)
    ids = tokens(batch, seq, vocab, device)
    target = tokens(batch, target_seq, vocab, device, offset=1)
    decoder_ids = torch.cat([torch.zeros_like(target[:, :1]), target[:, :-1]], dim=1)
    return Built(model, {"input_ids": ids, "decoder_input_ids": decoder_ids},
                 {"input_ids": ids, "labels": target}, model_loss, f"b{batch} s{seq} -> s{target_seq}")
