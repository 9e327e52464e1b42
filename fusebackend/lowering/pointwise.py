"""Lowerings of pointwise ATen ops to expression bodies.

Conventions: the output's dtype comes from ATen's meta function (``ctx.dtype``); arithmetic runs in
``ir.compute_dtype`` of it (fp16/bf16 in fp32, small ints in int32) and the graph lowering casts
the result to the output dtype. Comparisons promote their operands the way ATen does
(``ctx.result_type``). Ops with an argument combination we do not handle raise ``Unsupported``
and stay ATen calls.
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch
import torch._prims  # noqa: F401  (registers the prims, fma among them)

from fusebackend import ir, sizevars
from fusebackend.ir import Constant, Expr, cast, op
from fusebackend.lowering.graph import LoweringContext
from fusebackend.lowering.registry import Unsupported, register_elementwise, register_pointwise
from fusebackend.lowering.values import size_value

aten = torch.ops.aten
prims = torch.ops.prims


def _compute(ctx: LoweringContext) -> torch.dtype:
    return ir.compute_dtype(ctx.dtype)


def _operands(ctx: LoweringContext, *args: Any) -> list[Expr]:
    dtype = _compute(ctx)
    return [ctx.value(a, dtype) for a in args]


def _scaled(ctx: LoweringContext, value: Expr, alpha: Any) -> Expr:
    if alpha is None or alpha == 1:
        return value
    return op("mul", value, ctx.value(alpha, value.dtype))


# ----------------------------------------------------------------------------- arithmetic


@register_elementwise(aten.add.Tensor, aten.add.Scalar)
def add(ctx: LoweringContext, self: Any, other: Any, alpha: Any = 1) -> Expr:
    a, b = _operands(ctx, self, other)
    return op("add", a, _scaled(ctx, b, alpha))


@register_elementwise(aten.sub.Tensor, aten.sub.Scalar)
def sub(ctx: LoweringContext, self: Any, other: Any, alpha: Any = 1) -> Expr:
    a, b = _operands(ctx, self, other)
    return op("sub", a, _scaled(ctx, b, alpha))


@register_elementwise(torch.ops.prims.fma.default)
def fma(ctx: LoweringContext, a: Any, b: Any, c: Any) -> Expr:
    # a * b + c (lerp's decomposition, in an optimizer's update); rounded twice, where the
    # prim rounds once: a unit in the last place at most, in the compute dtype
    dtype = _compute(ctx)
    return op("add", op("mul", ctx.value(a, dtype), ctx.value(b, dtype)), ctx.value(c, dtype))


@register_elementwise(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx: LoweringContext, self: Any, other: Any, alpha: Any = 1) -> Expr:
    a, b = _operands(ctx, self, other)
    return op("sub", b, _scaled(ctx, a, alpha))


@register_elementwise(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    if ctx.dtype == torch.bool:
        return op("logical_and", *(ctx.value(x, torch.bool) for x in (self, other)))
    return op("mul", *_operands(ctx, self, other))


def _floor_div(a: Expr, b: Expr) -> Expr:
    if a.dtype.is_floating_point:
        return op("floor", op("truediv", a, b))
    q = op("int_truncdiv", a, b)
    adjust = _signs_differ(op("int_truncmod", a, b), b)
    return op("sub", q, cast(adjust, a.dtype))


def _signs_differ(r: Expr, b: Expr) -> Expr:
    """A nonzero truncated remainder whose sign differs from the divisor's (floor needs a step)."""
    zero = Constant(0, r.dtype)
    return op(
        "logical_and",
        op("ne", r, zero, dtype=torch.bool),
        op("ne", op("lt", r, zero, dtype=torch.bool), op("lt", b, zero, dtype=torch.bool), dtype=torch.bool),
        dtype=torch.bool,
    )


def _trunc(x: Expr) -> Expr:
    if not x.dtype.is_floating_point:
        return x
    return op("where", op("lt", x, Constant(0.0, x.dtype), dtype=torch.bool), op("ceil", x), op("floor", x))


# true_divide is div without a rounding mode; it reaches the graphs where Dynamo turns arithmetic on
# a float it did not specialize into tensor ops (``dynamic=True``: a module's float attributes)
@register_elementwise(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode,
                      aten.true_divide.Tensor, aten.true_divide.Scalar)
def div(ctx: LoweringContext, self: Any, other: Any, rounding_mode: str | None = None) -> Expr:
    a, b = _operands(ctx, self, other)
    if rounding_mode is None:
        return op("truediv", a, b)
    if rounding_mode == "trunc":
        return _trunc(op("truediv", a, b)) if a.dtype.is_floating_point else op("int_truncdiv", a, b)
    if rounding_mode == "floor":
        return _floor_div(a, b)
    raise Unsupported(f"rounding_mode={rounding_mode}")


@register_elementwise(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    return _floor_div(*_operands(ctx, self, other))


@register_elementwise(aten.remainder.Tensor, aten.remainder.Scalar)
def remainder(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    a, b = _operands(ctx, self, other)
    r = op("fmod", a, b) if a.dtype.is_floating_point else op("int_truncmod", a, b)
    return op("where", _signs_differ(r, b), op("add", r, b), r)


@register_elementwise(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    a, b = _operands(ctx, self, other)
    return op("fmod", a, b) if a.dtype.is_floating_point else op("int_truncmod", a, b)


@register_elementwise(aten.neg.default)
def neg(ctx: LoweringContext, self: Any) -> Expr:
    return op("neg", *_operands(ctx, self))


@register_elementwise(aten.abs.default)
def abs_(ctx: LoweringContext, self: Any) -> Expr:
    return op("abs", *_operands(ctx, self))


@register_elementwise(aten.reciprocal.default)
def reciprocal(ctx: LoweringContext, self: Any) -> Expr:
    (x,) = _operands(ctx, self)
    return op("truediv", Constant(1.0, x.dtype), x)


@register_elementwise(aten.sign.default, aten.sgn.default)
def sign(ctx: LoweringContext, self: Any) -> Expr:
    if ctx.dtype == torch.bool:
        return ctx.value(self, torch.bool)
    (x,) = _operands(ctx, self)
    zero = Constant(0, x.dtype)
    pos = cast(op("gt", x, zero, dtype=torch.bool), x.dtype)
    negative = cast(op("lt", x, zero, dtype=torch.bool), x.dtype)
    return op("sub", pos, negative)  # (0 < x) - (x < 0): sign(nan) is 0, as in eager


@register_elementwise(aten.maximum.default)
def maximum(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    if ctx.dtype == torch.bool:
        return op("logical_or", *(ctx.value(x, torch.bool) for x in (self, other)))
    return op("maximum", *_operands(ctx, self, other))


@register_elementwise(aten.minimum.default)
def minimum(ctx: LoweringContext, self: Any, other: Any) -> Expr:
    if ctx.dtype == torch.bool:
        return op("logical_and", *(ctx.value(x, torch.bool) for x in (self, other)))
    return op("minimum", *_operands(ctx, self, other))


def _clamp(x: Expr, lo: Expr | None, hi: Expr | None, nan_scalar_wins: bool = True) -> Expr:
    # A NaN input stays NaN (x < lo is false), and a NaN bound makes the result NaN, as in eager.
    # Except a NaN *scalar* bound on CUDA, which eager ignores there (CPU eager returns NaN):
    # ``nan_scalar_wins`` is False for CUDA graphs, so each device matches its own eager.
    for bound, cmp in ((lo, "lt"), (hi, "gt")):
        if bound is None:
            continue
        if isinstance(bound, Constant):
            if isinstance(bound.value, float) and math.isnan(bound.value):
                if not nan_scalar_wins:
                    continue
                return Constant(math.nan, x.dtype)
            x = op("where", op(cmp, x, bound, dtype=torch.bool), bound, x)
            continue
        take = op(cmp, x, bound, dtype=torch.bool)
        if bound.dtype.is_floating_point:
            take = op("logical_or", take, op("isnan", bound, dtype=torch.bool), dtype=torch.bool)
        x = op("where", take, bound, x)
    return x


@register_elementwise(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx: LoweringContext, self: Any, min: Any = None, max: Any = None) -> Expr:
    if ctx.dtype == torch.bool:
        raise Unsupported("clamp of bool")
    dtype = _compute(ctx)
    x = ctx.value(self, dtype)
    lo = None if min is None else ctx.value(min, dtype)
    hi = None if max is None else ctx.value(max, dtype)
    return _clamp(x, lo, hi, nan_scalar_wins=ctx.device.type != "cuda")


@register_elementwise(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(ctx: LoweringContext, self: Any, min: Any) -> Expr:
    return clamp(ctx, self, min=min)


@register_elementwise(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(ctx: LoweringContext, self: Any, max: Any) -> Expr:
    return clamp(ctx, self, max=max)


@register_elementwise(aten.hardtanh.default)
def hardtanh(ctx: LoweringContext, self: Any, min_val: Any = -1, max_val: Any = 1) -> Expr:
    return clamp(ctx, self, min=min_val, max=max_val)


@register_elementwise(aten.relu.default)
def relu(ctx: LoweringContext, self: Any) -> Expr:
    return clamp(ctx, self, min=0)


# --------------------------------------------------------------------------- float math


def _unary(name: str, *ops_: Any) -> None:
    def lower(ctx: LoweringContext, self: Any) -> Expr:
        if not ctx.dtype.is_floating_point:
            raise Unsupported(f"{name} with integer output")
        return op(name, *_operands(ctx, self))

    lower.__name__ = f"lower_{name}"
    register_elementwise(*ops_)(lower)


for _name, _op in [
    ("exp", aten.exp.default), ("exp2", aten.exp2.default), ("log", aten.log.default),
    ("log2", aten.log2.default), ("sqrt", aten.sqrt.default), ("rsqrt", aten.rsqrt.default),
    ("sin", aten.sin.default), ("cos", aten.cos.default), ("tanh", aten.tanh.default),
    ("sigmoid", aten.sigmoid.default), ("erf", aten.erf.default), ("log1p", aten.log1p.default),
    ("expm1", aten.expm1.default),
]:
    _unary(_name, _op)


@register_elementwise(aten.log10.default)
def log10(ctx: LoweringContext, self: Any) -> Expr:
    (x,) = _operands(ctx, self)
    return op("mul", op("log2", x), Constant(math.log10(2.0), x.dtype))


@register_elementwise(aten.tan.default)
def tan(ctx: LoweringContext, self: Any) -> Expr:
    (x,) = _operands(ctx, self)
    return op("truediv", op("sin", x), op("cos", x))


def _rounding(name: str, aten_op: Any) -> None:
    def lower(ctx: LoweringContext, self: Any) -> Expr:
        (x,) = _operands(ctx, self)
        if not x.dtype.is_floating_point:
            return x
        if name == "trunc":
            return _trunc(x)
        return op(name, x)

    lower.__name__ = f"lower_{name}"
    register_elementwise(aten_op)(lower)


_rounding("floor", aten.floor.default)
_rounding("ceil", aten.ceil.default)
_rounding("trunc", aten.trunc.default)


def round_half_even(x: Expr) -> Expr:
    """Round a float to the nearest integer, ties to even, as eager does (nearbyint).

    From floor(x) and the exact fraction x - floor(x), never x + 0.5, which rounds for large x
    (2^23 + 1 would become 2^23 + 2). A zero result keeps the sign of x (round(-0.3) is -0.0).
    """
    half, one, zero = Constant(0.5, x.dtype), Constant(1.0, x.dtype), Constant(0.0, x.dtype)
    f = op("floor", x)
    frac = op("sub", x, f)
    odd = op("ne", op("fmod", f, Constant(2.0, x.dtype)), zero, dtype=torch.bool)
    tie_up = op("logical_and", op("eq", frac, half, dtype=torch.bool), odd, dtype=torch.bool)
    up = op("logical_or", op("gt", frac, half, dtype=torch.bool), tie_up, dtype=torch.bool)
    r = op("where", up, op("add", f, one), f)
    return op("where", op("eq", r, zero, dtype=torch.bool), op("mul", x, zero), r)


@register_elementwise(aten.round.default)
def round_(ctx: LoweringContext, self: Any) -> Expr:
    (x,) = _operands(ctx, self)
    if not x.dtype.is_floating_point:
        return x
    return round_half_even(x)


@register_elementwise(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(ctx: LoweringContext, self: Any, exponent: Any) -> Expr:
    dtype = _compute(ctx)
    x = ctx.value(self, dtype)
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        special = {2: lambda: op("mul", x, x), 3: lambda: op("mul", op("mul", x, x), x), 1: lambda: x}
        if exponent in special:
            return special[exponent]()
        if exponent == 0:
            return Constant(ir._convert_scalar(1, dtype), dtype)
        if dtype.is_floating_point:
            if exponent == 0.5:
                return op("sqrt", x)
            if exponent == -0.5:
                return op("rsqrt", x)
            if exponent == -1:
                return op("truediv", Constant(1.0, dtype), x)
            if exponent == -2:
                return op("truediv", Constant(1.0, dtype), op("mul", x, x))
    if not dtype.is_floating_point:
        raise Unsupported("integer pow with a general exponent")
    y = ctx.value(exponent, dtype)
    return _general_pow(x, y)


def _general_pow(x: Expr, y: Expr) -> Expr:
    """x ** y for floats through exp2(y * log2|x|), with the sign and zero cases of C's pow."""
    dt = x.dtype
    zero, one = Constant(0.0, dt), Constant(1.0, dt)
    magnitude = op("exp2", op("mul", y, op("log2", op("abs", x))))
    y_is_int = op("eq", op("floor", y), y, dtype=torch.bool)
    y_is_odd = op("ne", op("fmod", y, Constant(2.0, dt)), zero, dtype=torch.bool)
    negative_base = op("lt", x, zero, dtype=torch.bool)
    signed = op("where", y_is_odd, op("neg", magnitude), magnitude)
    result = op("where", negative_base, op("where", y_is_int, signed, Constant(math.nan, dt)), magnitude)
    return op("where", op("eq", y, zero, dtype=torch.bool), one, result)


# ----------------------------------------------------------------- comparisons and logic


def _comparison(name: str, *aten_ops: Any) -> None:
    def lower(ctx: LoweringContext, self: Any, other: Any) -> Expr:
        dtype = ir.compute_dtype(ctx.result_type(self, other))
        return op(name, ctx.value(self, dtype), ctx.value(other, dtype), dtype=torch.bool)

    lower.__name__ = f"lower_{name}"
    register_elementwise(*aten_ops)(lower)


_comparison("eq", aten.eq.Tensor, aten.eq.Scalar)
_comparison("ne", aten.ne.Tensor, aten.ne.Scalar)
_comparison("lt", aten.lt.Tensor, aten.lt.Scalar)
_comparison("le", aten.le.Tensor, aten.le.Scalar)
_comparison("gt", aten.gt.Tensor, aten.gt.Scalar)
_comparison("ge", aten.ge.Tensor, aten.ge.Scalar)


def _logical(name: str, *aten_ops: Any) -> None:
    def lower(ctx: LoweringContext, self: Any, other: Any) -> Expr:
        return op(name, ctx.value(self, torch.bool), ctx.value(other, torch.bool), dtype=torch.bool)

    lower.__name__ = f"lower_{name}"
    register_elementwise(*aten_ops)(lower)


_logical("logical_and", aten.logical_and.default)
_logical("logical_or", aten.logical_or.default)
_logical("logical_xor", aten.logical_xor.default)


@register_elementwise(aten.logical_not.default)
def logical_not(ctx: LoweringContext, self: Any) -> Expr:
    return op("logical_not", ctx.value(self, torch.bool), dtype=torch.bool)


def _bitwise(name: str, logical: str, *aten_ops: Any) -> None:
    def lower(ctx: LoweringContext, self: Any, other: Any) -> Expr:
        if ctx.dtype == torch.bool:
            return op(logical, ctx.value(self, torch.bool), ctx.value(other, torch.bool), dtype=torch.bool)
        if ctx.dtype.is_floating_point:
            raise Unsupported("bitwise op on floats")
        return op(name, *_operands(ctx, self, other))

    lower.__name__ = f"lower_{name}"
    register_elementwise(*aten_ops)(lower)


_bitwise("bitwise_and", "logical_and", aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)
_bitwise("bitwise_or", "logical_or", aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)
_bitwise("bitwise_xor", "logical_xor", aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)


@register_elementwise(aten.bitwise_not.default)
def bitwise_not(ctx: LoweringContext, self: Any) -> Expr:
    if ctx.dtype == torch.bool:
        return op("logical_not", ctx.value(self, torch.bool), dtype=torch.bool)
    return op("bitwise_not", *_operands(ctx, self))


@register_elementwise(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx: LoweringContext, condition: Any, self: Any, other: Any) -> Expr:
    dtype = _compute(ctx) if ctx.dtype != torch.bool else torch.bool
    return op("where", ctx.value(condition, torch.bool), ctx.value(self, dtype), ctx.value(other, dtype), dtype=dtype)


def _float_test(name: str, aten_op: Any) -> None:
    def lower(ctx: LoweringContext, self: Any) -> Expr:
        if not self.dtype.is_floating_point:
            return Constant(False, torch.bool)
        x = ctx.value(self, ir.compute_dtype(self.dtype))
        return op(name, x, dtype=torch.bool)

    lower.__name__ = f"lower_{name}"
    register_elementwise(aten_op)(lower)


_float_test("isnan", aten.isnan.default)
_float_test("isinf", aten.isinf.default)


# --------------------------------------------------------------- copies, casts, constants


@register_elementwise(aten.clone.default)
def clone(ctx: LoweringContext, self: Any, memory_format: Any = None) -> Expr:
    return ctx.load(self)


@register_elementwise(aten._to_copy.default)
def to_copy(
    ctx: LoweringContext, self: Any, dtype: Any = None, layout: Any = None, device: Any = None,
    pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None,
) -> Expr:
    if device is not None and torch.device(device) != ctx.device:
        raise Unsupported("copy to another device")
    return ctx.value(self, ctx.dtype)


@register_elementwise(prims.convert_element_type.default)
def convert_element_type(ctx: LoweringContext, a: Any, dtype: Any) -> Expr:
    return ctx.value(a, ctx.dtype)


@register_elementwise(aten.copy.default)
def copy(ctx: LoweringContext, self: Any, src: Any, non_blocking: bool = False) -> Expr:
    return ctx.value(src, ctx.dtype)


@register_elementwise(aten.lift_fresh_copy.default)
def lift_fresh_copy(ctx: LoweringContext, self: Any) -> Expr:
    return ctx.load(self)


def _factory_device_ok(ctx: LoweringContext, device: Any) -> None:
    if device is not None and torch.device(device) != ctx.device:
        raise Unsupported("constant on another device")


@register_elementwise(aten.full.default)
def full(
    ctx: LoweringContext, size: Any, fill_value: Any, dtype: Any = None, layout: Any = None,
    device: Any = None, pin_memory: Any = None,
) -> Expr:
    _factory_device_ok(ctx, device)
    return Constant(ir._convert_scalar(fill_value, ctx.dtype), ctx.dtype)


@register_elementwise(aten.full_like.default)
def full_like(
    ctx: LoweringContext, self: Any, fill_value: Any, dtype: Any = None, layout: Any = None,
    device: Any = None, pin_memory: Any = None, memory_format: Any = None,
) -> Expr:
    _factory_device_ok(ctx, device)
    return Constant(ir._convert_scalar(fill_value, ctx.dtype), ctx.dtype)


@register_elementwise(aten.scalar_tensor.default)
def scalar_tensor(
    ctx: LoweringContext, s: Any, dtype: Any = None, layout: Any = None, device: Any = None,
    pin_memory: Any = None,
) -> Expr:
    _factory_device_ok(ctx, device)
    return Constant(ir._convert_scalar(s, ctx.dtype), ctx.dtype)


@register_elementwise(aten.fill.Scalar)
def fill(ctx: LoweringContext, self: Any, value: Any) -> Expr:
    return Constant(ir._convert_scalar(value, ctx.dtype), ctx.dtype)


@register_elementwise(aten.arange.start_step)
def arange(
    ctx: LoweringContext, start: Any, end: Any, step: Any = 1, dtype: Any = None, layout: Any = None,
    device: Any = None, pin_memory: Any = None,
) -> Expr:
    _factory_device_ok(ctx, device)
    dt = _compute(ctx)
    index = ir.IndexValue(ctx.vars[0], torch.int64)
    value = op("add", op("mul", cast(index, dt), Constant(ir._convert_scalar(step, dt), dt)),
               Constant(ir._convert_scalar(start, dt), dt))
    return value


@register_pointwise(aten.cat.default, symbolic=True)
def cat(ctx: LoweringContext, tensors: Any, dim: int = 0) -> Expr:
    """Each output element is read from the one input its position along ``dim`` falls in.

    Every input is read at a position computed from the index, under the condition that the
    position falls in it (``IndirectLoad.valid``), so each element is read once. An input
    computed in the same graph can be computed in the concatenating kernel: its loads are then
    masked by that condition (``codegen.branches.inlined_part``), so a rotary embedding's negated
    half, rotation and pass-through make one kernel. Over symbolic sizes the parts' bounds are
    expressions in the size symbols, taken by the kernel as arguments; a part whose size is an
    expression stays (it may be empty at some sizes, where its condition is never true).
    """
    rank = len(ctx.sizes)
    if rank == 0:
        raise Unsupported("cat of 0-dim tensors")
    dim = dim % rank
    # ATen skips 1-D empty tensors whatever the dim (a legacy rule), and empty parts add nothing
    parts = [t for t in tensors if t.view.sizes != (0,) and t.view.sizes[dim] != 0]
    if not parts:
        raise Unsupported("cat of empty inputs only")
    if any(len(t.view.sizes) != rank for t in parts):
        raise Unsupported("cat of inputs of another rank")
    dt = _compute(ctx)
    numel = math.prod(ctx.sizes)
    index_dtype = torch.int32 if not sizevars.symbolic([numel]) and numel < 2**31 else torch.int64


    here = ir.IndexValue(ctx.vars[dim], index_dtype)
    idx = tuple(0 if k == dim else ctx.vars[k] for k in range(rank))
    values: list[tuple[Any, Expr]] = []  # (end along dim, the part's value there)
    start: Any = 0
    for t in parts:
        size = t.view.sizes[dim]
        end = start + size
        inside = []
        if start != 0:
            inside.append(op("ge", here, size_value(start, index_dtype), dtype=torch.bool))
        if sympy.expand(ctx.sizes[dim] - end) != 0:
            inside.append(op("lt", here, size_value(end, index_dtype), dtype=torch.bool))
        valid = inside[0] if len(inside) == 1 else op("logical_and", *inside) if inside else None
        position: Expr = here if start == 0 else op("sub", here, size_value(start, index_dtype))
        if size == 1:
            position = Constant(0, index_dtype)
        # in range where valid: computed from the loop index, not data (nothing to check)
        values.append((end, cast(ir.IndirectLoad(t.view, idx, dim, position, valid, checked=False), dt)))
        start = end
    # select, not add: a masked-off load is 0, and 0 + -0.0 would lose the sign of a zero
    body = values[-1][1]
    for end, value in reversed(values[:-1]):
        body = op("where", op("lt", here, size_value(end, index_dtype), dtype=torch.bool), value, body)
    return body
