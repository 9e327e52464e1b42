"""Lowerings of scatters to ``Scatter`` nodes: scatter, scatter_add, scatter_reduce, index_put and
what decomposes to it (index_add, index_copy, index_fill, and embedding's backward, which
AOTAutograd's decompositions make an accumulating ``index_put`` into zeros).

A scatter's result is its input with elements at computed positions replaced or combined with
new values. It becomes two nodes: a pointwise copy of the input, which fuses with whatever
computes the input (zeros, say), and a ``Scatter`` over the index tensor's elements that writes
into the copy's memory in place, in a kernel of its own that starts once the copy is complete.
Pointwise producers of the index and the values fuse into the scatter's kernel.

Stores need no atomics. Sums, maxima and minima combine atomically (``tl.atomic_add``,
``tl.atomic_max``, ``tl.atomic_min``), which exist for 32- and 64-bit types: fp16 and bf16
combine in an fp32 copy and 8- and 16-bit integers in an int32 one, cast back by a pointwise
node after the scatter (exact for maxima, minima and integer sums, rounded once for half sums).
Products and means have no atomic and stay ATen calls. With ``include_self=False`` a first
scatter stores the reduction's neutral element at every position written.

NaN: eager's amax and amin propagate it. Triton's float atomic max orders values by their bits
(as signed integers where the new value's sign bit is clear, unsigned where set), so a NaN with
its sign bit clear is above every number and one with it set below: every NaN of the values and
of the copy is given a clear sign bit (``tl.abs``, a bit operation), so any NaN wins the max. A
float minimum is the maximum of the negated values, negated back by the pointwise node after
the scatter: a NaN cannot be given a set sign bit as reliably (Triton negates by subtracting
from zero, which on a GPU gives the canonical NaN, sign clear; seen on an H100, Triton 3.6).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.ir import Constant, cast, op
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_composite

aten = torch.ops.aten

# atomics exist for 32- and 64-bit elements: narrower types combine in a wider copy
_WIDER = {
    torch.float16: torch.float32, torch.bfloat16: torch.float32,
    torch.int8: torch.int32, torch.int16: torch.int32, torch.uint8: torch.int32,
}
_ATOMIC = (torch.float32, torch.float64, torch.int32, torch.int64)


def _accumulator(mode: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the copy a scatter of ``mode`` writes into."""
    if mode == "store":
        return dtype
    acc = _WIDER.get(dtype, dtype)
    if acc not in _ATOMIC:
        raise Unsupported(f"scatter-{mode} into a {dtype} tensor")
    return acc


def _neutral(mode: str, dtype: torch.dtype) -> bool | int | float:
    if mode == "sum":
        return 0
    big = math.inf if dtype.is_floating_point else torch.iinfo(dtype).max
    low = -big if dtype.is_floating_point else torch.iinfo(dtype).min
    return low if mode == "max" else big


def _winning_nan(value: ir.Expr, mode: str) -> ir.Expr:
    """``value`` with a NaN's sign bit clear, so that the atomic max keeps it (module docstring)."""
    if mode != "max" or not value.dtype.is_floating_point:
        return value
    return op("where", op("isnan", value, dtype=torch.bool), op("abs", value), value)


def _scatter(
    b: GraphLowering, x: TensorArg, ranges: Sequence[int], position: Sequence[ir.Expr],
    value: Any, mode: str, include_self: bool = True,
) -> TensorArg:
    """``x`` copied, then ``value(dtype)`` (an expression of that dtype in the loop variables of
    ``ranges``) scattered into the copy at ``position``; the result with eager's layout."""
    out = b.out_meta
    sizes, strides = tuple(out.shape), tuple(out.stride())
    acc = _accumulator(mode, out.dtype)
    negated = mode == "min" and acc.is_floating_point  # min(v) = -max(-v): see the module docstring
    if negated:
        mode = "max"

    def prepared(v: ir.Expr) -> ir.Expr:
        return _winning_nan(op("neg", v) if negated else v, mode)

    origin = b.origin
    b.origin = f"{origin} (the copy it scatters into)"
    try:
        copy = b.pointwise(sizes, acc, lambda ctx: prepared(ctx.value(x, acc)), strides)
    finally:
        b.origin = origin
    target = copy.view.buffer
    ranges = tuple(ranges)
    if not include_self:  # every position written starts from the neutral element, not from x
        target = _add(b, target, ranges, position, Constant(_neutral(mode, acc), acc), "store")
    result = _add(b, target, ranges, position, prepared(cast(value(acc), acc)), mode)
    arg = TensorArg(result.whole(), torch.empty_strided(result.sizes, result.strides, dtype=acc, device="meta"))
    if acc == out.dtype and not negated:
        return arg

    def finished(ctx: LoweringContext) -> ir.Expr:
        v = ctx.value(arg, acc)
        return cast(op("neg", v) if negated else v, out.dtype)

    return b.pointwise(sizes, out.dtype, finished, strides)


def _add(b: GraphLowering, target: ir.Buffer, ranges: tuple[int, ...], position: Sequence[ir.Expr],
         value: ir.Expr, mode: str) -> ir.Buffer:
    buf = b.new_buffer(target.sizes, target.dtype, target.strides)
    return b.add_node(ir.Scatter(buf, target, ranges, tuple(position), value, mode, b.origin)).view.buffer


# ------------------------------------------------------------------ scatter along one dim


def _along_dim(
    b: GraphLowering, self: TensorArg, dim: int, index: TensorArg, src: Any, mode: str, include_self: bool = True,
) -> TensorArg:
    """``out[..., index[i], ...] (mode)= src[i]`` for every element ``i`` of ``index``, the
    position replaced along ``dim`` (no wrapping: eager rejects negative positions here)."""
    rank = len(self.sizes)
    if rank == 0 or len(index.sizes) != rank:
        raise Unsupported("scatter of a 0-dim tensor or with an index of another rank")
    if index.dtype != torch.int64:
        raise Unsupported(f"scatter with a {index.dtype} index")
    dim = dim % rank
    ranges = tuple(index.sizes)
    if any(n > s for d, (n, s) in enumerate(zip(ranges, self.sizes)) if d != dim):
        raise Unsupported("scatter index larger than the tensor")
    if isinstance(src, TensorArg) and (len(src.sizes) != rank or any(n > s for n, s in zip(ranges, src.sizes))):
        raise Unsupported("scatter source smaller than the index")
    if mode == "store" and ranges[dim] == 1 and all(n == s for d, (n, s) in enumerate(zip(ranges, self.sizes))
                                                     if d != dim):
        return _one_per_line(b, self, dim, index, src)
    ivars = indexing.loop_vars("i", rank)
    position = [cast(ir.Load(index.view, ivars), torch.int64) if d == dim else ir.IndexValue(ivars[d], torch.int64)
                for d in range(rank)]
    if isinstance(src, TensorArg):
        value = lambda dtype: cast(ir.Load(src.view, ivars), dtype)  # noqa: E731
    elif isinstance(src, (bool, int, float)):
        value = lambda dtype: Constant(ir._convert_scalar(src, dtype), dtype)  # noqa: E731
    else:
        raise Unsupported(f"scatter of a {type(src).__name__}")
    return _scatter(b, self, ranges, position, value, mode, include_self)


def _one_per_line(b: GraphLowering, self: TensorArg, dim: int, index: TensorArg, src: Any) -> TensorArg:
    """A scatter that stores one value on each line along ``dim`` (the index has size 1 along
    ``dim`` and the tensor's sizes elsewhere: a one-hot, ``nll_loss``'s backward) as a pointwise
    comparison: ``out[i] = src[i with i[dim] = 0]`` where ``i[dim]`` is the line's position, and
    ``self[i]`` elsewhere. Nothing is stored to scatter into, so the result fuses with what
    computes ``self`` (zeros) and with its readers (a log-softmax's backward). The positions are
    asserted in range (``checked_position``), as the scatter's kernel would."""
    out = b.out_meta

    def body(ctx: LoweringContext) -> ir.Expr:
        line = tuple(sympy.Integer(0) if d == dim else v for d, v in enumerate(ctx.vars))
        position = op("checked_position", cast(ir.Load(index.view, line), torch.int64),
                      Constant(self.sizes[dim], torch.int64))
        here = op("eq", position, ir.IndexValue(ctx.vars[dim], torch.int64), dtype=torch.bool)
        if isinstance(src, TensorArg):
            new = cast(ir.Load(src.view, line), out.dtype)
        elif isinstance(src, (bool, int, float)):
            new = Constant(ir._convert_scalar(src, out.dtype), out.dtype)
        else:
            raise Unsupported(f"scatter of a {type(src).__name__}")
        return op("where", here, new, ctx.value(self, out.dtype))

    return b.pointwise(tuple(out.shape), out.dtype, body, tuple(out.stride()))


@register_composite(aten.scatter.src, aten.scatter.value)
def scatter(b: GraphLowering, self: TensorArg, dim: int, index: TensorArg, src: Any = None,
            value: Any = None) -> TensorArg:
    return _along_dim(b, self, dim, index, src if src is not None else value, "store")


_LEGACY = {"add": "sum"}  # scatter(..., reduce=) names; "multiply" has no atomic


@register_composite(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(b: GraphLowering, self: TensorArg, dim: int, index: TensorArg, src: Any = None,
                          value: Any = None, reduce: str = "") -> TensorArg:
    if reduce not in _LEGACY:
        raise Unsupported(f"scatter with reduce={reduce!r}")
    return _along_dim(b, self, dim, index, src if src is not None else value, _LEGACY[reduce])


@register_composite(aten.scatter_add.default)
def scatter_add(b: GraphLowering, self: TensorArg, dim: int, index: TensorArg, src: TensorArg) -> TensorArg:
    return _along_dim(b, self, dim, index, src, "sum")


_REDUCE = {"sum": "sum", "amax": "max", "amin": "min"}  # "prod" and "mean" have no atomic


@register_composite(aten.scatter_reduce.two)
def scatter_reduce(b: GraphLowering, self: TensorArg, dim: int, index: TensorArg, src: TensorArg, reduce: str,
                   include_self: bool = True) -> TensorArg:
    if reduce not in _REDUCE:
        raise Unsupported(f"scatter_reduce with reduce={reduce!r}")
    return _along_dim(b, self, dim, index, src, _REDUCE[reduce], include_self)


# -------------------------------------------------------------------------------- index_put


@register_composite(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(b: GraphLowering, self: TensorArg, indices: Any, values: TensorArg,
              accumulate: bool = False) -> TensorArg:
    """``out[indices] = values`` (``+=`` with ``accumulate``), with advanced-indexing rules.

    The index tensors broadcast together to a shape B; ``x[indices]`` has B in place of the
    indexed dims when they are adjacent, in front otherwise, and ``values`` broadcasts to that
    shape, whose elements the scatter runs over. Negative positions count from the end.
    """
    rank = len(self.sizes)
    indices = list(indices)
    if len(indices) > rank:
        raise Unsupported("more indices than dims")
    given = [(k, t) for k, t in enumerate(indices) if t is not None]
    if not given:
        raise Unsupported("index_put without an index tensor")
    if any(not isinstance(t, TensorArg) or t.dtype not in (torch.int64, torch.int32) for _, t in given):
        raise Unsupported("index_put with a mask (bool or byte) index")
    dims = [k for k, _ in given]
    bshape = tuple(torch.broadcast_shapes(*(tuple(t.sizes) for _, t in given)))
    rest = [k for k in range(rank) if k not in dims]
    sizes = tuple(self.sizes)
    if dims == list(range(dims[0], dims[-1] + 1)):  # adjacent: B takes their place
        first, after = dims[0], dims[-1] + 1
        ranges = sizes[:first] + bshape + sizes[after:]
        bstart = first
        var_of = {k: k if k < first else k - after + first + len(bshape) for k in rest}
    else:  # apart: B goes first
        ranges = bshape + tuple(sizes[k] for k in rest)
        bstart = 0
        var_of = {k: len(bshape) + j for j, k in enumerate(rest)}
    indexed = aten.index.Tensor(self.meta, [t.meta if t is not None else None for t in indices])
    if tuple(indexed.shape) != ranges:
        raise Unsupported(f"index_put: indexed shape {tuple(indexed.shape)}, expected {ranges}")
    ivars = indexing.loop_vars("i", len(ranges))
    bctx = LoweringContext(torch.empty(bshape, device="meta"), b.device, index=ivars[bstart:bstart + len(bshape)])
    position: list[ir.Expr] = []
    for k in range(rank):
        if k in var_of:
            position.append(ir.IndexValue(ivars[var_of[k]], torch.int64))
            continue
        p = cast(bctx.load(indices[k]), torch.int64)
        wrapped = op("add", p, Constant(sizes[k], torch.int64))
        position.append(op("where", op("lt", p, Constant(0, torch.int64), dtype=torch.bool), wrapped, p))
    vctx = LoweringContext(torch.empty(ranges, device="meta"), b.device)
    mode = "sum" if accumulate else "store"
    return _scatter(b, self, ranges, position, lambda dtype: vctx.value(values, dtype), mode)
