"""Matrix products with badly aligned output rows, padded so cuBLAS can take its fast kernels.

cuBLAS picks its fast tensor-core kernels only when each matrix's rows start 16 bytes apart. A
language model's head multiplies by an embedding of 30522 rows (BERT) or 50257 (GPT-2): a bf16
row of logits is 61044 bytes, and cuBLAS falls back to a 2-element-aligned kernel. BERT-base's
head (8192 x 768 x 30522, bf16) took 1.61 ms on an H100 in eager and in fuse, where Inductor,
which pads such products, took 0.56 ms (torch 2.11, 2026-11-24), the whole of fuse's GPU time
behind Inductor on that model.

So where the output's columns N are not a multiple of 16 bytes, the product is large and
(``config.pad_mm``: ``auto``) runs on a GPU in half precision, the second matrix is padded with
zero columns to the next multiple by a generated kernel, in its own orientation (a transposed
weight stays transposed), and so is a bias. The product fills an aligned [M, N_pad] buffer, and
the result is its first N columns, a view: the kernels that read it follow its strides, and an
output the user sees is copied into eager's layout (``graph.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fusebackend.config import config
from fusebackend.lowering.graph import GraphLowering, TensorArg
from fusebackend.lowering.registry import POINTWISE, Unsupported, register_composite

aten = torch.ops.aten

MODES = ("auto", "always", "never")
ALIGN_BYTES = 16
MIN_FLOPS = 1 << 30  # 2*M*K*N below which the pad kernels cost more than they can save


def padded_columns(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int) -> int | None:
    """The column count to pad an [M, K] x [K, N] product's output to, or None to leave it."""
    mode = config.pad_mm
    if mode not in MODES:
        raise ValueError(f"FUSE_PAD_MM={mode!r}: choose from {', '.join(MODES)}")
    per_row = ALIGN_BYTES // dtype.itemsize if dtype.itemsize <= ALIGN_BYTES else 1
    if mode == "never" or n % per_row == 0 or dtype.is_complex or not dtype.is_floating_point:
        return None
    if mode == "auto" and not (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
                               and 2 * m * k * n >= MIN_FLOPS and n >= 64):
        return None
    return math.ceil(n / per_row) * per_row


def _pad_columns(b: GraphLowering, x: TensorArg, n_pad: int) -> TensorArg:
    """``x`` (1-d, or 2-d with columns last) with zero columns up to ``n_pad``, in its orientation."""
    sizes = tuple(x.meta.shape)
    padded = sizes[:-1] + (n_pad,)
    if len(sizes) == 2 and x.meta.stride(0) == 1 and x.meta.stride(1) != 1:
        strides: tuple[int, ...] = (1, sizes[0])  # columns contiguous (a transposed weight)
    else:
        strides = (n_pad, 1)[-len(sizes):]
    meta = torch.empty_strided(padded, strides, dtype=x.dtype, device="meta")
    pad = aten.constant_pad_nd.default
    return b.lower_node(pad, POINTWISE[pad], (x, [0, n_pad - sizes[-1]], 0.0), {}, meta,
                        "aligned columns for a matrix product")


def _padded_product(b: GraphLowering, op: Any, bias: TensorArg | None, mat1: TensorArg, mat2: TensorArg,
                    kwargs: dict[str, Any]) -> TensorArg:
    if mat1.meta.dim() != 2 or mat2.meta.dim() != 2:
        raise Unsupported("not a 2-d product")
    (m, k), n = tuple(mat1.meta.shape), mat2.meta.shape[1]
    n_pad = padded_columns(b.device, mat2.dtype, m, k, n)
    if n_pad is None:
        raise Unsupported("output rows aligned, or the product too small to pad")
    mat2 = _pad_columns(b, mat2, n_pad)
    args: tuple[Any, ...] = (mat1, mat2)
    if bias is not None:
        args = (_pad_columns(b, bias, n_pad),) + args
    whole = torch.empty((m, n_pad), dtype=mat1.dtype, device="meta")
    product = b.extern(op, args, kwargs, whole, reason=f"columns padded from {n} to {n_pad}")
    return b.view((product,), torch.empty_strided((m, n), (n_pad, 1), dtype=mat1.dtype, device="meta"))


@register_composite(aten.mm.default)
def mm(b: GraphLowering, self: TensorArg, mat2: TensorArg) -> TensorArg:
    return _padded_product(b, aten.mm.default, None, self, mat2, {})


@register_composite(aten.addmm.default)
def addmm(b: GraphLowering, self: TensorArg, mat1: TensorArg, mat2: TensorArg, beta: Any = 1,
          alpha: Any = 1) -> TensorArg:
    if not isinstance(self, TensorArg) or self.meta.dim() != 1:
        raise Unsupported("a bias that is not one row")
    return _padded_product(b, aten.addmm.default, self, mat1, mat2, {"beta": beta, "alpha": alpha})
