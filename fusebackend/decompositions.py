"""The decomposition table AOTAutograd applies before lowering.

PyTorch's core ATen decompositions, plus the composite ops we want as primitives so that their
pieces can fuse (activations, softmax, normalizations and their backward passes). Ops we lower
directly and better than their decomposition (clamp, relu, hardtanh keep NaN semantics in one
``where``) are left out.

Upsampling (nearest, linear; 1d to 3d) is kept whole and lowered directly (``lowering/pooling.py``
says why). PyTorch decomposes those ops in Python at the Autograd dispatch key while AOTAutograd
traces, before this table is consulted, so ``whole_ops()`` hides those Python kernels during the
trace: the graph then holds the op, and its backward graph the op's ATen backward.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable, Iterator

import torch
import torch._inductor.inductor_prims  # noqa: F401  (registers the max pool offset prims)
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._decomp import decompositions as core_decompositions

from fusebackend import foreach

aten = torch.ops.aten
prims = torch.ops.prims

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
    # as Inductor decomposes it: whole, the norm is an op AOTAutograd's partitioner will not
    # recompute through, and ConvNeXt V2's GRN (x * its norm) was saved for the backward where
    # Inductor recomputes it from x (two more MLP-wide activations in the tiny zoo configuration)
    aten.linalg_vector_norm,
]

_KEEP = {aten.clamp, aten.clamp_min, aten.clamp_max, aten.relu, aten.hardtanh}
# Lowered as index arithmetic (lowering/views.py), so that they fuse with their producers too:
# their decompositions gather through index tensors computed with arange.
_KEEP |= {aten.roll, aten.select_scatter, aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d,
          aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d}

# Decompositions that give wrong answers here. The CPU flash attention's returns the attention
# probabilities (b, h, s, s) where ATen returns the log-sum-exp (b, h, s), and its output in
# another layout; in training the backward stays the ATen call and reads those as ATen's, so
# every attention model's gradients were wrong (off by 10-47 on one small SDPA, 2026-11-23).
# Kept whole, the forward and backward are a matching pair of ATen calls.
_WRONG = {aten._scaled_dot_product_flash_attention_for_cpu}

_WHOLE = [
    aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d,
    aten._upsample_nearest_exact1d, aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d,
    aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_trilinear3d,
]
_KEEP |= set(_WHOLE)


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(_EXTRA))
    table.update(RANDOM)
    table.update(POOLS)
    table[aten.baddbmm.default] = _baddbmm
    table.update(foreach.decompositions())  # an optimizer's _foreach_* ops, tensor by tensor
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

MAX_WINDOW_OFFSET = 127  # window positions an int8 holds


def _max_pool_with_offsets(nd: int) -> Callable[..., Any]:
    """``max_pool{nd}d_with_indices`` as Inductor decomposes it: the forward keeps where each
    maximum was as an int8 position in its window, and the indices are computed from those by a
    pointwise op that AOTAutograd's partitioner recomputes in the backward, so a training step
    saves the int8 positions, not int64 indices (``lowering/pooling.py`` lowers both ops)."""

    def decompose(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                  ceil_mode: bool = False) -> Any:
        def listed(v: Any) -> list[int]:
            v = [v] if isinstance(v, int) else list(v)
            return v * nd if len(v) == 1 else v

        kernel = listed(kernel_size)
        if math.prod(kernel) > MAX_WINDOW_OFFSET or x.dim() not in (nd + 1, nd + 2) or not x.is_floating_point():
            return NotImplemented  # stays the ATen op (integer pools are ATen calls, pooling.py)
        steps = listed(stride) if stride not in (None, [], ()) else kernel
        pads, dilations = listed(padding), listed(dilation)
        values, offsets = prims._low_memory_max_pool_with_offsets(x, kernel, steps, pads, dilations, ceil_mode)
        indices = prims._low_memory_max_pool_offsets_to_indices(offsets, kernel, x.shape[-nd:], steps, pads, dilations)
        return values, indices

    return decompose


POOLS = {aten.max_pool2d_with_indices.default: _max_pool_with_offsets(2),
         aten.max_pool3d_with_indices.default: _max_pool_with_offsets(3)}



def _baddbmm(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, beta: Any = 1, alpha: Any = 1) -> Any:
    """``beta * self + alpha * (batch1 @ batch2)`` with the product in the inputs' dtype.

    Core's decomposition casts fp16 and bf16 inputs to fp32 first (``pw_cast_for_opmath``), so
    the product ran as an fp32 GEMM without tensor cores and the scores after it were fp32: in
    BLOOM-560M's attention (ALiBi biases through ``baddbmm``, b8 s512, H100, 2026-11-27) 3.9 ms
    of a 15.3 ms step, against 1.65 ms for ATen's ``baddbmm``. Here the product is a ``bmm`` of
    the inputs (fp32 accumulation in the GEMM, rounded once to their dtype) and the scaling and
    the addition are pointwise in fp32, fused into whatever reads them (the softmax)."""
    if batch1.dtype not in (torch.float16, torch.bfloat16):
        return core_decompositions.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha)
    product = aten.bmm.default(batch1, batch2)
    out = product.float()
    if alpha != 1:
        out = out * alpha
    if beta != 0:  # beta 0 ignores self, NaNs included (ATen's contract)
        out = out + (self.float() if beta == 1 else self.float() * beta)
    return out.to(product.dtype)


@contextlib.contextmanager
def whole_ops() -> Iterator[None]:
    """While AOTAutograd traces: the ``_WHOLE`` ops without their Python decompositions.

    PyTorch registers those as Python kernels of the op (``OpOverload.py_kernels``) at the
    Autograd and CompositeImplicitAutograd keys, which the Python dispatcher that AOTAutograd
    enables runs instead of the op. Removed here and put back after; Dynamo compiles one frame
    at a time (under its compile lock), so no other trace sees them missing.
    """
    from torch._C import DispatchKey
    import torch._decomp  # noqa: F401  (registers the Python kernels first, so that they come back)

    hidden: list[tuple[Any, Any, Callable[..., Any]]] = []
    for packet in _WHOLE:
        for name in packet.overloads():
            overload = getattr(packet, name)
            for key in (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd):
                if key in overload.py_kernels:
                    hidden.append((overload, key, overload.py_kernels.pop(key)))
            overload._dispatch_cache.clear()
    try:
        yield
    finally:
        for overload, key, kernel in hidden:
            overload.py_kernels[key] = kernel
            overload._dispatch_cache.clear()
