"""Upsampling (nearest, nearest-exact, linear; 1d to 3d) and its backward as pointwise nodes.

Why not PyTorch's decompositions: they compute the source positions with ``arange`` and float
arithmetic and read with ``aten.index`` (a gather, an ATen call here), and the backward pass is
their derivative, ``index_put`` with accumulation (a scatter-add, atomics on a GPU). Kept whole
(``decompositions.whole_ops``), each op is one pointwise node whose loads are plain indices,
so the producer of its input and the consumer of its output fuse with it:

- per spatial dim, the input position each output position reads is a compile-time table:
  eager's float formula as its kernels compute it on the graph's device (a ``float32`` scale
  and ``floorf`` for nearest; the op-math type for linear; the fused multiply-add the CPU
  build contracts ``scale * (i + 0.5) - 0.5`` into; the CPU's 2d nearest shortcuts), computed
  here with numpy in the same precision. The table is fitted by
  ``clamp(floor((a*i + b) / c), lo, hi)`` with ``a/c`` near the size ratio, so the kernel
  indexes with integer arithmetic. For nearest the fit is exact, or the op stays an ATen call
  (a size whose float rounding breaks every small fraction's pattern); linear interpolation is
  continuous, so where the coordinate is within a few ulps of a whole number either neighbour
  pair is allowed (the weights, computed from the coordinate, make the difference vanish);
- linear interpolation's weights are computed in the kernel from the output index, by eager's
  formula, and the two (four, eight) neighbours are combined per dim as eager nests them;
- a backward pass gathers, for each input element, from the output positions that read it: a
  window ``L(h) .. L(h) + span - 1`` with ``L`` a floor-affine lower bound fitted to the tables.
  Which (output, neighbour) pairs read the element is also decided from the tables where it is
  the same for every element (a x2 nearest upsampling's gradient is the plain sum of a 2x2
  block), and tested in the kernel where not. A linear upsampling's backward whose windows
  hold more than ``SEPARABLE_TAPS`` positions over all dims is a reduction per dim instead
  (``separable_backward``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from fractions import Fraction
from typing import Any, Sequence

import numpy as np
import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.indexing import Clamp, FloorDiv
from fusebackend.ir import Constant, Expr, cast, op
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.windows import (
    check_unrolled, clamped, conj, in_range, index_value, masked, ranges_of, settled, spatial_load, total,
)
from fusebackend.lowering.registry import Unsupported, register_composite, register_pointwise

aten = torch.ops.aten

INDEX_LIMIT = 2**31  # fitted maps compute in int32
# A backward window of more positions than this (all dims together) is summed one dim at a time
SEPARABLE_TAPS = 16


# ------------------------------------------------------------------------- fitted index maps


@dataclasses.dataclass(frozen=True)
class FloorAffine:
    """``clamp(floor((a*i + b) / c), lo, hi)``: a per-dim index map."""

    a: int
    b: int
    c: int
    lo: int
    hi: int

    def __call__(self, i: int) -> int:
        return min(max((self.a * i + self.b) // self.c, self.lo), self.hi)

    def at(self, i: sympy.Expr) -> sympy.Expr:
        # b may be negative: add whole multiples of c, so that the dividend is not
        k = -(self.b // self.c) if self.b < 0 else 0
        return Clamp(FloorDiv(self.a * i + self.b + self.c * k, self.c) - k, self.lo, self.hi)


def _fits_int32(a: int, b: int, c: int, n: int) -> bool:
    return a * n + abs(b) + 2 * c < INDEX_LIMIT


def fit(allowed: Sequence[tuple[int, int]], ratios: Sequence[Fraction]) -> FloorAffine | None:
    """A map whose value at each ``i`` lies in ``allowed[i]`` (both ends included), with slope one
    of ``ratios``; None where no slope admits one. It is clamped to the values allowed, so a
    table that is flat at its ends (eager's own clamps) fits too."""
    lo, hi = min(a for a, _ in allowed), max(b for _, b in allowed)
    for r in ratios:
        a, c = r.numerator, r.denominator
        bmin, bmax = -math.inf, math.inf
        for i, (least, most) in enumerate(allowed):
            if least > lo:
                bmin = max(bmin, c * least - a * i)  # floor((a*i + b) / c) >= least
            if most < hi:
                bmax = min(bmax, c * (most + 1) - a * i - 1)  # ... <= most
        if bmin > bmax:
            continue
        b = int(bmin if bmin != -math.inf else bmax if bmax != math.inf else 0)
        fitted = FloorAffine(a, b, c, lo, hi)
        if _fits_int32(a, b, c, len(allowed)) and all(l <= fitted(i) <= m for i, (l, m) in enumerate(allowed)):
            return fitted
    return None


def fit_below(first: dict[int, int], last: dict[int, int], ratios: Sequence[Fraction], out_size: int
              ) -> tuple[FloorAffine, int]:
    """A map ``L`` with ``L(h) <= first[h]`` for every ``h``, and the span ``max(last[h] - L(h) + 1)``
    it needs; of the slopes in ``ratios``, the one with the smallest span."""
    best: tuple[FloorAffine, int] | None = None
    n = max(first) + 1
    for r in ratios:
        a, c = r.numerator, r.denominator
        b = min(c * (f + 1) - a * h - 1 for h, f in first.items())
        if not _fits_int32(a, b, c, n):
            continue
        fitted = FloorAffine(a, b, c, 0, out_size - 1)
        span = max(last[h] - fitted(h) + 1 for h in first)
        if best is None or span < best[1]:
            best = (fitted, span)
    if best is None:
        raise Unsupported("no index map bounds the upsampling's backward window")
    return best


def _ratios(*values: float | Fraction) -> list[Fraction]:
    """Small fractions near each value (the value itself first where it is one)."""
    out: list[Fraction] = []
    for v in values:
        exact = Fraction(v)
        for f in (exact, exact.limit_denominator(16), exact.limit_denominator(256), exact.limit_denominator(4096)):
            if f > 0 and f not in out:
                out.append(f)
    return out


# ----------------------------------------------------------------------------------- axes


def _scale(in_size: int, out_size: int, scale: float | None, ftype: type) -> Any:
    """Eager's ``compute_scales_value``: 1/scale where one is given, else in/out, in ``ftype``."""
    if scale is not None and scale > 0:
        return ftype(1.0 / scale)
    return ftype(in_size) / ftype(out_size)


@dataclasses.dataclass(frozen=True)
class Axis:
    """One spatial dim of a resampling: output ``i`` reads input ``maps[k](i)`` for each
    neighbour ``k`` (one for nearest, two for linear), with the weights ``weights`` gives."""

    in_size: int
    out_size: int
    maps: tuple[FloorAffine, ...]
    ratios: tuple[Fraction, ...]  # near in/out: slopes for the backward window
    # linear only: the source coordinate's scale and whether it is aligned to corners
    linear: tuple[float, bool] | None = None
    silent: frozenset[tuple[int, int]] = frozenset()  # (output, neighbour) pairs of weight 0

    def sources(self, i: int) -> tuple[int, ...]:
        return tuple(m(i) for m in self.maps)

    def reads(self, i: int) -> list[tuple[int, int]]:
        """(neighbour, input position) that output ``i`` reads with a nonzero weight."""
        return [(k, m(i)) for k, m in enumerate(self.maps) if (i, k) not in self.silent]

    def weights(self, i: sympy.Expr, ranges: dict[sympy.Symbol, int], acc: torch.dtype) -> list[Expr | None]:
        """Each neighbour's weight at output ``i`` (None: 1)."""
        if self.linear is None or len(self.maps) == 1:
            return [None] * len(self.maps)
        scale, align = self.linear
        s = Constant(float(scale), acc)
        at = cast(index_value(i, ranges), acc)
        if align:
            src = op("mul", s, at)
        else:  # scale * (i + 0.5) - 0.5, not below 0
            src = op("sub", op("mul", s, op("add", at, Constant(0.5, acc))), Constant(0.5, acc))
            src = op("maximum", src, Constant(0.0, acc))
        base = cast(index_value(settled(self.maps[0].at(i), ranges), ranges), acc)
        far = op("minimum", op("maximum", op("sub", src, base), Constant(0.0, acc)), Constant(1.0, acc))
        return [op("sub", Constant(1.0, acc), far), far]


def _fused(a: Any, b: Any, c: Any, ftype: type) -> Any:
    """``a*b + c`` rounded once to ``ftype``: eager's compilers contract its source-coordinate
    formulas into a fused multiply-add (a float32 product is exact in float64)."""
    if ftype is np.float32:
        return np.float32(float(a) * float(b) + float(c))
    return np.float64(float(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))))


def nearest_axis(in_size: int, out_size: int, scale: float | None, exact: bool, device: str, nd: int) -> Axis:
    """Eager's nearest source index, in float32 as eager computes it on ``device``: ``floor(i *
    scale)``, or for nearest-exact ``floor((i + 0.5) * scale)`` (the product in double on a
    GPU; on the CPU ``scale * (i + 0.5) - 0.5`` fused, plus 0.5). Eager's 2d CPU kernel copies
    equal sizes and halves the index of doubled ones, whatever the scale."""
    if device == "cpu" and nd == 2 and not exact and out_size in (in_size, 2 * in_size):
        table = [i if out_size == in_size else i >> 1 for i in range(out_size)]
        s: Any = Fraction(in_size, out_size)
    else:
        s = _scale(in_size, out_size, scale, np.float32)
        if not exact:
            points = [np.float32(i) * s for i in range(out_size)]
        elif device == "cpu":
            points = [np.float32(float(max(_fused(s, np.float32(i + 0.5), -0.5, np.float32), 0)) + 0.5)
                      for i in range(out_size)]
        else:
            points = [np.float32((i + 0.5) * float(s)) for i in range(out_size)]
        table = [min(int(np.floor(p)), in_size - 1) for p in points]
    ratios = tuple(_ratios(Fraction(in_size, out_size), float(s)))
    fitted = fit([(f, f) for f in table], ratios)
    if fitted is None:
        raise Unsupported(f"nearest indices {in_size} -> {out_size} fit no small fraction")
    return Axis(in_size, out_size, (fitted,), ratios)


def linear_axis(in_size: int, out_size: int, align: bool, scale: float | None, device: str, acc: torch.dtype) -> Axis:
    """Eager's linear source coordinate in the op-math type; the CPU copies equal sizes."""
    if device == "cpu" and out_size == in_size:
        identity = FloorAffine(1, 0, 1, 0, in_size - 1)
        return Axis(in_size, out_size, (identity,), (Fraction(1),), (1.0, True))
    ftype = np.float64 if acc == torch.float64 else np.float32
    if align:
        s = ftype(in_size - 1) / ftype(out_size - 1) if out_size > 1 else ftype(0)
        src = [s * ftype(i) for i in range(out_size)]
    else:  # scale * (i + 0.5) - 0.5, not below 0
        s = _scale(in_size, out_size, scale, ftype)
        src = [max(_fused(s, ftype(i) + ftype(0.5), -0.5, ftype), ftype(0)) for i in range(out_size)]
    # Interpolation is continuous: where the coordinate rounds to within a hair of a whole
    # number k, either neighbour pair (k-1, k) or (k, k+1) gives eager's value up to that hair
    # (the weights follow the coordinate), so the map may take either there.
    near = []
    for v in src:
        k = int(np.rint(v))
        fragile = abs(float(v) - k) <= 8 * float(np.spacing(ftype(max(k, 1)))) and 0 < k < in_size
        near.append((k - 1, k) if fragile else (min(int(np.floor(v)), in_size - 1),) * 2)
    candidates = [Fraction(in_size, out_size), float(s)]
    if in_size > 1 and out_size > 1:
        candidates.insert(1, Fraction(in_size - 1, out_size - 1))
    ratios = tuple(_ratios(*candidates))
    base = fit(near, ratios)
    far = None if base is None else fit([(min(base(i) + 1, in_size - 1),) * 2 for i in range(out_size)], ratios)
    if base is None or far is None:
        raise Unsupported(f"linear indices {in_size} -> {out_size} fit no small fraction")
    # a neighbour of weight 0 (the coordinate clamped at 0, or whole) adds nothing to the
    # gradient: the backward window need not reach it
    silent = set()
    for i, v in enumerate(src):
        w = min(max(float(v) - base(i), 0.0), 1.0)
        silent |= {(i, 1)} if w == 0.0 else {(i, 0)} if w == 1.0 else set()
    return Axis(in_size, out_size, (base, far), ratios, (float(s), align), frozenset(silent))


# ---------------------------------------------------------------------------------- forward


def _check_rank(x: TensorArg, nd: int) -> None:
    if len(x.sizes) != nd + 2 or 0 in x.sizes:
        raise Unsupported(f"a {nd}d upsampling of a {len(x.sizes)}-dim or empty tensor")


def _forward(ctx: LoweringContext, x: TensorArg, axes: Sequence[Axis]) -> Expr:
    """Nested over the dims as eager nests them: w0 * (...) + w1 * (...)."""
    nd = len(axes)
    ranges = ranges_of(ctx)
    acc = ir.compute_dtype(ctx.dtype)
    lead, out_vars = ctx.vars[:-nd], ctx.vars[-nd:]
    indices = [[settled(m.at(v), ranges) for m in a.maps] for a, v in zip(axes, out_vars)]
    weights = [a.weights(v, ranges, acc) for a, v in zip(axes, out_vars)]

    def blend(d: int, prefix: tuple[sympy.Expr, ...]) -> Expr:
        if d == nd:
            return spatial_load(x, lead, prefix, acc)
        parts = []
        for index, weight in zip(indices[d], weights[d]):
            value = blend(d + 1, prefix + (index,))
            parts.append(value if weight is None else op("mul", weight, value))
        return total(parts, acc)

    return blend(0, ())


def _scales(scales: Sequence[Any], nd: int) -> list[float | None]:
    return list(scales) if len(scales) == nd else [None] * nd


def _nearest(ctx: LoweringContext, x: TensorArg, scales: Sequence[Any], exact: bool) -> Expr:
    nd = len(scales)
    _check_rank(x, nd)
    device = ctx.device.type
    axes = [nearest_axis(i, o, s, exact, device, nd) for i, o, s in zip(x.sizes[-nd:], ctx.sizes[-nd:], scales)]
    return _forward(ctx, x, axes)


def _linear(ctx: LoweringContext, x: TensorArg, align_corners: bool, scales: Sequence[Any]) -> Expr:
    nd = len(scales)
    _check_rank(x, nd)
    if not x.dtype.is_floating_point:
        raise Unsupported(f"linear upsampling of {x.dtype}")
    acc = ir.compute_dtype(ctx.dtype)
    axes = [linear_axis(i, o, align_corners, s, ctx.device.type, acc)
            for i, o, s in zip(x.sizes[-nd:], ctx.sizes[-nd:], scales)]
    return _forward(ctx, x, axes)


# --------------------------------------------------------------------------------- backward


@dataclasses.dataclass(frozen=True)
class Gather:
    """For input ``h`` of one dim: the outputs ``L(h) + t`` (t < span) that may read it, and for
    each (t, neighbour k) whether output ``L(h) + t`` reads ``h`` through ``k`` for every ``h``
    ("always"), for none ("never") or for some ("test": decided in the kernel)."""

    start: FloorAffine
    reads: tuple[tuple[str, ...], ...]  # [t][k]


@functools.lru_cache(maxsize=256)  # a window's axes are asked for by its size check and its passes
def gather_of(axis: Axis) -> Gather:
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i in range(axis.out_size):
        for _, h in axis.reads(i):
            first[h] = min(first.get(h, i), i)
            last[h] = max(last.get(h, i), i)
    inverse = [1 / r for r in axis.ratios]
    start, span = fit_below(first, last, inverse, axis.out_size)
    reads = []
    for t in range(span):
        row = []
        for k in range(len(axis.maps)):
            hits = {start(h) + t < axis.out_size and (k, h) in axis.reads(start(h) + t) for h in range(axis.in_size)}
            row.append("always" if hits == {True} else "never" if hits == {False} else "test")
        reads.append(tuple(row))
    return Gather(start, tuple(reads))


def _backward(ctx: LoweringContext, grad_output: TensorArg, axes: Sequence[Axis]) -> Expr:
    """Each input element sums the gradients of the outputs that read it, times their weights."""
    nd = len(axes)
    ranges = ranges_of(ctx)
    acc = ir.compute_dtype(ctx.dtype)
    lead, in_vars = ctx.vars[:-nd], ctx.vars[-nd:]
    per_dim: list[list[tuple[sympy.Expr, Expr | None, Expr | bool]]] = []  # (output index, weight, mask)
    for axis, h in zip(axes, in_vars):
        g = gather_of(axis)
        options = []
        for t, reads in enumerate(g.reads):
            if all(r == "never" for r in reads):
                continue
            unclamped = g.start.at(h) + t
            i = clamped(unclamped, axis.out_size, ranges)
            exists = in_range(unclamped, 0, axis.out_size, ranges)
            weights = axis.weights(i, ranges, acc)
            if all(r == "always" for r in reads) and all(w is None for w in weights):
                options.append((i, None, True))  # read once, weight 1 (nearest)
                continue
            if len(reads) == 1:  # one neighbour: a mask, no weight
                hit = exists if reads[0] == "always" else conj(exists, _reads(axis.maps[0], i, h, ranges))
                options.append((i, weights[0], hit))
                continue
            parts = []
            for m, r, w in zip(axis.maps, reads, weights):
                w = Constant(1.0, acc) if w is None else w
                if r == "always":
                    parts.append(w)
                elif r == "test":
                    parts.append(masked(conj(exists, _reads(m, i, h, ranges)), w, 0.0))
            options.append((i, total(parts, acc), True))
        per_dim.append(options)
    check_unrolled(math.prod(len(o) for o in per_dim), "an upsampling's backward window")
    terms = []
    for combo in itertools.product(*per_dim):
        index = tuple(i for i, _, _ in combo)
        hit = conj(*(m for _, _, m in combo))
        if hit is False:
            continue
        value = spatial_load(grad_output, lead, index, acc)
        for _, w, _ in combo:
            if w is not None:
                value = op("mul", w, value)
        terms.append(masked(hit, value, 0.0))
    return total(terms, acc)


def _taps(axis: Axis) -> int:
    """The output positions one input element of this dim may gather from (``_backward``)."""
    return sum(1 for reads in gather_of(axis).reads if any(r != "never" for r in reads))


def separable_backward(b: GraphLowering, grad_output: TensorArg, axes: Sequence[Axis], dtype: torch.dtype,
                       memory_order: Sequence[int]) -> TensorArg | None:
    """An upsampling's backward one dim at a time, where its windows are large (``SEPARABLE_TAPS``);
    None where they are not.

    Each output of an upsampling reads the product of per-dim neighbours with the product of
    per-dim weights, so the gradient sums over one dim, then the next: the last dim first, into
    a tensor of the input's size there and the output's elsewhere (in fp32), then each earlier
    dim, each pass stored in ``memory_order`` (the result's dims, slowest first). Each pass is
    a reduction over the window of its dim (``_dim_backward``), whose kernel loops over the
    window where one node unrolls the product of every dim's: an input element
    of Segformer's x4 and x8 upsamplings (training) gathered 64 to 256 gradients, kernels of
    1589 and 1647 lines; the zoo's audit (H100, bf16, 2026-11-27) put the upsampling's backward
    at 3.3 ms, 7% of its floor, and Triton's compile of that step took 57 s. A pointwise pass
    would fuse into the next and unroll the product again."""
    if len(axes) < 2 or math.prod(_taps(a) for a in axes) <= SEPARABLE_TAPS:
        return None
    nd = len(axes)
    acc = ir.compute_dtype(dtype)
    current = grad_output
    for k in reversed(range(nd)):  # dims after k are the input's already
        dim = len(current.sizes) - nd + k
        order = [d for d in range(len(current.sizes)) if d != dim] + [dim]  # dim k last
        sizes = list(current.sizes)
        sizes[dim] = axes[k].in_size
        strides = _dense(sizes, memory_order)
        summed = _dim_backward(b, current.permuted(order), axes[k], dtype if k == 0 else acc,
                               [strides[d] for d in order])
        current = summed.permuted([order.index(d) for d in range(len(order))])
    return current


def _dim_backward(b: GraphLowering, grad: TensorArg, axis: Axis, dtype: torch.dtype, strides: Sequence[int]
                  ) -> TensorArg:
    """The gradient of ``grad`` (its last dim the output's) through one dim's resampling: each
    input position sums, over its window, the output positions that read it, times their
    weights (neighbour by neighbour, tested in the kernel); a reduction over the window."""
    g = gather_of(axis)
    span = len(g.reads)
    lead = tuple(grad.sizes[:-1])
    acc = ir.compute_dtype(dtype)
    v = grad.view
    domain = TensorArg(ir.View(v.buffer, (*lead, axis.in_size, span), (*v.strides[:-1], 0, v.strides[-1]), v.offset),
                       torch.empty((*lead, axis.in_size, span), dtype=grad.dtype, device="meta"))

    def body(ctx: LoweringContext) -> Expr:
        *outer, h, t = ctx.vars
        ranges = ranges_of(ctx)
        unclamped = g.start.at(h) + t
        i = clamped(unclamped, axis.out_size, ranges)
        exists = in_range(unclamped, 0, axis.out_size, ranges)
        if exists is False:
            return Constant(0.0, acc)
        parts = []
        for m, w in zip(axis.maps, axis.weights(i, ranges, acc)):
            parts.append(masked(conj(exists, _reads(m, i, h, ranges)), Constant(1.0, acc) if w is None else w, 0.0))
        return op("mul", total(parts, acc), spatial_load(grad, outer, (i,), acc))

    return b.reduce(domain, [len(lead) + 1], False, "sum", dtype, body, strides)


def _dense(sizes: Sequence[int], order: Sequence[int]) -> list[int]:
    """Dense strides for ``sizes`` with the dims laid out in ``order`` (slowest first)."""
    strides, step = [0] * len(sizes), 1
    for d in reversed(order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return strides


def _reads(m: FloorAffine, i: sympy.Expr, h: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> Expr:
    """Whether output ``i`` reads input ``h`` through the neighbour ``m`` gives."""
    return op("eq", index_value(settled(m.at(i), ranges), ranges), index_value(h, ranges), dtype=torch.bool)


def _nearest_backward(ctx: LoweringContext, grad_output: TensorArg, scales: Sequence[Any], exact: bool) -> Expr:
    nd = len(scales)
    _check_rank(grad_output, nd)
    device = ctx.device.type
    axes = [nearest_axis(i, o, s, exact, device, nd)
            for i, o, s in zip(ctx.sizes[-nd:], grad_output.sizes[-nd:], scales)]
    return _backward(ctx, grad_output, axes)


def _linear_backward(ctx: LoweringContext, grad_output: TensorArg, align_corners: bool, scales: Sequence[Any]) -> Expr:
    nd = len(scales)
    _check_rank(grad_output, nd)
    if not grad_output.dtype.is_floating_point:
        raise Unsupported(f"linear upsampling of {grad_output.dtype}")
    acc = ir.compute_dtype(ctx.dtype)
    axes = [linear_axis(i, o, align_corners, s, ctx.device.type, acc)
            for i, o, s in zip(ctx.sizes[-nd:], grad_output.sizes[-nd:], scales)]
    return _backward(ctx, grad_output, axes)


# ------------------------------------------------------------------------------ registration


# One function per kind serves the 1d, 2d and 3d ops: each schema names its scales, the rest
# keep their defaults.
_SCALES = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}


def _register_nearest(forward: Any, backward: Any, nd: int, exact: bool) -> None:
    def lower(ctx: LoweringContext, self: TensorArg, output_size: Any, scales: Any = None, scales_d: Any = None,
              scales_h: Any = None, scales_w: Any = None) -> Expr:
        given = {"scales": scales, "scales_d": scales_d, "scales_h": scales_h, "scales_w": scales_w}
        return _nearest(ctx, self, [given[n] for n in _SCALES[nd]], exact)

    def lower_backward(ctx: LoweringContext, grad_output: TensorArg, output_size: Any, input_size: Any,
                       scales: Any = None, scales_d: Any = None, scales_h: Any = None, scales_w: Any = None) -> Expr:
        given = {"scales": scales, "scales_d": scales_d, "scales_h": scales_h, "scales_w": scales_w}
        return _nearest_backward(ctx, grad_output, [given[n] for n in _SCALES[nd]], exact)

    register_pointwise(forward)(lower)
    register_pointwise(backward)(lower_backward)


def _register_linear(forward: Any, backward: Any, nd: int) -> None:
    def lower(ctx: LoweringContext, self: TensorArg, output_size: Any, align_corners: bool, scales: Any = None,
              scales_d: Any = None, scales_h: Any = None, scales_w: Any = None) -> Expr:
        given = {"scales": scales, "scales_d": scales_d, "scales_h": scales_h, "scales_w": scales_w}
        return _linear(ctx, self, align_corners, [given[n] for n in _SCALES[nd]])

    def lower_backward(b: GraphLowering, grad_output: TensorArg, output_size: Any, input_size: Any,
                       align_corners: bool, scales: Any = None, scales_d: Any = None, scales_h: Any = None,
                       scales_w: Any = None) -> TensorArg:
        # one node, or one a dim where the windows are large (``separable_backward``)
        given = [{"scales": scales, "scales_d": scales_d, "scales_h": scales_h, "scales_w": scales_w}[n]
                 for n in _SCALES[nd]]
        meta = b.out_meta
        _check_rank(grad_output, nd)
        shape, strides = tuple(meta.shape), tuple(meta.stride())
        if indexing.is_dense(shape, strides) and grad_output.dtype.is_floating_point:
            acc = ir.compute_dtype(meta.dtype)
            axes = [linear_axis(i, o, align_corners, s, b.device.type, acc)
                    for i, o, s in zip(shape[-nd:], grad_output.sizes[-nd:], given)]
            out = separable_backward(b, grad_output, axes, meta.dtype, indexing.dense_order(shape, strides))
            if out is not None:
                return out
        return b.pointwise(tuple(meta.shape), meta.dtype,
                           lambda ctx: _linear_backward(ctx, grad_output, align_corners, given), tuple(meta.stride()))

    register_pointwise(forward)(lower)
    register_composite(backward)(lower_backward)


for _nd in (1, 2, 3):
    _register_nearest(getattr(aten, f"upsample_nearest{_nd}d").default,
                      getattr(aten, f"upsample_nearest{_nd}d_backward").default, _nd, exact=False)
    _register_nearest(getattr(aten, f"_upsample_nearest_exact{_nd}d").default,
                      getattr(aten, f"_upsample_nearest_exact{_nd}d_backward").default, _nd, exact=True)
_register_linear(aten.upsample_linear1d.default, aten.upsample_linear1d_backward.default, 1)
_register_linear(aten.upsample_bilinear2d.default, aten.upsample_bilinear2d_backward.default, 2)
_register_linear(aten.upsample_trilinear3d.default, aten.upsample_trilinear3d_backward.default, 3)
