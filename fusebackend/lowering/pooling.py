"""Pooling as pointwise nodes: each output element reads a small window of constant size.

The ops that reach the backend after AOTAutograd (``decompositions.py`` decomposes the 1d forms,
``max_pool2d`` without indices and adaptive pooling to 1x1 into these or into ``mean``):
``max_pool{2,3}d_with_indices``, ``avg_pool{2,3}d``, ``_adaptive_avg_pool{2,3}d`` and their
``*_backward`` ops. PyTorch's core decompositions leave them whole. Its decomposition of
``_adaptive_avg_pool2d`` (not used) gathers every window with ``aten.index`` into an
intermediate ``K*K`` times the output's size and sums that: an extern gather, read from memory,
between the pool and its neighbours, and a large intermediate. Here every op is a single
pointwise node over its output (a backward pass over the input's gradient):

- a forward pool unrolls its window (``kh * kw`` loads combined with ``maximum`` or ``add``);
  a window that reaches into the padding reads the edge element (the index is ``Clamp``-ed) and
  a mask discards it, so no load leaves the tensor and the index stays a plain index: a
  pointwise producer (``relu``, a normalization) is inlined into the pool's kernel and the pool
  into its consumer's, one kernel for ``relu -> max_pool2d -> * 2``;
- ``max_pool*_with_indices`` is two nodes of one kernel: the maximum, then the flat index of
  its first occurrence (of the last NaN where one is), as eager;
- a backward pass gathers, for each input element, from the output windows that cover it:
  at most ``(k - 1) * d // s + 1`` per dim, unrolled, so no atomics and no scatter;
- adaptive pooling's windows vary with the index (start ``floor(i*In/Out)``, end
  ``ceil((i+1)*In/Out)``): the window is bounded by its largest size and masked; where
  ``In % Out == 0`` the bounds fold away and it is a regular pool;
- an average over large windows (``REDUCE_FROM`` positions or more) that tile the input (an
  adaptive pool to 2x2, say) is a sum reduction over a view of the input with a (window,
  position) dim pair per spatial dim, then a division; other windows past ``MAX_UNROLLED``
  positions stay ATen calls.

Conditions that the index ranges decide (a window that never reaches the padding, windows of
one size) fold at lowering time, so the common layers carry no masks. ``ceil_mode``,
``count_include_pad`` and ``divisor_override`` follow eager's formulas. Outputs take the meta
output's layout (channels-last in, channels-last out). Integer inputs stay ATen calls.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Callable, Sequence

import sympy
import torch
import torch._inductor.inductor_prims  # noqa: F401  (registers the max pool offset prims lowered here)

from fusebackend import indexing, ir
from fusebackend.indexing import FloorDiv, ModIdx
from fusebackend.ir import Constant, Expr, cast, op
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_composite, register_pointwise
from fusebackend.lowering.windows import (
    Cond, Window, check_unrolled, clamped, conj, in_range, index_value, masked, product, ranges_of, spatial_load, taps,
    total, windows_of,
)

aten = torch.ops.aten
prims = torch.ops.prims


def float_input(x: TensorArg) -> None:
    if not x.dtype.is_floating_point:
        raise Unsupported(f"pooling of {x.dtype}")


def _plane_offset(index: Sequence[sympy.Expr], windows: Sequence[Window]) -> sympy.Expr:
    """The flat index into the input's spatial plane, as max pooling's indices count."""
    return indexing.ravel(index, indexing.contiguous_strides([w.in_size for w in windows]))


# ------------------------------------------------------------------------------ max pooling


def _max_pool(b: GraphLowering, x: TensorArg, nd: int, kernel_size: Any, stride: Any, padding: Any,
              dilation: Any, ceil_mode: bool, offsets: bool = False) -> tuple[TensorArg, TensorArg]:
    """The maximum over each window and where it was: the flat index into the input's plane, or
    with ``offsets`` the position inside the window (int8, ``_low_memory_max_pool_with_offsets``)."""
    float_input(x)
    values_meta, indices_meta = b.out_meta
    sizes = tuple(values_meta.shape)
    windows = windows_of(x, sizes, nd, kernel_size, stride, padding, dilation)
    check_unrolled(math.prod(w.reach for w in windows), "a max pool window")
    acc = ir.compute_dtype(x.dtype)

    def window(ctx: LoweringContext) -> tuple[list[sympy.Expr], list[tuple[tuple[int, ...], tuple[sympy.Expr, ...], Cond]]]:
        lead, out_vars = list(ctx.vars[:-nd]), ctx.vars[-nd:]
        return lead, taps(windows, out_vars, ranges_of(ctx))

    def maximum(ctx: LoweringContext) -> Expr:
        lead, taps = window(ctx)
        values = [masked(valid, spatial_load(x, lead, idx, acc), -math.inf) for _, idx, valid in taps]
        out = values[0]
        for v in values[1:]:
            out = op("maximum", out, v)  # NaN-propagating, as eager
        return out

    values = b.pointwise(sizes, x.dtype, maximum, values_meta.stride())

    position_dtype = torch.int8 if offsets else torch.int64
    kernel = [w.kernel for w in windows]

    def position(at: tuple[int, ...], idx: tuple[sympy.Expr, ...], ranges: dict[sympy.Symbol, int]) -> Expr:
        if offsets:
            return Constant(indexing.ravel(list(at), indexing.contiguous_strides(kernel)), torch.int8)
        return cast(index_value(_plane_offset(idx, windows), ranges), torch.int64)

    def argmax(ctx: LoweringContext) -> Expr:
        # The first position holding the maximum; where the maximum is NaN, the last NaN (eager
        # replaces its candidate on every NaN). Two chains, each referring to its tail once.
        lead, taps = window(ctx)
        best = ctx.value(values, acc)
        ranges = ranges_of(ctx)
        found: Expr = Constant(0, position_dtype)
        for at, idx, valid in reversed(taps):
            hit = conj(valid, op("eq", spatial_load(x, lead, idx, acc), best, dtype=torch.bool))
            found = op("where", hit, position(at, idx, ranges), found)
        for at, idx, valid in taps:
            nan = conj(valid, op("isnan", spatial_load(x, lead, idx, acc), dtype=torch.bool))
            found = op("where", nan, position(at, idx, ranges), found)
        return found

    indices = b.pointwise(sizes, position_dtype, argmax, indices_meta.stride())
    return values, indices


@register_composite(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(b: GraphLowering, self: TensorArg, kernel_size: Any, stride: Any = (), padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False) -> tuple[TensorArg, TensorArg]:
    return _max_pool(b, self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@register_composite(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(b: GraphLowering, self: TensorArg, kernel_size: Any, stride: Any = (), padding: Any = 0,
                            dilation: Any = 1, ceil_mode: bool = False) -> tuple[TensorArg, TensorArg]:
    return _max_pool(b, self, 3, kernel_size, stride, padding, dilation, ceil_mode)


# In training, the indices a max pool saves for its backward are int64, eight times the size of
# a bf16 activation: ResNet-50's first pool saved 98 MiB of them at batch 64. Inductor's
# decomposition (``decompositions.py`` uses it) has the forward keep each maximum's position in
# its window as an int8, and the backward turn those into indices, a pointwise op that
# AOTAutograd's partitioner recomputes there, so the int8 positions are what is saved.
@register_composite(prims._low_memory_max_pool_with_offsets.default)
def max_pool_with_offsets(b: GraphLowering, self: TensorArg, kernel_size: Any, stride: Any, padding: Any,
                          dilation: Any, ceil_mode: bool) -> tuple[TensorArg, TensorArg]:
    return _max_pool(b, self, len(kernel_size), kernel_size, stride, padding, dilation, ceil_mode, offsets=True)


@register_pointwise(prims._low_memory_max_pool_offsets_to_indices.default)
def max_pool_offsets_to_indices(ctx: LoweringContext, self: TensorArg, kernel_size: Any, input_size: Any,
                                stride: Any, padding: Any, dilation: Any) -> Expr:
    """The flat plane index of the window position ``self`` of the output element at ``ctx``:
    the window's first element (``i * stride - padding`` along each dim) plus, along each dim,
    the position's step there (``dilation`` elements each). Few operations, so that the max
    pool's backward, which reads it at every window covering an element, recomputes it."""
    nd = len(kernel_size)
    position = ctx.value(self, torch.int64)
    ranges = ranges_of(ctx)
    plane = indexing.contiguous_strides(list(input_size))
    start = sum((v * s * p for v, s, p in zip(ctx.vars[-nd:], stride, plane)), sympy.Integer(0))
    index = op("sub", cast(index_value(start, ranges), torch.int64),
               Constant(sum(pad * p for pad, p in zip(padding, plane)), torch.int64))
    for d in range(nd):
        inner = math.prod(kernel_size[d + 1:])
        k = position if inner == 1 else op("int_truncdiv", position, Constant(inner, torch.int64))
        if d > 0:  # the first dim's step is below kernel_size[0] already
            k = op("int_truncmod", k, Constant(kernel_size[d], torch.int64))
        step = dilation[d] * plane[d]
        index = op("add", index, k if step == 1 else op("mul", k, Constant(step, torch.int64)))
    return index


def _covering(ctx: LoweringContext, windows: Sequence[Window], nd: int
              ) -> list[tuple[tuple[sympy.Expr, ...], tuple[int, ...], Cond]]:
    """For the input element at ``ctx``'s index: every output window that may cover it, as (its
    index held inside the output, the steps back from the last such window, whether it exists)."""
    ranges = ranges_of(ctx)
    check_unrolled(math.prod(w.covering() for w in windows), "a pool's backward window")
    out = []
    for steps in itertools.product(*(range(w.covering()) for w in windows)):
        index = [FloorDiv(v + w.padding, w.stride) - t for v, w, t in zip(ctx.vars[-nd:], windows, steps)]
        valid = conj(*(in_range(e, 0, w.out_size, ranges) for e, w in zip(index, windows)))
        if valid is not False:
            out.append((tuple(clamped(e, w.out_size, ranges) for e, w in zip(index, windows)), steps, valid))
    return out


def _max_pool_backward(ctx: LoweringContext, grad_output: TensorArg, x: TensorArg, nd: int, kernel_size: Any,
                       stride: Any, padding: Any, dilation: Any, indices: TensorArg) -> Expr:
    """Each input element sums the gradients of the windows whose maximum it was."""
    float_input(grad_output)
    windows = windows_of(x, grad_output.sizes, nd, kernel_size, stride, padding, dilation)
    ranges = ranges_of(ctx)
    acc = ir.compute_dtype(ctx.dtype)
    lead = ctx.vars[:-nd]
    here = cast(index_value(_plane_offset(ctx.vars[-nd:], windows), ranges), torch.int64)
    terms = []
    for idx, _, valid in _covering(ctx, windows, nd):
        argmax = spatial_load(indices, lead, idx, torch.int64)
        hit = conj(valid, op("eq", argmax, here, dtype=torch.bool))
        terms.append(masked(hit, spatial_load(grad_output, lead, idx, acc), 0.0))
    return total(terms, acc)


@register_pointwise(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(ctx: LoweringContext, grad_output: TensorArg, self: TensorArg, kernel_size: Any,
                                     stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
                                     indices: TensorArg) -> Expr:
    return _max_pool_backward(ctx, grad_output, self, 2, kernel_size, stride, padding, dilation, indices)


@register_pointwise(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(ctx: LoweringContext, grad_output: TensorArg, self: TensorArg, kernel_size: Any,
                                     stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
                                     indices: TensorArg) -> Expr:
    return _max_pool_backward(ctx, grad_output, self, 3, kernel_size, stride, padding, dilation, indices)


# -------------------------------------------------------------------------- average pooling


def _window_size(w: Window, i: sympy.Expr, include_pad: bool, ranges: dict[sympy.Symbol, int]) -> Expr | int:
    """How many elements window ``i`` averages over (eager's formula, per dim): the window is cut
    at ``in_size + padding``; without ``count_include_pad`` also at the input's edges."""
    lo, hi = indexing.bounds(indexing.simplify(w.start(i), ranges), ranges)
    if hi + w.kernel <= w.in_size + (w.padding if include_pad else 0) and (include_pad or lo >= 0):
        return w.kernel  # no window is cut
    scaled = index_value(i * w.stride, ranges)
    dt = scaled.dtype
    start = op("sub", scaled, Constant(w.padding, dt))
    end = op("minimum", op("add", start, Constant(w.kernel, dt)), Constant(w.in_size + w.padding, dt))
    if include_pad:
        return op("sub", end, start)
    return op("sub", op("minimum", end, Constant(w.in_size, dt)), op("maximum", start, Constant(0, dt)))


def _divisor(windows: Sequence[Window], index: Sequence[sympy.Expr], include_pad: bool, override: Any,
             ranges: dict[sympy.Symbol, int], acc: torch.dtype) -> Expr:
    if override:
        return Constant(float(override), acc)
    return product([_window_size(w, i, include_pad, ranges) for w, i in zip(windows, index)], acc)


def _avg_pool(ctx: LoweringContext, x: TensorArg, windows: Sequence[Window], count_include_pad: bool,
              divisor_override: Any) -> Expr:
    nd = len(windows)
    ranges = ranges_of(ctx)
    acc = ir.compute_dtype(ctx.dtype)
    lead, out_vars = ctx.vars[:-nd], ctx.vars[-nd:]
    terms = [masked(valid, spatial_load(x, lead, idx, acc), 0.0) for _, idx, valid in taps(windows, out_vars, ranges)]
    divisor = _divisor(windows, out_vars, count_include_pad, divisor_override, ranges, acc)
    return op("truediv", total(terms, acc), divisor)


# From this many positions on, an average over windows that tile the input is a reduction.
REDUCE_FROM = 64


def _average(b: GraphLowering, x: TensorArg, nd: int, positions: int, tiles: Sequence[int] | None, divisor: float,
             body: Callable[[LoweringContext], Expr]) -> TensorArg:
    """One pointwise node that unrolls the window (``body``); or, for a large window where the
    windows tile the input (``tiles``: their sizes, stride = kernel and no padding), the sums of
    a view with a (window, position) dim pair per spatial dim, reduced over the positions, and
    divided by ``divisor``."""
    meta = b.out_meta
    if positions < REDUCE_FROM or tiles is None:
        check_unrolled(positions, "an average pool window")
        return b.pointwise(tuple(meta.shape), meta.dtype, body, tuple(meta.stride()))
    view = x.view
    lead = len(view.sizes) - nd
    sizes, strides, positions_dims = list(view.sizes[:lead]), list(view.strides[:lead]), []
    for k, o, st in zip(tiles, tuple(meta.shape)[-nd:], view.strides[lead:]):
        sizes += [o, k]
        strides += [k * st, st]
        positions_dims.append(len(sizes) - 1)
    tiled = TensorArg(ir.View(view.buffer, tuple(sizes), tuple(strides), view.offset),
                      torch.empty_strided(sizes, strides, dtype=x.dtype, device="meta"))
    acc = ir.compute_dtype(x.dtype)
    sums = b.reduce(tiled, positions_dims, False, "sum", acc, lambda ctx: ctx.value(tiled, acc))
    mean = lambda ctx: op("truediv", ctx.value(sums, acc), Constant(float(divisor), acc))  # noqa: E731
    return b.pointwise(tuple(meta.shape), meta.dtype, mean, tuple(meta.stride()))


def _avg_pool_node(b: GraphLowering, x: TensorArg, nd: int, kernel_size: Any, stride: Any, padding: Any,
                   count_include_pad: bool, divisor_override: Any) -> TensorArg:
    float_input(x)
    windows = windows_of(x, b.out_meta.shape, nd, kernel_size, stride, padding)
    tiles = None
    if all(w.stride == w.kernel and w.padding == 0 and w.out_size * w.kernel <= w.in_size for w in windows):
        tiles = [w.kernel for w in windows]
    positions = math.prod(w.reach for w in windows)
    return _average(b, x, nd, positions, tiles, divisor_override or positions,
                    lambda ctx: _avg_pool(ctx, x, windows, count_include_pad, divisor_override))


@register_composite(aten.avg_pool2d.default)
def avg_pool2d(b: GraphLowering, self: TensorArg, kernel_size: Any, stride: Any = (), padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> TensorArg:
    return _avg_pool_node(b, self, 2, kernel_size, stride, padding, count_include_pad, divisor_override)


@register_composite(aten.avg_pool3d.default)
def avg_pool3d(b: GraphLowering, self: TensorArg, kernel_size: Any, stride: Any = (), padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> TensorArg:
    return _avg_pool_node(b, self, 3, kernel_size, stride, padding, count_include_pad, divisor_override)


def _avg_pool_backward(ctx: LoweringContext, grad_output: TensorArg, x: TensorArg, nd: int, kernel_size: Any,
                       stride: Any, padding: Any, count_include_pad: bool, divisor_override: Any) -> Expr:
    """Each input element sums ``grad / divisor`` of the windows that cover it."""
    float_input(grad_output)
    windows = windows_of(x, grad_output.sizes, nd, kernel_size, stride, padding)
    ranges = ranges_of(ctx)
    acc = ir.compute_dtype(ctx.dtype)
    lead = ctx.vars[:-nd]
    terms = []
    for idx, steps, valid in _covering(ctx, windows, nd):
        # the window starting ``steps`` strides before the last one covers this element when
        # the element lies within its ``kernel`` first positions
        inside = [in_range(ModIdx(v + w.padding, w.stride) + t * w.stride, 0, w.kernel, ranges)
                  for v, w, t in zip(ctx.vars[-nd:], windows, steps)]
        valid = conj(valid, *inside)
        if valid is False:
            continue
        share = op("truediv", spatial_load(grad_output, lead, idx, acc),
                   _divisor(windows, idx, count_include_pad, divisor_override, ranges, acc))
        terms.append(masked(valid, share, 0.0))
    return total(terms, acc)


@register_pointwise(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(ctx: LoweringContext, grad_output: TensorArg, self: TensorArg, kernel_size: Any, stride: Any,
                        padding: Any, ceil_mode: bool, count_include_pad: bool, divisor_override: Any) -> Expr:
    return _avg_pool_backward(ctx, grad_output, self, 2, kernel_size, stride, padding, count_include_pad,
                              divisor_override)


@register_pointwise(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(ctx: LoweringContext, grad_output: TensorArg, self: TensorArg, kernel_size: Any, stride: Any,
                        padding: Any, ceil_mode: bool, count_include_pad: bool, divisor_override: Any) -> Expr:
    return _avg_pool_backward(ctx, grad_output, self, 3, kernel_size, stride, padding, count_include_pad,
                              divisor_override)


# ------------------------------------------------------------------------- adaptive pooling


@dataclasses.dataclass(frozen=True)
class AdaptiveAxis:
    """One spatial dim of an adaptive pool: output ``i`` averages input [start(i), end(i))."""

    in_size: int
    out_size: int

    def start(self, i: sympy.Expr) -> sympy.Expr:
        return FloorDiv(i * self.in_size, self.out_size)

    def end(self, i: sympy.Expr) -> sympy.Expr:  # ceil((i + 1) * in / out)
        return FloorDiv(i * self.in_size + self.in_size + self.out_size - 1, self.out_size)

    def sizes(self) -> list[int]:
        return [int(self.end(sympy.Integer(i)) - self.start(sympy.Integer(i))) for i in range(self.out_size)]

    def first_window(self, h: sympy.Expr) -> sympy.Expr:
        """The first window that covers input ``h``: floor(h * out / in)."""
        return FloorDiv(h * self.out_size, self.in_size)

    def last_window(self, h: sympy.Expr) -> sympy.Expr:
        return FloorDiv(h * self.out_size + self.out_size - 1, self.in_size)

    def covering(self) -> list[int]:
        return [int(self.last_window(sympy.Integer(h)) - self.first_window(sympy.Integer(h))) + 1
                for h in range(self.in_size)]

    def size(self, i: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> Expr | int:
        sizes = self.sizes()
        if min(sizes) == max(sizes):
            return sizes[0]
        return op("sub", index_value(self.end(i), ranges), index_value(self.start(i), ranges))


def _adaptive_axes(in_sizes: Sequence[int], out_sizes: Sequence[int], nd: int) -> tuple[AdaptiveAxis, ...]:
    if len(in_sizes) not in (nd + 1, nd + 2):
        raise Unsupported(f"a {nd}d adaptive pool of a {len(in_sizes)}-dim tensor")
    axes = tuple(AdaptiveAxis(i, o) for i, o in zip(tuple(in_sizes)[-nd:], tuple(out_sizes)[-nd:]))
    if any(a.in_size == 0 or a.out_size == 0 for a in axes):
        raise Unsupported("an empty adaptive pool")
    return axes


def _adaptive_avg_pool(ctx: LoweringContext, x: TensorArg, axes: Sequence[AdaptiveAxis]) -> Expr:
    nd = len(axes)
    ranges = ranges_of(ctx)
    acc = ir.compute_dtype(ctx.dtype)
    lead, out_vars = ctx.vars[:-nd], ctx.vars[-nd:]
    terms = []
    for offsets in itertools.product(*(range(max(a.sizes())) for a in axes)):
        index, valid = [], []
        for a, v, t in zip(axes, out_vars, offsets):
            index.append(clamped(a.start(v) + t, a.in_size, ranges))
            if t >= min(a.sizes()):  # past the smallest window: inside only the larger ones
                valid.append(op("lt", index_value(a.start(v) + t, ranges), index_value(a.end(v), ranges),
                                dtype=torch.bool))
        terms.append(masked(conj(*valid), spatial_load(x, lead, index, acc), 0.0))
    return op("truediv", total(terms, acc), product([a.size(i, ranges) for a, i in zip(axes, out_vars)], acc))


def _adaptive_avg_pool_node(b: GraphLowering, x: TensorArg, nd: int) -> TensorArg:
    float_input(x)
    axes = _adaptive_axes(x.sizes, b.out_meta.shape, nd)
    tiles = [a.in_size // a.out_size for a in axes] if all(a.in_size % a.out_size == 0 for a in axes) else None
    positions = math.prod(max(a.sizes()) for a in axes)
    return _average(b, x, nd, positions, tiles, positions, lambda ctx: _adaptive_avg_pool(ctx, x, axes))


@register_composite(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(b: GraphLowering, self: TensorArg, output_size: Any) -> TensorArg:
    return _adaptive_avg_pool_node(b, self, 2)


@register_composite(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(b: GraphLowering, self: TensorArg, output_size: Any) -> TensorArg:
    return _adaptive_avg_pool_node(b, self, 3)


def _adaptive_avg_pool_backward(ctx: LoweringContext, grad_output: TensorArg, nd: int) -> Expr:
    """Each input element sums ``grad / window size`` of the windows that cover it: windows
    first_window(h) .. last_window(h), bounded by the most that cover one element."""
    float_input(grad_output)
    axes = _adaptive_axes(ctx.sizes, grad_output.sizes, nd)
    ranges = ranges_of(ctx)
    acc = ir.compute_dtype(ctx.dtype)
    lead, in_vars = ctx.vars[:-nd], ctx.vars[-nd:]
    check_unrolled(math.prod(max(a.covering()) for a in axes), "an adaptive pool's backward window")
    terms = []
    for offsets in itertools.product(*(range(max(a.covering())) for a in axes)):
        index, valid = [], []
        for a, h, t in zip(axes, in_vars, offsets):
            index.append(clamped(a.first_window(h) + t, a.out_size, ranges))
            if t >= min(a.covering()):
                valid.append(op("le", index_value(a.first_window(h) + t, ranges),
                                index_value(a.last_window(h), ranges), dtype=torch.bool))
        divisor = product([a.size(i, ranges) for a, i in zip(axes, index)], acc)
        share = op("truediv", spatial_load(grad_output, lead, index, acc), divisor)
        terms.append(masked(conj(*valid), share, 0.0))
    return total(terms, acc)


@register_pointwise(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(ctx: LoweringContext, grad_output: TensorArg, self: TensorArg) -> Expr:
    return _adaptive_avg_pool_backward(ctx, grad_output, 2)


@register_pointwise(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(ctx: LoweringContext, grad_output: TensorArg, self: TensorArg) -> Expr:
    return _adaptive_avg_pool_backward(ctx, grad_output, 3)
