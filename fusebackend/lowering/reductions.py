"""Lowerings of reductions, built from ``Reduction`` and ``Pointwise`` nodes.

Each is a composite lowering (``registry.register_composite``): it receives the graph builder and
adds nodes with ``b.reduce`` and ``b.pointwise``. Half-precision inputs accumulate in fp32.
``mean`` is a sum and a per-row scale; ``var`` is two-pass (the mean, then the sum of squared
deviations from it), which is numerically stable and, when the row fits in one block, reads the
input once. Where the reduction is split in chunks (few long rows, or few columns), each chunk's
sum and, by Welford's one-pass method, its squared deviations come from one read and are
combined exactly (``_split_variance``). ``std`` is the variance's square root. Everything the
scheduler can fuse into one kernel.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from fusebackend import ir, sizevars
from fusebackend.ir import Constant, cast, op
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_composite

aten = torch.ops.aten


def _dims(x: TensorArg, dim: Any) -> list[int]:
    rank = len(x.sizes)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if rank == 0:
        return []
    return sorted({d % rank for d in dim})


def _out_strides(b: GraphLowering, k: int = 0) -> tuple[int, ...]:
    meta = b.out_meta if isinstance(b.out_meta, torch.Tensor) else b.out_meta[k]
    return tuple(meta.stride())


def _out_dtype(b: GraphLowering, k: int = 0) -> torch.dtype:
    meta = b.out_meta if isinstance(b.out_meta, torch.Tensor) else b.out_meta[k]
    return meta.dtype


def _reduce_simple(b: GraphLowering, x: TensorArg, dim: Any, keepdim: bool, rtype: str) -> TensorArg:
    out_dtype = _out_dtype(b)
    acc = torch.bool if rtype == "any" else ir.compute_dtype(out_dtype if rtype in ("sum", "prod") else x.dtype)
    return b.reduce(x, _dims(x, dim), keepdim, rtype, out_dtype, lambda ctx: ctx.value(x, acc), _out_strides(b))


@register_composite(aten.sum.dim_IntList, aten.sum.default, symbolic=True)
def sum_(b: GraphLowering, self: TensorArg, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> TensorArg:
    return _reduce_simple(b, self, dim, keepdim, "sum")


@register_composite(aten.prod.dim_int, aten.prod.default, symbolic=True)
def prod(b: GraphLowering, self: TensorArg, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> TensorArg:
    return _reduce_simple(b, self, dim, keepdim, "prod")


@register_composite(aten.amax.default, symbolic=True)
def amax(b: GraphLowering, self: TensorArg, dim: Any = (), keepdim: bool = False) -> TensorArg:
    return _reduce_simple(b, self, dim, keepdim, "max")


@register_composite(aten.amin.default, symbolic=True)
def amin(b: GraphLowering, self: TensorArg, dim: Any = (), keepdim: bool = False) -> TensorArg:
    return _reduce_simple(b, self, dim, keepdim, "min")


@register_composite(aten.any.dim, aten.any.dims, aten.any.default, symbolic=True)
def any_(b: GraphLowering, self: TensorArg, dim: Any = None, keepdim: bool = False) -> TensorArg:
    return _reduce_simple(b, self, dim, keepdim, "any")


@register_composite(aten.all.dim, aten.all.dims, aten.all.default, symbolic=True)
def all_(b: GraphLowering, self: TensorArg, dim: Any = None, keepdim: bool = False) -> TensorArg:
    # all(x) = not any(not x)
    dims = _dims(self, dim)
    out_dtype = _out_dtype(b)
    sizes = _reduced_sizes(self.sizes, dims, keepdim)
    none_false = b.reduce(
        self, dims, keepdim, "any", torch.bool,
        lambda ctx: op("logical_not", ctx.value(self, torch.bool), dtype=torch.bool),
    )
    return b.pointwise(sizes, out_dtype, lambda ctx: cast(op("logical_not", ctx.value(none_false, torch.bool), dtype=torch.bool), out_dtype), _out_strides(b))


def _reduced_sizes(sizes: Sequence[int], dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if d in dims else s for d, s in enumerate(sizes))
    return tuple(s for d, s in enumerate(sizes) if d not in dims)


def _arg_reduce(b: GraphLowering, x: TensorArg, dim: Any, keepdim: bool, rtype: str, k: int = 0) -> TensorArg:
    acc = ir.compute_dtype(x.dtype)
    return b.reduce(x, _dims(x, dim), keepdim, rtype, torch.int64, lambda ctx: ctx.value(x, acc), _out_strides(b, k))


@register_composite(aten.argmax.default)
def argmax(b: GraphLowering, self: TensorArg, dim: Any = None, keepdim: bool = False) -> TensorArg:
    if self.dtype == torch.bool:
        raise Unsupported("argmax of bool")
    return _arg_reduce(b, self, dim, keepdim, "argmax")


@register_composite(aten.argmin.default)
def argmin(b: GraphLowering, self: TensorArg, dim: Any = None, keepdim: bool = False) -> TensorArg:
    if self.dtype == torch.bool:
        raise Unsupported("argmin of bool")
    return _arg_reduce(b, self, dim, keepdim, "argmin")


def _extreme(kind: str) -> None:
    """torch.max / torch.min: over one dim (values and indices) and over everything."""

    def with_indices(b: GraphLowering, self: TensorArg, dim: int, keepdim: bool = False) -> tuple[TensorArg, TensorArg]:
        if self.dtype == torch.bool:
            raise Unsupported(f"{kind}.dim of bool")
        acc = ir.compute_dtype(self.dtype)
        values = b.reduce(self, _dims(self, dim), keepdim, kind, self.dtype, lambda ctx: ctx.value(self, acc), _out_strides(b, 0))
        return values, _arg_reduce(b, self, dim, keepdim, f"arg{kind}", 1)

    def everything(b: GraphLowering, self: TensorArg) -> TensorArg:
        if self.dtype == torch.bool:
            raise Unsupported(f"{kind} of bool")
        return _reduce_simple(b, self, None, False, kind)

    packet = getattr(aten, kind)
    register_composite(packet.dim)(with_indices)
    register_composite(packet.default)(everything)


_extreme("max")
_extreme("min")


@register_composite(aten.mean.dim, aten.mean.default, symbolic=True)
def mean(b: GraphLowering, self: TensorArg, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> TensorArg:
    out_dtype = _out_dtype(b)
    if not out_dtype.is_floating_point:
        raise Unsupported("mean with an integer result")
    return _mean(b, self, _dims(self, dim), keepdim, out_dtype, _out_strides(b))


def _mean(
    b: GraphLowering, x: TensorArg, dims: list[int], keepdim: bool, out_dtype: torch.dtype,
    strides: tuple[int, ...] | None,
) -> TensorArg:
    acc = ir.compute_dtype(out_dtype)
    count = math.prod(x.sizes[d] for d in dims) if x.sizes else 1
    total = b.reduce(x, dims, keepdim, "sum", acc, lambda ctx: ctx.value(x, acc))
    scale = _reciprocal(count, 0, acc, math.nan)
    return b.pointwise(
        _reduced_sizes(x.sizes, dims, keepdim), out_dtype,
        lambda ctx: op("mul", ctx.value(total, acc), scale), strides,
    )


def _reciprocal(count: Any, correction: float, acc: torch.dtype, at_zero: float) -> ir.Expr:
    """``1 / (count - correction)`` (``at_zero`` where that is not positive) as a value of
    ``acc``: a constant, or over a symbolic count computed in the kernel from it."""
    if not sizevars.symbolic([count]):
        denom = max(count - correction, 0)
        return Constant(1.0 / denom if denom else at_zero, acc)
    if correction != int(correction) or not sizevars.known_le(int(correction) + 1, count):
        raise sizevars.NotSymbolic(f"1 / ({count} - {correction}): not known to be positive")
    return op("truediv", Constant(1.0, acc), cast(ir.IndexValue(count - int(correction), torch.int64), acc))


def _variance(
    b: GraphLowering, x: TensorArg, dims: list[int], correction: float, keepdim: bool,
    out_dtype: torch.dtype, strides: tuple[int, ...] | None, mean_strides: tuple[int, ...] | None = None,
    want_mean: bool = False,
) -> tuple[TensorArg, TensorArg | None]:
    if not x.dtype.is_floating_point:
        raise Unsupported("variance of an integer tensor")
    acc = ir.compute_dtype(out_dtype)
    count = math.prod(x.sizes[d] for d in dims) if x.sizes else 1
    sizes = _reduced_sizes(x.sizes, dims, keepdim)
    split = _split_variance(b, x, dims, count, acc)
    if split is not None:
        m2, total = (_reshaped(t, sizes) for t in split)
        mean = lambda ctx: op("mul", ctx.value(total, acc), _reciprocal(count, 0, acc, math.nan))  # noqa: E731
    else:
        # the mean kept with keepdim so that it broadcasts back over the reduced dims
        mean_kept = _mean(b, x, dims, True, acc, None)

        def deviation_squared(ctx: LoweringContext) -> ir.Expr:
            d = op("sub", ctx.value(x, acc), ctx.value(mean_kept, acc))
            return op("mul", d, d)

        m2 = b.reduce(x, dims, keepdim, "sum", acc, deviation_squared)
        mean = lambda ctx: ctx.value(_reshaped(mean_kept, sizes), acc)  # noqa: E731
    scale = _reciprocal(count, correction, acc, math.inf)
    var = b.pointwise(sizes, out_dtype, lambda ctx: op("mul", ctx.value(m2, acc), scale), strides)
    mean_out = b.pointwise(sizes, out_dtype, mean, mean_strides) if want_mean else None
    return var, mean_out


def _split_variance(
    b: GraphLowering, x: TensorArg, dims: list[int], count: int, acc: torch.dtype,
) -> tuple[TensorArg, TensorArg] | None:
    """(m2, sum) of ``x`` over ``dims`` (keepdim off) in one pass over ``x``, where the reduction
    is split into chunks of equal length; None where it is not.

    Phase 1 reads each chunk once for its sum s_c and, by Welford's method, its m2_c (squared
    deviations from the chunk's own mean). Phase 2 combines the n chunks of length k exactly:
    with the mean mu = sum_c s_c / count, m2 = sum_c (m2_c + k * (s_c / k - mu)^2). The two-pass
    form below would read ``x`` twice from memory, once for the mean and once for the deviations.
    """
    value = lambda ctx: ctx.value(x, acc)  # noqa: E731
    sums = b.split_partials(x, dims, "sum", value)
    if sums is None:
        return None
    s_part, chunk, axes = sums
    m2s = b.split_partials(x, dims, "m2", value)
    assert m2s is not None
    m2_part = m2s[0]

    def combined(ctx: LoweringContext) -> ir.Expr:
        mean = op("mul", ctx.value(total_kept, acc), Constant(1.0 / count, acc))
        d = op("sub", op("mul", ctx.value(s_part, acc), Constant(1.0 / chunk, acc)), mean)
        return op("add", ctx.value(m2_part, acc), op("mul", Constant(float(chunk), acc), op("mul", d, d)))

    origin = b.origin
    b.origin = origin + " (split, phase 2)"
    try:
        total_kept = b.reduce(s_part, axes, True, "sum", acc, lambda ctx: ctx.value(s_part, acc))
        m2 = b.reduce(s_part, axes, False, "sum", acc, combined)
    finally:
        b.origin = origin
    return m2, _reshaped(total_kept, tuple(m2.sizes))


def _reshaped(arg: TensorArg, sizes: tuple[int, ...]) -> TensorArg:
    """The keepdim mean viewed without the kept size-1 dims (a view: same contiguous buffer)."""
    if tuple(arg.sizes) == sizes:
        return arg
    view = ir.View(arg.view.buffer, sizes, _contig(sizes), arg.view.offset)
    return TensorArg(view, torch.empty([sizevars.size_hint(s) for s in sizes], dtype=arg.dtype, device="meta"))


def _contig(sizes: tuple[int, ...]) -> tuple[int, ...]:
    from fusebackend.indexing import contiguous_strides

    return contiguous_strides(sizes)


def _correction(correction: Any, unbiased: Any = None) -> float:
    if correction is None:
        return 1.0 if unbiased is None or unbiased else 0.0
    return float(correction)


@register_composite(aten.var.correction, symbolic=True)
def var(b: GraphLowering, self: TensorArg, dim: Any = None, correction: Any = None, keepdim: bool = False) -> TensorArg:
    v, _ = _variance(b, self, _dims(self, dim), _correction(correction), keepdim, _out_dtype(b), _out_strides(b))
    return v


@register_composite(aten.var_mean.correction, symbolic=True)
def var_mean(
    b: GraphLowering, self: TensorArg, dim: Any = None, correction: Any = None, keepdim: bool = False
) -> tuple[TensorArg, TensorArg]:
    v, m = _variance(
        b, self, _dims(self, dim), _correction(correction), keepdim, _out_dtype(b, 0),
        _out_strides(b, 0), _out_strides(b, 1), want_mean=True,
    )
    assert m is not None
    return v, m


@register_composite(aten.std.correction, symbolic=True)
def std(b: GraphLowering, self: TensorArg, dim: Any = None, correction: Any = None, keepdim: bool = False) -> TensorArg:
    out_dtype = _out_dtype(b)
    acc = ir.compute_dtype(out_dtype)
    v, _ = _variance(b, self, _dims(self, dim), _correction(correction), keepdim, acc, None)
    return b.pointwise(v.sizes, out_dtype, lambda ctx: op("sqrt", ctx.value(v, acc)), _out_strides(b))


@register_composite(aten.linalg_vector_norm.default, symbolic=True)
def vector_norm(
    b: GraphLowering, self: TensorArg, ord: Any = 2, dim: Any = None, keepdim: bool = False, dtype: Any = None
) -> TensorArg:
    """sum(|x|^p)^(1/p); the max or min of |x| for p = +-inf; the count of nonzeros for p = 0."""
    out_dtype = _out_dtype(b)
    if not out_dtype.is_floating_point or not self.dtype.is_floating_point:
        raise Unsupported("vector norm of a non-float tensor")
    acc = ir.compute_dtype(out_dtype)
    dims = _dims(self, dim)
    p = float(ord)
    sizes = _reduced_sizes(self.sizes, dims, keepdim)
    magnitude = lambda ctx: op("abs", ctx.value(self, acc))  # noqa: E731
    if math.isinf(p):
        rtype = "max" if p > 0 else "min"
        return b.reduce(self, dims, keepdim, rtype, out_dtype, magnitude, _out_strides(b))
    if p == 0:
        nonzero = lambda ctx: cast(op("ne", ctx.value(self, acc), Constant(0.0, acc), dtype=torch.bool), acc)  # noqa: E731
        return b.reduce(self, dims, keepdim, "sum", out_dtype, nonzero, _out_strides(b))

    def powered(ctx: LoweringContext) -> ir.Expr:
        m = magnitude(ctx)
        if p == 1:
            return m
        if p == 2:
            return op("mul", m, m)
        return op("exp2", op("mul", Constant(p, acc), op("log2", m)))

    total = b.reduce(self, dims, keepdim, "sum", acc, powered)

    def root(ctx: LoweringContext) -> ir.Expr:
        s = ctx.value(total, acc)
        if p == 1:
            return s
        if p == 2:
            return op("sqrt", s)
        return op("exp2", op("mul", Constant(1.0 / p, acc), op("log2", s)))

    return b.pointwise(sizes, out_dtype, root, _out_strides(b))
