"""More decoder-only language models from transformers, beside ``text.py``'s GPT-2, Llama, Qwen2 and
GPT-NeoX: each brings a piece of the decoder family the others lack.

- Mistral: sliding-window attention (the tiny window, 8, is shorter than its 16 tokens).
- Phi (Phi-2) and StableLM 2: partial rotary embeddings and LayerNorm; Phi runs attention and MLP
  in parallel, StableLM biases q/k/v. Phi-3: fused qkv and gate-up projections.
- Gemma: GeGLU (tanh GELU gate), embeddings scaled by sqrt(width), one key/value head (multi-query).
  Gemma 2: logit soft-capping (tanh) in attention and on the logits, local and global layers in
  turn, norms after attention and MLP as well as before.
- OPT: learned positions, ReLU MLP. BLOOM: ALiBi (linear position biases, no position embedding),
  LayerNorm after the embedding. Falcon: one key/value head shared by 71 query heads, parallel
  attention and MLP. GPT-J: rotary on the first 64 dims of each head, interleaved pairs.
  GPTBigCode (StarCoder): multi-query attention with the key/value projection fused to the query's.
- Mixtral: a mixture of experts, each token routed to its top 2 of the layer's experts (routing
  by top-k, sort and histogram; the experts' products grouped).
- Mamba: a selective state-space model, no attention; run here on its pure PyTorch path, a loop
  over the positions (no CUDA kernels, no associative scan): ``use_associative_scan=False``.

Built like ``text.py``'s decoders (``text.causal_lm``: inference on token ids, training with
``labels=input_ids``). Tiny: 2 layers, hidden 32-64, vocabulary 128, batch 2 x 16 tokens. Real:
the published size named in ``registry.py`` at batch 4 x 512 tokens (8 x 512 under 1B parameters);
Mamba at 8 x 32: each position is a step of the loop, traced whole (24 layers x 32 steps), and the
compile grows faster than the steps. fuse's first call on a 2-core CPU (kernels not run, torch
2.13, 2026-12-03): 112 s at 32 positions, 262 s at 64 (its scheduling 27.9 and 91.7 s), 18 min at
256 (6386 kernels), longer than a zoo row may take.
"""

from __future__ import annotations

import torch

from benchmarks.zoo.spec import Built, Size
from benchmarks.zoo.text import TINY_BATCH, TINY_SEQ, TINY_VOCAB, causal_lm, special_ids

TINY_IDS = special_ids(TINY_VOCAB)


def _tiny(model_cls: type, config: object, device: torch.device, dtype: torch.dtype) -> Built:
    return causal_lm(model_cls, config, TINY_VOCAB, TINY_BATCH, TINY_SEQ, device, dtype)


def _real(model_cls: type, config: object, batch: int, device: torch.device, dtype: torch.dtype,
          seq: int = 512) -> Built:
    return causal_lm(model_cls, config, config.vocab_size, batch, seq, device, dtype)


def mistral(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import MistralConfig, MistralForCausalLM

    if size == "tiny":
        config = MistralConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                               sliding_window=8, **TINY_IDS)
        return _tiny(MistralForCausalLM, config, device, dtype)
    # Mistral 7B v0.1: 32 layers, 4096 wide, 32 query heads over 8 key/value heads, windows of 4096
    config = MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                           sliding_window=4096)
    return _real(MistralForCausalLM, config, 4, device, dtype)


def phi(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import PhiConfig, PhiForCausalLM

    if size == "tiny":
        config = PhiConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, partial_rotary_factor=0.5, max_position_embeddings=64, **TINY_IDS)
        return _tiny(PhiForCausalLM, config, device, dtype)
    # Phi-2: 32 layers, 2560 wide, 32 heads, rotary on 32 of each head's 80 dims, 2.7B parameters
    config = PhiConfig(vocab_size=51200, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                       num_attention_heads=32, partial_rotary_factor=0.4, max_position_embeddings=2048)
    return _real(PhiForCausalLM, config, 4, device, dtype)


def phi3(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import Phi3Config, Phi3ForCausalLM

    if size == "tiny":
        config = Phi3Config(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                            original_max_position_embeddings=64, **TINY_IDS)
        return _tiny(Phi3ForCausalLM, config, device, dtype)
    # Phi-3-mini (4k): 32 layers, 3072 wide, 32 heads, 3.8B parameters
    config = Phi3Config(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                        original_max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=2047,
                        bos_token_id=1, eos_token_id=32000, pad_token_id=32000)
    return _real(Phi3ForCausalLM, config, 4, device, dtype)


def gemma(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import GemmaConfig, GemmaForCausalLM

    if size == "tiny":
        config = GemmaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                             **TINY_IDS)
        return _tiny(GemmaForCausalLM, config, device, dtype)
    # Gemma 2B: 18 layers, 2048 wide, 8 query heads of 256 over one key/value head, 256k vocabulary
    config = GemmaConfig(vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                         num_attention_heads=8, num_key_value_heads=1, head_dim=256, max_position_embeddings=8192)
    return _real(GemmaForCausalLM, config, 4, device, dtype)


def gemma2(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    if size == "tiny":
        config = Gemma2Config(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                              sliding_window=8, query_pre_attn_scalar=16, **TINY_IDS)
        return _tiny(Gemma2ForCausalLM, config, device, dtype)
    # Gemma 2 2B: 26 layers, 2304 wide, 8 query heads of 256 over 4 key/value heads, windows of 4096
    config = Gemma2Config(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                          num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
                          sliding_window=4096, query_pre_attn_scalar=256)
    return _real(Gemma2ForCausalLM, config, 4, device, dtype)


def opt(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import OPTConfig, OPTForCausalLM

    if size == "tiny":
        config = OPTConfig(vocab_size=TINY_VOCAB, hidden_size=32, word_embed_proj_dim=32, ffn_dim=64,
                           num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64, **TINY_IDS)
        return _tiny(OPTForCausalLM, config, device, dtype)
    # OPT-125M: 12 layers, 768 wide, 12 heads, learned positions
    config = OPTConfig(vocab_size=50272, hidden_size=768, word_embed_proj_dim=768, ffn_dim=3072,
                       num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=2048)
    return _real(OPTForCausalLM, config, 8, device, dtype)


def bloom(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import BloomConfig, BloomForCausalLM

    if size == "tiny":
        config = BloomConfig(vocab_size=TINY_VOCAB, hidden_size=32, n_layer=2, n_head=4, **TINY_IDS)
        return _tiny(BloomForCausalLM, config, device, dtype)
    # BLOOM-560M: 24 layers, 1024 wide, 16 heads, ALiBi, 250k vocabulary
    config = BloomConfig(vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16)
    return _real(BloomForCausalLM, config, 8, device, dtype)


def falcon(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import FalconConfig, FalconForCausalLM

    if size == "tiny":
        config = FalconConfig(vocab_size=TINY_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              multi_query=True, parallel_attn=True, new_decoder_architecture=False, alibi=False,
                              bias=False, max_position_embeddings=64, **TINY_IDS)
        return _tiny(FalconForCausalLM, config, device, dtype)
    # Falcon-7B: 32 layers, 4544 wide, 71 query heads of 64 over one key/value head
    config = FalconConfig(vocab_size=65024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
                          multi_query=True, parallel_attn=True, new_decoder_architecture=False, alibi=False,
                          bias=False, max_position_embeddings=2048, bos_token_id=11, eos_token_id=11)
    return _real(FalconForCausalLM, config, 4, device, dtype)


def gptj(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import GPTJConfig, GPTJForCausalLM

    if size == "tiny":
        config = GPTJConfig(vocab_size=TINY_VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, rotary_dim=8,
                            **TINY_IDS)
        return _tiny(GPTJForCausalLM, config, device, dtype)
    # GPT-J 6B: 28 layers, 4096 wide, 16 heads, rotary on 64 of each head's 256 dims
    config = GPTJConfig(vocab_size=50400, n_positions=2048, n_embd=4096, n_layer=28, n_head=16, rotary_dim=64)
    return _real(GPTJForCausalLM, config, 4, device, dtype)


def stablelm(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import StableLmConfig, StableLmForCausalLM

    if size == "tiny":
        config = StableLmConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=4, partial_rotary_factor=0.25,
                                use_qkv_bias=True, max_position_embeddings=64, **TINY_IDS)
        return _tiny(StableLmForCausalLM, config, device, dtype)
    # StableLM 2 1.6B: 24 layers, 2048 wide, 32 heads, rotary on a quarter of each head, q/k/v biases
    config = StableLmConfig(vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                            num_attention_heads=32, num_key_value_heads=32, partial_rotary_factor=0.25,
                            use_qkv_bias=True, max_position_embeddings=4096, layer_norm_eps=1e-5,
                            bos_token_id=100257, eos_token_id=100257)
    return _real(StableLmForCausalLM, config, 4, device, dtype)


def gpt_bigcode(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    if size == "tiny":
        config = GPTBigCodeConfig(vocab_size=TINY_VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  multi_query=True, **TINY_IDS)
        return _tiny(GPTBigCodeForCausalLM, config, device, dtype)
    # StarCoderBase-1B: 24 layers, 2048 wide, 16 query heads over one key/value head
    config = GPTBigCodeConfig(vocab_size=49152, n_positions=8192, n_embd=2048, n_inner=8192, n_layer=24, n_head=16,
                              multi_query=True, bos_token_id=0, eos_token_id=0)
    return _real(GPTBigCodeForCausalLM, config, 4, device, dtype)


def mixtral(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import MixtralConfig, MixtralForCausalLM

    if size == "tiny":
        config = MixtralConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                               num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0, **TINY_IDS)
        return _tiny(MixtralForCausalLM, config, device, dtype)
    # Mixtral 8x7B's layout (8 experts, the top 2 a token, grouped-query attention) at a quarter of
    # its width and half its depth: 16 layers, 1024 wide, experts of 3584, 16 query heads over 8
    # key/value heads: 1.5B
    config = MixtralConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_hidden_layers=16,
                           num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=32768,
                           num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.0)
    return _real(MixtralForCausalLM, config, 4, device, dtype)


def mamba(size: Size, device: torch.device, dtype: torch.dtype) -> Built:
    from transformers import MambaConfig, MambaForCausalLM

    if size == "tiny":
        config = MambaConfig(vocab_size=TINY_VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2,
                             expand=2, conv_kernel=4, use_associative_scan=False, use_mambapy=False, **TINY_IDS)
        return _tiny(MambaForCausalLM, config, device, dtype)
    # Mamba-130M: 24 layers, 768 wide, state 16, inner width 1536
    config = MambaConfig(vocab_size=50280, hidden_size=768, state_size=16, num_hidden_layers=24, expand=2,
                         conv_kernel=4, use_associative_scan=False, use_mambapy=False,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return _real(MambaForCausalLM, config, 8, device, dtype, seq=32)
