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
# Lowered as index arithmetic (lowering/views.py), so that they fuse with their producers too:
# their decompositions gather through index tensors computed with arange.
_KEEP |= {aten.roll, aten.select_scatter, aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d,
          aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d}


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(_EXTRA))
    return {op: fn for op, fn in table.items() if getattr(op, "overloadpacket", None) not in _KEEP}
