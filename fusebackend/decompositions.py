"""The decomposition table AOTAutograd applies before lowering.

PyTorch's core ATen decompositions, plus the composite ops we want as primitives so that their
pieces can fuse (activations, softmax, normalizations and their backward passes). Ops we lower
directly and better than their decomposition (clamp, relu, hardtanh keep NaN semantics in one
``where``) are left out.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten

_EXTRA = [
    aten.gelu, aten.gelu_backward, aten.leaky_relu, aten.leaky_relu_backward,
    aten.silu, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward,
    aten.softplus, aten.softplus_backward, aten.elu, aten.elu_backward,
    aten.hardtanh_backward, aten.threshold_backward,
    aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten.native_layer_norm, aten.native_layer_norm_backward,
    aten.native_group_norm, aten.native_group_norm_backward,
    aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training, aten.native_batch_norm_backward,
    aten.addcmul, aten.addcdiv, aten.lerp, aten.rsub,
    aten.nll_loss_forward, aten.nll_loss_backward, aten.mse_loss, aten.mse_loss_backward,
    aten.logsumexp, aten.rms_norm,
]

_KEEP = {aten.clamp, aten.clamp_min, aten.clamp_max, aten.relu, aten.hardtanh}

# Decompositions that give wrong answers here. The CPU flash attention's returns the attention
# probabilities (b, h, s, s) where ATen returns the log-sum-exp (b, h, s), and its output in
# another layout; in training the backward stays the ATen call and reads those as ATen's, so
# every attention model's gradients were wrong (off by 10-47 on one small SDPA, 2026-11-23).
# Kept whole, the forward and backward are a matching pair of ATen calls.
_WRONG = {aten._scaled_dot_product_flash_attention_for_cpu}


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(_EXTRA))
    table.update(RANDOM)
    return {op: fn for op, fn in table.items() if getattr(op, "overloadpacket", None) not in _KEEP | _WRONG}


# ``x.uniform_()`` and ``x.normal_()`` reach the graph as ``uniform``/``normal_functional`` of an
# empty tensor. As ``rand``/``randn`` of its shape (lowering/random_ops.py generates those), the
# empty tensor is never allocated: AOTAutograd drops it, unused.
def _uniform(x: torch.Tensor, low: float = 0.0, high: float = 1.0, generator: Any = None) -> Any:
    if generator is not None:
        return NotImplemented  # stays the ATen op
    return aten.rand.default(list(x.shape), dtype=x.dtype, device=x.device) * (high - low) + low


def _normal_functional(x: torch.Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Any:
    if generator is not None:
        return NotImplemented
    return aten.randn.default(list(x.shape), dtype=x.dtype, device=x.device) * std + mean


RANDOM = {aten.uniform.default: _uniform, aten.normal_functional.default: _normal_functional}
