"""Pads, flips, repeats, rolls and scatters into views, as index arithmetic on plain loads.

Each op becomes one pointwise node whose body reads its input at an index computed from the
output's loop index, so it fuses both ways like any pointwise op (``F.pad(x, p) * 2 + 1`` is one
kernel, and so is a pad of a computed tensor):

- ``flip``: ``size - 1 - i`` along the flipped dims; ``repeat`` (and ``tile``): ``i mod size``;
  ``roll``: ``(i - shift) mod size``, over the flattened tensor when no dim is given;
- ``constant_pad_nd`` (negative pads crop): ``where(inside, x[i - lo], value)``;
  ``replication_pad``: the index clamped into the input; ``reflection_pad``: reflected at the
  edges;
- ``slice_scatter``, ``select_scatter``, ``diagonal_scatter``, ``as_strided_scatter``: a scatter
  of ``src`` into a view of ``self`` is ``where(the element is in the view, src at its position
  in the view, self)``.

Where an element lies outside the region a source covers, the source's index is clamped into
range (``indexing.Clamp``): the load reads an element that exists and its value is not used, so
no out-of-bounds address is formed, and a producer inlined at that index computes in range too.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Sequence

import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.indexing import Clamp, FloorDiv, ModIdx
from fusebackend.ir import Constant, Expr, cast, op
from fusebackend.lowering.graph import LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_pointwise

aten = torch.ops.aten


def _dtype(ctx: LoweringContext) -> torch.dtype:
    return torch.bool if ctx.dtype == torch.bool else ir.compute_dtype(ctx.dtype)


def _read(ctx: LoweringContext, arg: TensorArg, idx: Sequence[sympy.Expr]) -> Expr:
    """``arg`` at ``idx`` (size-1 dims at 0), in the dtype the op computes in."""
    view = arg.view
    index = tuple(sympy.Integer(0) if s == 1 else sympy.sympify(i) for s, i in zip(view.sizes, idx))
    return cast(ir.Load(view, index), _dtype(ctx))


def _index_value(expr: sympy.Expr, ctx: LoweringContext) -> Expr:
    """An index expression (non-negative) as an integer value, 32-bit where it fits."""
    ranges = dict(zip(ctx.vars, (max(s, 1) for s in ctx.sizes)))
    hi = indexing.bounds(sympy.sympify(expr), ranges)[1]
    return ir.IndexValue(expr, torch.int32 if hi < 2**31 else torch.int64)


def _compare(name: str, expr: sympy.Expr, bound: int, ctx: LoweringContext) -> Expr:
    value = _index_value(expr, ctx)
    return op(name, value, Constant(bound, value.dtype), dtype=torch.bool)


def _all(conditions: Sequence[Expr]) -> Expr | None:
    out: Expr | None = None
    for c in conditions:
        out = c if out is None else op("logical_and", out, c, dtype=torch.bool)
    return out


def _select(condition: Expr | None, inside: Expr, outside: Expr) -> Expr:
    return inside if condition is None else op("where", condition, inside, outside)


def _empty(ctx: LoweringContext) -> bool:
    return math.prod(ctx.sizes) == 0


def _zero(ctx: LoweringContext) -> Expr:
    """The body of an empty output: never evaluated."""
    return Constant(ir._convert_scalar(0, _dtype(ctx)), _dtype(ctx))


# ---------------------------------------------------------------------- permuting reads


@register_pointwise(aten.flip.default)
def flip(ctx: LoweringContext, self: Any, dims: Sequence[int]) -> Expr:
    if _empty(ctx):
        return _zero(ctx)
    rank = len(self.sizes)
    flipped = {d % rank for d in dims} if rank else set()
    idx = [self.sizes[d] - 1 - v if d in flipped else v for d, v in enumerate(ctx.vars)]
    return _read(ctx, self, idx)


@register_pointwise(aten.repeat.default)
def repeat(ctx: LoweringContext, self: Any, repeats: Sequence[int]) -> Expr:
    if _empty(ctx):
        return _zero(ctx)
    lead = len(repeats) - len(self.sizes)  # new leading dims: every copy reads the same input
    if lead < 0:
        raise Unsupported("repeat with fewer repeats than dims")
    idx = [ModIdx(v, n) if r != 1 else v for v, n, r in zip(ctx.vars[lead:], self.sizes, repeats[lead:])]
    return _read(ctx, self, idx)


@register_pointwise(aten.roll.default)
def roll(ctx: LoweringContext, self: Any, shifts: Sequence[int], dims: Sequence[int] = ()) -> Expr:
    if _empty(ctx):
        return _zero(ctx)
    sizes = self.sizes
    if not dims:  # roll the flattened tensor, then restore the shape
        if len(shifts) != 1:
            raise Unsupported("roll without dims takes one shift")
        numel = math.prod(sizes)
        strides = indexing.contiguous_strides(sizes)
        flat = indexing.ravel(ctx.vars, strides)
        shift = shifts[0] % numel
        source = ModIdx(flat + (numel - shift), numel) if shift else flat
        return _read(ctx, self, indexing.unravel(source, sizes, strides))
    if len(shifts) != len(dims):
        raise Unsupported("roll with as many shifts as dims only")
    rank = len(sizes)
    total = {d: 0 for d in range(rank)}
    for s, d in zip(shifts, dims):
        total[d % rank] += s
    idx = []
    for d, v in enumerate(ctx.vars):
        shift = total[d] % sizes[d]
        idx.append(ModIdx(v + (sizes[d] - shift), sizes[d]) if shift else v)
    return _read(ctx, self, idx)


# --------------------------------------------------------------------------------- pads


def _pairs(pad: Sequence[int], rank: int) -> dict[int, tuple[int, int]]:
    """(before, after) per padded dim: pairs from the last dim backwards, as F.pad takes them."""
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise Unsupported(f"pad {list(pad)} of a rank-{rank} tensor")
    return {rank - 1 - k: (pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)}


@register_pointwise(aten.constant_pad_nd.default)
def constant_pad_nd(ctx: LoweringContext, self: Any, pad: Sequence[int], value: Any = 0) -> Expr:
    dtype = _dtype(ctx)
    fill = Constant(ir._convert_scalar(value, dtype), dtype)
    if _empty(ctx) or 0 in self.sizes:
        return fill  # nothing of the input remains: all padding
    pairs = _pairs(pad, len(self.sizes))
    idx, inside = [], []
    for d, v in enumerate(ctx.vars):
        lo, hi = pairs.get(d, (0, 0))
        n = self.sizes[d]
        if lo > 0:
            inside.append(_compare("ge", v, lo, ctx))
        if hi > 0:
            inside.append(_compare("lt", v, lo + n, ctx))
        # a negative pad crops: the input index i - lo stays in range without a clamp
        idx.append(Clamp(v - lo, 0, n - 1) if lo > 0 or hi > 0 else v - lo)
    return _select(_all(inside), _read(ctx, self, idx), fill)


def _replication(ctx: LoweringContext, self: Any, padding: Sequence[int]) -> Expr:
    if _empty(ctx):
        return _zero(ctx)
    pairs = _pairs(padding, len(self.sizes))
    idx = []
    for d, v in enumerate(ctx.vars):
        lo, _ = pairs.get(d, (0, 0))
        idx.append(Clamp(v - lo, 0, self.sizes[d] - 1) if d in pairs else v)
    return _read(ctx, self, idx)


def _reflection(ctx: LoweringContext, self: Any, padding: Sequence[int]) -> Expr:
    if _empty(ctx):
        return _zero(ctx)
    pairs = _pairs(padding, len(self.sizes))
    idx = []
    for d, v in enumerate(ctx.vars):
        if d not in pairs:
            idx.append(v)
            continue
        lo, hi = pairs[d]
        n = self.sizes[d]
        if not (0 <= lo < n and 0 <= hi < n):
            raise Unsupported(f"reflection pad ({lo}, {hi}) of a dim of {n}")
        # j = i - lo reflected at both edges: j + 2*(-j past the start) - 2*(j past the end)
        j = v - lo
        reflected = j + 2 * Clamp(lo - v, 0, lo) - 2 * Clamp(j - (n - 1), 0, hi)
        idx.append(Clamp(reflected, 0, n - 1))  # in range; the clamp states it for the bounds
    return _read(ctx, self, idx)


@register_pointwise(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def replication_pad(ctx: LoweringContext, self: Any, padding: Sequence[int]) -> Expr:
    return _replication(ctx, self, padding)


@register_pointwise(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(ctx: LoweringContext, self: Any, padding: Sequence[int]) -> Expr:
    return _reflection(ctx, self, padding)


# ---------------------------------------------------------------------------- scatters


def _slice_bounds(n: int, start: int | None, end: int | None) -> tuple[int, int]:
    """``start`` and ``end`` of a slice of a dim of ``n``, as ``aten.slice`` normalizes them."""
    start = 0 if start is None else start
    end = n if end is None or end == sys.maxsize else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    return min(max(start, 0), n), min(max(end, 0), n)


@register_pointwise(aten.slice_scatter.default)
def slice_scatter(
    ctx: LoweringContext, self: Any, src: Any, dim: int = 0, start: int | None = None, end: int | None = None,
    step: int = 1,
) -> Expr:
    rank = len(self.sizes)
    if _empty(ctx):
        return _zero(ctx)
    dim = dim % rank
    n, length = self.sizes[dim], src.sizes[dim]
    base = _read(ctx, self, ctx.vars)
    if length == 0:
        return base
    first, _ = _slice_bounds(n, start, end)
    last = first + (length - 1) * step  # the slice's last element
    v = ctx.vars[dim]
    inside = []
    if first > 0:
        inside.append(_compare("ge", v, first, ctx))
    if last < n - 1:
        inside.append(_compare("le", v, last, ctx))
    offset = Clamp(v - first, 0, last - first)
    if step > 1:  # (v - first) % step == 0, on a non-negative index: no clamp to compute first
        inside.append(_compare("eq", ModIdx(v + (-first) % step, step), 0, ctx))
    idx = list(ctx.vars)
    idx[dim] = FloorDiv(offset, step)
    return _select(_all(inside), _read(ctx, src, idx), base)


@register_pointwise(aten.select_scatter.default)
def select_scatter(ctx: LoweringContext, self: Any, src: Any, dim: int, index: int) -> Expr:
    rank = len(self.sizes)
    if _empty(ctx):
        return _zero(ctx)
    dim = dim % rank
    index = index % self.sizes[dim]
    idx = [v for d, v in enumerate(ctx.vars) if d != dim]
    at = _compare("eq", ctx.vars[dim], index, ctx) if self.sizes[dim] > 1 else None
    return _select(at, _read(ctx, src, idx), _read(ctx, self, ctx.vars))


@register_pointwise(aten.diagonal_scatter.default)
def diagonal_scatter(ctx: LoweringContext, self: Any, src: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Expr:
    rank = len(self.sizes)
    if _empty(ctx):
        return _zero(ctx)
    d1, d2 = dim1 % rank, dim2 % rank
    base = _read(ctx, self, ctx.vars)
    length = src.sizes[-1]
    if length == 0:
        return base
    a, b = ctx.vars[d1], ctx.vars[d2]
    # (a, b) is on the diagonal when b - a == offset; its position along it is a (or b)
    if offset >= 0:
        on = op("eq", _index_value(b, ctx), _index_value(a + offset, ctx), dtype=torch.bool)
        position = a
    else:
        on = op("eq", _index_value(a, ctx), _index_value(b - offset, ctx), dtype=torch.bool)
        position = b
    idx = [v for d, v in enumerate(ctx.vars) if d not in (d1, d2)] + [Clamp(position, 0, length - 1)]
    return op("where", on, _read(ctx, src, idx), base)


@register_pointwise(aten.as_strided_scatter.default)
def as_strided_scatter(
    ctx: LoweringContext, self: Any, src: Any, size: Sequence[int], stride: Sequence[int],
    storage_offset: int | None = None,
) -> Expr:
    """``src`` written into a strided window of the output's storage (a clone of ``self``).

    Each output element's storage position is decomposed into the window's coordinates, largest
    stride first; that is exact when every stride is larger than the reach of the smaller ones
    (the window does not overlap or interleave itself). Other windows stay ATen calls.
    """
    if _empty(ctx):
        return _zero(ctx)
    out_strides = tuple(ctx.out_meta.stride())
    if not indexing.is_dense(ctx.sizes, out_strides):
        raise Unsupported("as_strided_scatter into a layout with gaps")
    base = _read(ctx, self, ctx.vars)
    if 0 in size:
        return base
    offset = storage_offset or 0
    window = sorted(((st, n, k) for k, (n, st) in enumerate(zip(size, stride)) if n > 1), reverse=True)
    reach = 0
    for st, n, _ in reversed(window):
        if st <= reach:
            raise Unsupported(f"as_strided_scatter of an overlapping window: sizes {list(size)}, strides {list(stride)}")
        reach += (n - 1) * st
    position = indexing.ravel(ctx.vars, out_strides)
    inside = []
    if offset > 0:
        inside.append(_compare("ge", position, offset, ctx))
    inside.append(_compare("le", position, offset + reach, ctx))
    rest = Clamp(position - offset, 0, reach)
    coords = [sympy.Integer(0)] * len(size)
    for k, (st, n, dim) in enumerate(window):
        q = FloorDiv(rest, st)
        if k > 0:  # the first coordinate is below its size: rest <= reach
            inside.append(_compare("lt", q, n, ctx))
        coords[dim] = Clamp(q, 0, n - 1)
        rest = ModIdx(rest, st)
    inside.append(_compare("eq", rest, 0, ctx))
    return op("where", _all(inside), _read(ctx, src, coords), base)
