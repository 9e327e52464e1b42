"""Lowerings of the special math functions and their kin: inverse trigonometric and hyperbolic
functions, error, gamma and modified Bessel functions; sign and NaN-aware comparisons (copysign,
signbit, fmax, fmin); float bits (nextafter, ldexp, frexp); integer shifts, gcd and lcm.

Those with a closed form in other IR ops are composed here (cosh, atanh, asin and acos through
atan, fmax, fmin, round with decimals, spherical_bessel_j0, angle, lcm through gcd); those that
need a polynomial fit, branches or bit manipulation are IR ops rendered as device functions
(``kernels/math_helpers.py``, ``kernels/special_helpers.py``). The fits are accurate to fp32:
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
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.pointwise import remainder, round_half_even
from fusebackend.lowering.registry import POINTWISE, Unsupported, register_composite, register_elementwise

aten = torch.ops.aten
prims = torch.ops.prims


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


def _unary(name: str, *aten_ops: Any) -> None:
    """Register ``aten_ops`` (schema: ``self``) as the IR op ``name`` of their float operand."""

    def lower(ctx: LoweringContext, self: Any) -> Expr:
        return op(name, *_float_operands(ctx, self))

    lower.__name__ = f"lower_{name}"
    register_elementwise(*aten_ops)(lower)


for _name, _op in [
    ("atan", aten.atan.default), ("sinh", aten.sinh.default), ("asinh", aten.asinh.default),
    ("acosh", aten.acosh.default), ("erfc", aten.erfc.default), ("erfcx", aten.special_erfcx.default),
    ("erfinv", aten.erfinv.default), ("ndtri", aten.special_ndtri.default), ("lgamma", aten.lgamma.default),
    ("digamma", aten.digamma.default), ("i0", aten.i0.default), ("i0e", aten.special_i0e.default),
    ("i1", aten.special_i1.default), ("i1e", aten.special_i1e.default),
]:
    _unary(_name, _op)


@register_elementwise(aten.atan2.default)
def atan2(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    return op("atan2", *_float_operands(ctx, self, other))


@register_elementwise(aten.hypot.default)
def hypot(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    return op("hypot", *_float_operands(ctx, self, other, fp64=True))


@register_elementwise(aten.polygamma.default, aten.special_polygamma.default)
def polygamma(ctx: LoweringContext, n: int, self: Any) -> Expr:
    names = {0: "digamma", 1: "trigamma"}
    if n not in names:
        raise Unsupported(f"polygamma of order {n} (only digamma and trigamma)")
    return op(names[n], *_float_operands(ctx, self))


# ------------------------------------------------------------------------ composed in IR ops


@register_elementwise(aten.asin.default)
def asin(ctx: LoweringContext, self: Any) -> Expr:
    # atan(x / sqrt(1 - x^2)), with 1 - x^2 as (1 - x)(1 + x): exact near +-1, where it matters
    (x,) = _float_operands(ctx, self)
    one = _const(1.0, x)
    return op("atan", op("truediv", x, op("sqrt", op("mul", op("sub", one, x), op("add", one, x)))))


@register_elementwise(aten.acos.default)
def acos(ctx: LoweringContext, self: Any) -> Expr:
    # 2 atan(sqrt((1 - x) / (1 + x))): keeps its digits near x = 1, where pi/2 - asin(x) cancels
    (x,) = _float_operands(ctx, self)
    one = _const(1.0, x)
    ratio = op("truediv", op("sub", one, x), op("add", one, x))
    return op("mul", _const(2.0, x), op("atan", op("sqrt", ratio)))


@register_elementwise(aten.cosh.default)
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


@register_elementwise(aten.atanh.default)
def atanh(ctx: LoweringContext, self: Any) -> Expr:
    # log((1 + a) / (1 - a)) / 2 as log1p(2a / (1 - a)) / 2 for a = |x|, with x's sign: exact
    # near 0 and near +-1 (a negative argument of log1p near -1 would cancel); inf at 1, NaN
    # beyond (log1p of a number below -1)
    (x,) = _float_operands(ctx, self)
    a = op("abs", x)
    ratio = op("truediv", op("mul", _const(2.0, x), a), op("sub", _const(1.0, x), a))
    return op("copysign", op("mul", _const(0.5, x), op("log1p", ratio)), x)


@register_elementwise(aten.round.decimals)
def round_decimals(ctx: LoweringContext, self: Any, decimals: int = 0) -> Expr:
    # As ATen: round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d for negative d, with 10^|d|
    # rounded once to the compute dtype (fp32 for half types too, as ATen's CPU kernel).
    (x,) = _float_operands(ctx, self, fp64=True)
    if decimals == 0:
        return round_half_even(x)
    if abs(decimals) > 300:  # (10^|d| past the double range; fp32 and fp64 give inf or 0 long before)
        raise Unsupported(f"round to {decimals} decimals")
    # 10^|d| as ATen has it: the double, rounded to the compute dtype (inf past fp32's range)
    scale = _const(torch.tensor(float(10 ** abs(decimals)), dtype=torch.float64).to(x.dtype).item(), x)
    if decimals > 0:
        return op("truediv", round_half_even(op("mul", x, scale)), scale)
    return op("mul", round_half_even(op("truediv", x, scale)), scale)


# -------------------------------------------------------------------- signs and NaN-aware max


@register_elementwise(aten.signbit.default)
def signbit(ctx: LoweringContext, self: Any) -> Expr:
    if self.dtype == torch.bool:
        return Constant(False, torch.bool)
    x = ctx.value(self, ir.compute_dtype(self.dtype))
    if not x.dtype.is_floating_point:
        return op("lt", x, Constant(0, x.dtype), dtype=torch.bool)
    return op("signbit", x, dtype=torch.bool)


@register_elementwise(aten.copysign.Tensor, aten.copysign.Scalar)
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
    register_elementwise(aten_op)(lower)


_nan_aware("maximum", "ge", "logical_or", aten.fmax.default)
_nan_aware("minimum", "le", "logical_and", aten.fmin.default)


# --------------------------------------------------------------------- more float functions


@register_elementwise(aten.special_spherical_bessel_j0.default)
def spherical_bessel_j0(ctx: LoweringContext, x: Any) -> Expr:
    # sin(x) / x, and its series below 1/2 (through x^10, error 4e-14) where the quotient would
    # lose digits; 0 at +-inf
    (v,) = _float_operands(ctx, x, fp64=True)
    s = op("mul", v, v)
    series = _const(-1.0 / 39916800, v)
    for k in (9, 7, 5, 3):
        series = op("add", op("mul", series, s), _const((-1.0) ** (k // 2) / math.factorial(k), v))
    series = op("add", op("mul", series, s), _const(1.0, v))
    near = op("lt", op("abs", v), _const(0.5, v), dtype=torch.bool)
    value = op("where", near, series, op("truediv", op("sin", v), v))
    return op("where", op("isinf", v, dtype=torch.bool), _const(0.0, v), value)


@register_elementwise(aten.angle.default)
def angle(ctx: LoweringContext, self: Any) -> Expr:
    # of a real number: pi below zero, 0 otherwise (-0.0 included), NaN stays NaN
    if self.dtype.is_complex:
        raise Unsupported("angle of a complex tensor")
    (x,) = _float_operands(ctx, self, fp64=True)
    pi = op("where", op("lt", x, _const(0.0, x), dtype=torch.bool), _const(math.pi, x), _const(0.0, x))
    return op("where", op("isnan", x, dtype=torch.bool), x, pi)


@register_elementwise(aten.ldexp.Tensor)
def ldexp(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    # x * 2^e rounded once, with no overflow or underflow on the way (ldexp(1e-30, 129) is finite)
    if not isinstance(other, TensorArg) or other.dtype.is_floating_point or other.dtype == torch.bool:
        raise Unsupported("ldexp with a float exponent")
    (x,) = _float_operands(ctx, self)
    return op("ldexp", x, ctx.value(other, torch.int64))


@register_composite(aten.frexp.Tensor)
def frexp(b: GraphLowering, self: TensorArg) -> tuple[TensorArg, TensorArg]:
    # two nodes over the same input (one kernel once fused): mantissa in self's dtype, int32 exponent
    if self.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise Unsupported(f"frexp of {self.dtype}")
    mantissa, exponent = b.out_meta
    m = b.pointwise(self.sizes, self.dtype, lambda ctx: op("frexp_mantissa", ctx.value(self, torch.float32)),
                    mantissa.stride())
    e = b.pointwise(self.sizes, torch.int32,
                    lambda ctx: op("frexp_exponent", ctx.value(self, torch.float32), dtype=torch.int32),
                    exponent.stride())
    return m, e


@register_elementwise(aten.nextafter.default)
def nextafter(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    if ctx.dtype not in (torch.float32, torch.float64):
        raise Unsupported(f"nextafter in {ctx.dtype} (steps in that type's own bits)")
    return op("nextafter", ctx.value(self, ctx.dtype), ctx.value(other, ctx.dtype))


@register_elementwise(prims.scalar_tensor.default)
def prims_scalar_tensor(ctx: LoweringContext, s: Any, dtype: Any = None, device: Any = None) -> Expr:
    if device is not None and torch.device(device) != ctx.device:
        raise Unsupported("constant on another device")
    return Constant(ir._convert_scalar(s, ctx.dtype), ctx.dtype)


# A scalar first argument (``5 % t``, ``3 & t``): the same lowerings as for two tensors.
register_elementwise(aten.remainder.Scalar_Tensor)(remainder)
for _packet in (aten.bitwise_and, aten.bitwise_or, aten.bitwise_xor):
    register_elementwise(_packet.Scalar_Tensor)(POINTWISE[_packet.Tensor])


# --------------------------------------------------------------------------------- integers


def _integer_operands(ctx: LoweringContext, *args: Any) -> list[Expr]:
    if ctx.dtype == torch.bool or ctx.dtype.is_floating_point or ctx.dtype.is_complex:
        raise Unsupported(f"integer op with {ctx.dtype} output")
    dtype = ir.compute_dtype(ctx.dtype)
    return [ctx.value(a, dtype) for a in args]


def _shift(ctx: LoweringContext, self: Any, other: Any, left: bool) -> Expr:
    # Shifts by a negative amount or by the bit width or more give what ATen gives: 0 for a left
    # shift, the sign (0 or -1) for a right shift. Small types shift in int32: the bits a left
    # shift moves past the type's width are dropped when the result is stored.
    a, b = _integer_operands(ctx, self, other)
    width = a.dtype.itemsize * 8
    zero = Constant(0, a.dtype)
    if isinstance(b, Constant):
        if 0 <= b.value < width:
            return op("lshift" if left else "rshift", a, b)
        return zero if left else op("rshift", a, Constant(width - 1, a.dtype))
    bad = op("logical_or", op("lt", b, zero, dtype=torch.bool),
             op("ge", b, Constant(width, a.dtype), dtype=torch.bool), dtype=torch.bool)
    if left:
        return op("where", bad, zero, op("lshift", a, op("where", bad, zero, b)))
    return op("rshift", a, op("where", bad, Constant(width - 1, a.dtype), b))


@register_elementwise(aten.__lshift__.Scalar, aten.__lshift__.Tensor, aten.bitwise_left_shift.Tensor,
                    aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor)
def left_shift(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    return _shift(ctx, self, other, left=True)


@register_elementwise(aten.__rshift__.Scalar, aten.__rshift__.Tensor, aten.bitwise_right_shift.Tensor,
                    aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor)
def right_shift(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    return _shift(ctx, self, other, left=False)


@register_elementwise(aten.gcd.default)
def gcd(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    return op("gcd", *_integer_operands(ctx, self, other))


@register_elementwise(aten.lcm.default)
def lcm(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    # |a / gcd(a, b) * b|, and 0 where both are 0
    a, b = _integer_operands(ctx, self, other)
    zero, one = Constant(0, a.dtype), Constant(1, a.dtype)
    g = op("gcd", a, b)
    none = op("eq", g, zero, dtype=torch.bool)
    multiple = op("abs", op("mul", op("int_truncdiv", a, op("where", none, one, g)), b))
    return op("where", none, zero, multiple)
