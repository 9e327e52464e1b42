"""Lowerings of the special math functions: inverse trigonometric and hyperbolic functions, error
and gamma functions, and the sign and NaN-aware comparisons (copysign, signbit, fmax, fmin).

Those with a closed form in other IR ops are composed here (cosh, atanh, asin and acos through
atan, fmax, fmin, round with decimals); those that need a polynomial fit or several branches are
IR ops rendered as device functions (``kernels/math_helpers.py``). The fits are accurate to fp32:
where the compute dtype is fp64 such an op raises ``Unsupported`` and stays an ATen call. The
output dtype comes from ATen's meta function, so integer inputs of a float function give fp32, and
fp16/bf16 are computed in fp32, as everywhere (``lowering/pointwise.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fusebackend import ir
from fusebackend.ir import Constant, Expr, op
from fusebackend.lowering.graph import LoweringContext
from fusebackend.lowering.pointwise import round_half_even
from fusebackend.lowering.registry import Unsupported, register_pointwise

aten = torch.ops.aten


def _float_operands(ctx: LoweringContext, *args: Any, fp64: bool = False) -> list[Expr]:
    """Arguments in the op's float compute dtype; fp64 only where the op is exact (``fp64``)."""
    if not ctx.dtype.is_floating_point:
        raise Unsupported(f"float function with {ctx.dtype} output")
    dtype = ir.compute_dtype(ctx.dtype)
    if dtype == torch.float64 and not fp64:
        raise Unsupported("float64: the device function is accurate to fp32 only")
    return [ctx.value(a, dtype) for a in args]


def _const(value: float, like: Expr) -> Expr:
    return Constant(value, like.dtype)


def _helper(name: str, *aten_ops: Any, fp64: bool = False) -> None:
    """Register ``aten_ops`` as the IR op ``name`` of their float operands."""

    def lower(ctx: LoweringContext, **args: Any) -> Expr:
        return op(name, *_float_operands(ctx, *args.values(), fp64=fp64))

    lower.__name__ = f"lower_{name}"
    register_pointwise(*aten_ops)(lower)


# Tensor arguments only (their schemas: self, or self and other), each an IR op of the same name.
_helper("atan", aten.atan.default)
_helper("atan2", aten.atan2.default)
_helper("sinh", aten.sinh.default)
_helper("asinh", aten.asinh.default)
_helper("acosh", aten.acosh.default)
_helper("erfc", aten.erfc.default)
_helper("erfcx", aten.special_erfcx.default)
_helper("erfinv", aten.erfinv.default)
_helper("ndtri", aten.special_ndtri.default)
_helper("lgamma", aten.lgamma.default)
_helper("digamma", aten.digamma.default)
_helper("hypot", aten.hypot.default, fp64=True)


# ------------------------------------------------------------------------ composed in IR ops


@register_pointwise(aten.asin.default)
def asin(ctx: LoweringContext, self: Any) -> Expr:
    # atan(x / sqrt(1 - x^2)), with 1 - x^2 as (1 - x)(1 + x): exact near +-1, where it matters
    (x,) = _float_operands(ctx, self)
    one = _const(1.0, x)
    return op("atan", op("truediv", x, op("sqrt", op("mul", op("sub", one, x), op("add", one, x)))))


@register_pointwise(aten.acos.default)
def acos(ctx: LoweringContext, self: Any) -> Expr:
    # 2 atan(sqrt((1 - x) / (1 + x))): keeps its digits near x = 1, where pi/2 - asin(x) cancels
    (x,) = _float_operands(ctx, self)
    one = _const(1.0, x)
    ratio = op("truediv", op("sub", one, x), op("add", one, x))
    return op("mul", _const(2.0, x), op("atan", op("sqrt", ratio)))


@register_pointwise(aten.cosh.default)
def cosh(ctx: LoweringContext, self: Any) -> Expr:
    # (e + 1/e) / 2 with e = exp(|x|) (no cancellation); past 88, where e overflows and cosh does
    # not yet, (exp(|x|/2) / 2) exp(|x|/2).
    (x,) = _float_operands(ctx, self, fp64=True)
    half = _const(0.5, x)
    ax = op("abs", x)
    e = op("exp", ax)
    near = op("add", op("mul", half, e), op("truediv", half, e))
    h = op("exp", op("mul", half, ax))
    far = op("mul", op("mul", half, h), h)
    return op("where", op("lt", ax, _const(88.0, x), dtype=torch.bool), near, far)


@register_pointwise(aten.atanh.default)
def atanh(ctx: LoweringContext, self: Any) -> Expr:
    # log((1 + a) / (1 - a)) / 2 as log1p(2a / (1 - a)) / 2 for a = |x|, with x's sign: exact
    # near 0 and near +-1 (a negative argument of log1p near -1 would cancel); inf at 1, NaN
    # beyond (log1p of a number below -1)
    (x,) = _float_operands(ctx, self)
    a = op("abs", x)
    ratio = op("truediv", op("mul", _const(2.0, x), a), op("sub", _const(1.0, x), a))
    return op("copysign", op("mul", _const(0.5, x), op("log1p", ratio)), x)


@register_pointwise(aten.round.decimals)
def round_decimals(ctx: LoweringContext, self: Any, decimals: int = 0) -> Expr:
    # As ATen: round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d for negative d, with 10^|d|
    # rounded once to the compute dtype (fp32 for half types too, as ATen's CPU kernel).
    (x,) = _float_operands(ctx, self, fp64=True)
    if decimals == 0:
        return round_half_even(x)
    scale = _const(float(10 ** abs(decimals)), x)
    if decimals > 0:
        return op("truediv", round_half_even(op("mul", x, scale)), scale)
    return op("mul", round_half_even(op("truediv", x, scale)), scale)


# -------------------------------------------------------------------- signs and NaN-aware max


@register_pointwise(aten.signbit.default)
def signbit(ctx: LoweringContext, self: Any) -> Expr:
    if self.dtype == torch.bool:
        return Constant(False, torch.bool)
    x = ctx.value(self, ir.compute_dtype(self.dtype))
    if not x.dtype.is_floating_point:
        return op("lt", x, Constant(0, x.dtype), dtype=torch.bool)
    return op("signbit", x, dtype=torch.bool)


@register_pointwise(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    x, y = _float_operands(ctx, self, other, fp64=True)
    if isinstance(y, Constant):  # the sign is known now: |x| or -|x|
        magnitude = op("abs", x)
        return op("neg", magnitude) if math.copysign(1.0, y.value) < 0 else magnitude
    return op("copysign", x, y)


def _nan_aware(name: str, keep: str, bool_op: str, aten_op: Any) -> None:
    # fmax/fmin: a NaN loses to a number; between equal values (+0 and -0) the first wins, as in
    # eager on the CPU. Integers have no NaN: maximum/minimum.
    def lower(ctx: LoweringContext, self: Any, other: Any) -> Expr:
        if ctx.dtype == torch.bool:
            return op(bool_op, ctx.value(self, torch.bool), ctx.value(other, torch.bool), dtype=torch.bool)
        dtype = ir.compute_dtype(ctx.dtype)
        x, y = ctx.value(self, dtype), ctx.value(other, dtype)
        if not dtype.is_floating_point:
            return op(name, x, y)
        first = op("logical_or", op(keep, x, y, dtype=torch.bool), op("isnan", y, dtype=torch.bool),
                   dtype=torch.bool)
        return op("where", first, x, y)

    lower.__name__ = f"lower_f{name}"
    register_pointwise(aten_op)(lower)


_nan_aware("maximum", "ge", "logical_or", aten.fmax.default)
_nan_aware("minimum", "le", "logical_and", aten.fmin.default)
