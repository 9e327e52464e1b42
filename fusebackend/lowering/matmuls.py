"""Matrix products with badly aligned matrices, padded so cuBLAS can take its fast kernels.

cuBLAS picks its fast tensor-core kernels only when each matrix's rows start 16 bytes apart. A
language model's head multiplies by an embedding of 30522 rows (BERT) or 50257 (GPT-2): a bf16
row of logits is 61044 bytes, and cuBLAS falls back to a 2-element-aligned kernel. BERT-base's
head (8192 x 768 x 30522, bf16) took 1.61 ms on an H100 in eager and in fuse, where Inductor,
which pads such products, took 0.56 ms (torch 2.11, 2026-11-24), the whole of fuse's GPU time
behind Inductor on that model.

Where a product is large and (``config.pad_mm``: ``auto``) runs on a GPU in half precision,
each badly aligned dim is padded by a generated kernel (which fuses into the kernel that
computes the matrix, where one does):

- the output's columns N: the second matrix (and a bias) gets zero columns up to the next
  multiple of 16 bytes, in its own orientation (a transposed weight stays transposed). The
  product fills an aligned [M, N_pad] buffer, and the result is its first N columns, a view: the
  kernels that read it follow its strides. Returned to the user, it stays that view, its rows
  N_pad elements apart, as Inductor returns it (``reinterpret_tensor(buf, (4096, 50257),
  (50264, 1))`` for GPT-2's logits, torch 2.11). A copy into eager's contiguous rows took 215 us
  of GPT-2's 2.67 ms inference step and 262 us of BERT's 4.53 (H200, b8 s512 and b16 s512, bf16,
  2026-11-24), and doubled the logits' memory. Merging the dims before the columns, as
  ``logits.view(-1, vocab)`` does, works on the view;
- the reduction dim K: both matrices get zeros up to the next multiple, which add nothing. An
  aligned row stride alone is not enough there: GPT-2's gradient of the head's input (logits'
  gradient [4096, 50257] times the [50257, 768] embedding) took 2.55 ms with the gradient's
  rows 16-byte aligned and 0.46 ms with K padded with zeros, against 2.41 ms as it was;
- a matrix whose rows (or, transposed, columns) start a badly aligned number of elements
  apart, as the transposed logits' gradient of the embedding's gradient does: copied into a
  layout whose rows start 16 bytes apart (0.71 against 2.23 ms). All of these copies of one
  matrix are one padded buffer, made once (an H200, torch 2.11, 2026-11-24).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fusebackend import ir, sizevars
from fusebackend.config import config
from fusebackend.lowering.graph import GraphLowering
from fusebackend.lowering.product_templates import product_result, template_product
from fusebackend.lowering.values import LoweringContext, TensorArg
from fusebackend.lowering.registry import POINTWISE, Unsupported, register_composite

aten = torch.ops.aten

MODES = ("auto", "always", "never")
ALIGN_BYTES = 16
MIN_FLOPS = 1 << 30  # 2*M*K*N below which the pad kernels cost more than they can save


def _per_row(dtype: torch.dtype) -> int:
    """Elements in 16 bytes: the multiple a row's length must be for cuBLAS's fast kernels."""
    return ALIGN_BYTES // dtype.itemsize if dtype.itemsize <= ALIGN_BYTES else 1


def _pads(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int) -> bool:
    """Whether an [M, K] x [K, N] product is one to pad (``config.pad_mm``)."""
    mode = config.pad_mm
    if mode not in MODES:
        raise ValueError(f"FUSE_PAD_MM={mode!r}: choose from {', '.join(MODES)}")
    if mode == "never" or dtype.is_complex or not dtype.is_floating_point:
        return False
    return mode == "always" or (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
                                and 2 * m * k * n >= MIN_FLOPS)


def padded_columns(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int) -> int | None:
    """The column count to pad an [M, K] x [K, N] product's output to, or None to leave it."""
    return _padded_size(n, dtype) if _pads(device, dtype, m, k, n) else None


def _padded_size(n: int, dtype: torch.dtype) -> int | None:
    """A dim of ``n`` elements rounded up to a multiple of 16 bytes; None where it is one already,
    or (``auto``) under 64 elements, where a pad costs more than it saves."""
    per_row = _per_row(dtype)
    if n % per_row == 0 or (config.pad_mm == "auto" and n < 64):
        return None
    return _round_up(n, per_row)


def _round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


def _column_major(x: TensorArg) -> bool:
    return x.meta.stride(0) == 1 and x.meta.stride(1) != 1


def _zero_padded(b: GraphLowering, x: TensorArg, dim: int, size: int, why: str) -> TensorArg:
    """``x`` (2-d) with zeros after its elements along ``dim`` up to ``size``, dense, in ``x``'s
    orientation (rows or columns contiguous). One buffer per padding of the same elements:
    a matrix and its transpose, padded alike, share it."""
    flip = _column_major(x)
    rows = x.permuted((1, 0)) if flip else x  # the same elements, rows contiguous
    rdim = 1 - dim if flip else dim
    key = (rows.view, rdim, size)
    if key not in b.padded:
        sizes = list(rows.sizes)
        sizes[rdim] = size
        meta = torch.empty(sizes, dtype=x.dtype, device="meta")
        extra = size - rows.sizes[rdim]
        pad = aten.constant_pad_nd.default
        b.padded[key] = b.lower_node(pad, POINTWISE[pad], (rows, [0, extra] if rdim == 1 else [0, 0, 0, extra], 0.0),
                                     {}, meta, why)
    padded = b.padded[key]
    return padded.permuted((1, 0)) if flip else padded


def _rows_aligned(x: TensorArg) -> bool:
    """Whether ``x``'s rows (columns, if column-major) start a multiple of 16 bytes apart."""
    flip = _column_major(x)
    lead = x.meta.stride(1) if flip else x.meta.stride(0)
    return lead % _per_row(x.dtype) == 0 or x.sizes[1 if flip else 0] == 1


def _aligned_rows(b: GraphLowering, x: TensorArg) -> TensorArg:
    """``x`` (2-d), or where its rows (columns, if column-major) start a badly aligned number
    of elements apart, ``x`` as a view of a copy whose rows do."""
    if _rows_aligned(x):
        return x
    flip = _column_major(x)
    inner = x.sizes[0] if flip else x.sizes[1]
    per_row = _per_row(x.dtype)
    padded = _zero_padded(b, x, 0 if flip else 1, _round_up(inner, per_row), "aligned rows for a matrix product")
    strides = (1, padded.meta.stride(1)) if flip else (padded.meta.stride(0), 1)
    return b.view((padded,), torch.empty_strided(x.sizes, strides, dtype=x.dtype, device="meta"))


def _pad_columns(b: GraphLowering, x: TensorArg, n_pad: int) -> TensorArg:
    """``x`` (1-d, or 2-d with columns last) with zero columns up to ``n_pad``, in its orientation."""
    if x.meta.dim() == 2:
        return _zero_padded(b, x, 1, n_pad, "aligned columns for a matrix product")
    meta = torch.empty((n_pad,), dtype=x.dtype, device="meta")
    pad = aten.constant_pad_nd.default
    return b.lower_node(pad, POINTWISE[pad], (x, [0, n_pad - x.sizes[0]], 0.0), {}, meta,
                        "aligned columns for a matrix product")


def _padded_product(b: GraphLowering, op: Any, bias: TensorArg | None, mat1: TensorArg, mat2: TensorArg,
                    kwargs: dict[str, Any]) -> TensorArg:
    if not (isinstance(mat1, TensorArg) and isinstance(mat2, TensorArg)) or mat1.meta.dim() != 2 or mat2.meta.dim() != 2:
        raise Unsupported("not a 2-d product")
    (m, k), n = tuple(mat1.meta.shape), mat2.meta.shape[1]  # at the hints over symbolic sizes
    if not _pads(b.device, mat1.dtype, m, k, n) or min(m, k, n) == 0:
        raise Unsupported("the product is too small to pad")
    n_pad, k_pad = _padded_size(n, mat1.dtype), _padded_size(k, mat1.dtype)
    symbolic = sizevars.symbolic(mat1.sizes + mat2.sizes)
    if symbolic:  # rows of a symbolic count, the padded dims static and the rows aligned
        if sizevars.symbolic((mat1.sizes[1],) + mat2.sizes) or k_pad is not None or not _rows_aligned(mat1):
            raise Unsupported("over symbolic sizes, a product padded along K or along a symbolic dim")
        m = mat1.sizes[0]
    operands = (mat1, mat2)
    if k_pad is not None:  # zeros in both: they add nothing
        why = "zeros along K for a matrix product"
        operands = (_zero_padded(b, mat1, 1, k_pad, why), _zero_padded(b, mat2, 0, k_pad, why))
    if n_pad is not None:
        operands = (operands[0], _pad_columns(b, operands[1], n_pad))
    aligned = tuple(_aligned_rows(b, x) for x in operands)
    if n_pad is None and k_pad is None and all(x is y for x, y in zip(aligned, (mat1, mat2))):
        raise Unsupported("every matrix aligned")
    args: tuple[Any, ...] = aligned
    if bias is not None:
        args = ((_pad_columns(b, bias, n_pad) if n_pad is not None else bias),) + args
    whole = torch.empty((mat1.meta.shape[0], n_pad or n), dtype=mat1.dtype, device="meta")
    padded = [f"{what} {was} -> {now}" for what, was, now in (("K", k, k_pad), ("N", n, n_pad)) if now]
    product = b.extern(op, args, kwargs, whole, reason="padded: " + (", ".join(padded) or "rows aligned"),
                       sizes=((m, n_pad or n), (n_pad or n, 1)) if symbolic else None)
    if n_pad is None:
        return product
    b.padded_products.add(product.view.buffer.name)
    meta = torch.empty_strided((whole.shape[0], n), (n_pad, 1), dtype=mat1.dtype, device="meta")
    if symbolic:
        return TensorArg(ir.View(product.view.buffer, (m, n), (n_pad, 1), 0), meta)
    return b.view((product,), meta)


def _row_product(b: GraphLowering, bias: TensorArg | None, mat1: TensorArg, mat2: TensorArg,
                 beta: Any = 1, alpha: Any = 1) -> TensorArg | None:
    """``alpha * mat1 @ mat2 + beta * bias`` as a sum reduction over K, where ``mat1`` has at most
    ``config.row_products`` rows; None where it does not apply.

    A product of few rows (a decode step's, whose M is the batch) reads each weight once and does
    two operations per element read: it is a memory-bound reduction, one output element per row
    of the weight. Generated as one, the weight is read along K in its rows (a ``Linear``'s
    weight, transposed, is [K, N] with K contiguous), in the accumulation dtype, and what reads
    the product fuses into the reduction's kernel: its cast, bias, activation, residual."""
    if config.row_products <= 0 or not (isinstance(mat1, TensorArg) and isinstance(mat2, TensorArg)):
        return None
    if mat1.meta.dim() != 2 or mat2.meta.dim() != 2 or sizevars.symbolic(tuple(mat1.sizes) + tuple(mat2.sizes)):
        return None
    (m, k), n = tuple(mat1.sizes), mat2.sizes[1]
    if not 0 < m <= config.row_products or k == 0 or n == 0 or not mat1.dtype.is_floating_point:
        return None
    if mat2.view.strides[0] != 1 and k > 1:
        # each output element's reduction would read its column of the weight across rows: the
        # case measured against cuBLAS (a decode step's Linear) reads along them
        return None
    acc = ir.compute_dtype(mat1.dtype)
    view = mat1.view
    # the reduction's domain [M, N, K]: mat1 broadcast along N, read at (m, k)
    domain = TensorArg(ir.View(view.buffer, (m, n, k), (view.strides[0], 0, view.strides[1]), view.offset),
                       torch.empty_strided((m, n, k), (k, 0, 1), dtype=mat1.dtype, device="meta"))

    def products(ctx: LoweringContext) -> ir.Expr:
        i, j, r = ctx.vars
        return ir.op("mul", ir.cast(ir.Load(view, (i, r)), acc), ir.cast(ir.Load(mat2.view, (r, j)), acc))

    sums = b.reduce(domain, [2], False, "sum", acc, products)
    return product_result(b, sums, bias, beta, alpha)


def _column_product(b: GraphLowering, bias: TensorArg | None, mat1: TensorArg, mat2: TensorArg,
                    beta: Any = 1, alpha: Any = 1) -> TensorArg | None:
    """``alpha * mat1 @ mat2 + beta * bias`` as a sum reduction over K where the product has one
    column (a matrix times a vector, batched or not: ``mat1`` [..., M, K], ``mat2`` [..., K, 1]);
    None where it does not apply.

    Such a product reads each element of ``mat1`` once for two operations: a row reduction over
    K, read along its rows where ``mat1`` is contiguous along K. As a library call it is also a
    launch, and its input must be in memory: Mamba's selective scan (transformers' loop over the
    positions) multiplies each position's state [b, 1536, 16], cast to bf16, by that position's
    [b, 16, 1] projection, a bmm per position and layer (768 at 32 positions, 24 layers), each
    beside a kernel of its own for the cast. Generated as a reduction, the product, its cast
    and the state's update are one kernel's work (``config.column_products``)."""
    if not config.column_products or not (isinstance(mat1, TensorArg) and isinstance(mat2, TensorArg)):
        return None
    dims = mat1.meta.dim()
    if dims < 2 or mat2.meta.dim() != dims or sizevars.symbolic(tuple(mat1.sizes) + tuple(mat2.sizes)):
        return None
    *batch, m, k = tuple(mat1.sizes)
    if mat2.sizes[-1] != 1 or k == 0 or m == 0 or 0 in batch or not mat1.dtype.is_floating_point:
        return None
    if tuple(mat2.sizes[:-2]) != tuple(batch) or (k > 1 and mat1.view.strides[-1] != 1):
        return None  # broadcast batches; or each row's K read across rows (left to the library)
    acc = ir.compute_dtype(mat1.dtype)

    def products(ctx: LoweringContext) -> ir.Expr:
        *lead, i, r = ctx.vars
        return ir.op("mul", ir.cast(ir.Load(mat1.view, (*lead, i, r)), acc),
                     ir.cast(ir.Load(mat2.view, (*lead, r, 0)), acc))

    sums = b.reduce(mat1, [dims - 1], False, "sum", acc, products)
    meta = b.out_meta

    def result(ctx: LoweringContext) -> ir.Expr:
        *lead, i, _ = ctx.vars
        out: ir.Expr = ir.Load(sums.view, (*lead, i))
        if alpha != 1:
            out = ir.op("mul", out, ir.Constant(float(alpha), acc))
        if bias is not None and beta != 0:
            term = ir.cast(ir.Load(bias.view, (0,)), acc)  # a bias of one column: one value
            out = ir.op("add", out, term if beta == 1 else ir.op("mul", term, ir.Constant(float(beta), acc)))
        return out

    return b.pointwise(tuple(meta.shape), meta.dtype, result, tuple(meta.stride()))


@register_composite(aten.mm.default, symbolic=True)
def mm(b: GraphLowering, self: TensorArg, mat2: TensorArg) -> TensorArg:
    rows = (_row_product(b, None, self, mat2) or _column_product(b, None, self, mat2)
            or template_product(b, None, self, mat2))
    if rows is not None:
        return rows
    return _padded_product(b, aten.mm.default, None, self, mat2, {})


@register_composite(aten.bmm.default, symbolic=True)  # over symbolic sizes it declines: the library's, as traced
def bmm(b: GraphLowering, self: TensorArg, mat2: TensorArg) -> TensorArg:
    column = _column_product(b, None, self, mat2) or template_product(b, None, self, mat2)
    if column is None:
        raise Unsupported("a batched product of more than one column")
    return column


@register_composite(aten.addmm.default, symbolic=True)
def addmm(b: GraphLowering, self: TensorArg, mat1: TensorArg, mat2: TensorArg, beta: Any = 1,
          alpha: Any = 1) -> TensorArg:
    if not isinstance(self, TensorArg) or self.meta.dim() != 1:
        raise Unsupported("a bias that is not one row")
    rows = (_row_product(b, self, mat1, mat2, beta, alpha) or _column_product(b, self, mat1, mat2, beta, alpha)
            or template_product(b, self, mat1, mat2, beta, alpha))
    if rows is not None:
        return rows
    return _padded_product(b, aten.addmm.default, self, mat1, mat2, {"beta": beta, "alpha": alpha})
