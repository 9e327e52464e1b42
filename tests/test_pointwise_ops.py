"""Op tests: every pointwise lowering against eager, over dtypes, shapes and memory layouts.

Each op is described once in ``OPS`` (its function, the value domain of each tensor operand and
the dtypes it is defined for). Three matrices run over that table:

- ``test_op_dtype``: op x dtype on a 1-D tensor;
- ``test_op_shape``: op x shape in the op's first dtype;
- ``test_op_layout``: op x memory layout (transposed, permuted, strided, expanded, offset,
  channels_last) in the op's first dtype, checking output strides against eager too.

Every case also asserts that the op became a generated kernel (no ATen fallback), so a test never
passes by comparing eager with eager. Separate tests cover the degenerate shapes (one element,
0-dim, empty), NaN/inf inputs, casts between all dtype pairs, Python scalars, broadcasting across
ranks, dtype promotion, and factory functions inside a compiled function.

By default the matrices run a fixed sample: each op in one of its dtypes (taken in turn down the
table, and each dtype that leaves out with its first op: ``helpers.in_turn``), and for the shape,
layout, scalar, cast, NaN and degenerate-shape matrices each op (or source dtype) with some of the
other axis's values, taken in turn so that every value runs (``helpers.diagonal``). ``pytest
--full`` runs every case.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import FULL, check, diagonal, in_turn, kernel_count

f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
i8, u8, i32, i64 = torch.int8, torch.uint8, torch.int32, torch.int64
b1 = torch.bool

FLOATS = (f32, f16, bf16)
FLOATS64 = (f32, f16, bf16, f64)
INTS = (i32, i64)
ALL_INTS = (i32, i64, i8, u8)
FEW = (f32, bf16, i32)  # variants of an op whose every dtype the main entry already covers

# ----------------------------------------------------------------------------------- inputs


def _float_values(shape: tuple[int, ...], domain: str) -> torch.Tensor:
    """fp32 values in ``domain`` (rounded to the target dtype by the caller)."""
    if domain == "any":
        return torch.randn(shape) * 2
    if domain == "small":  # exp-like ops: keep the result finite in fp16
        return torch.rand(shape) * 8 - 4
    if domain == "pos":  # log, sqrt, rsqrt, fractional powers
        return torch.rand(shape) * 4 + 0.05
    if domain == "nonzero":  # divisors, reciprocals: |x| >= 0.25, both signs
        sign = torch.where(torch.rand(shape) < 0.5, -1.0, 1.0)
        return sign * (torch.rand(shape) * 3 + 0.25)
    if domain == "gt_m1":  # log1p
        return torch.rand(shape) * 4 - 0.9
    if domain == "tan":  # away from the poles at +-pi/2
        return torch.rand(shape) * 2.4 - 1.2
    if domain == "quarters":  # exact halves and quarters: ties for round, integers for floor/ceil
        return torch.randint(-40, 40, shape).float() * 0.25
    if domain == "pow2":  # powers of two, both signs: quotients are exact in every float type
        sign = torch.where(torch.rand(shape) < 0.5, -1.0, 1.0)
        return sign * 2.0 ** torch.randint(-2, 3, shape).float()
    if domain == "intlike":  # integral exponents (signed bases stay defined)
        return torch.randint(-3, 4, shape).float()
    if domain == "nan":  # NaN, +inf and -inf mixed into ordinary values
        x = torch.randn(shape) * 2
        flat = x.view(-1)
        flat[::5] = math.nan
        flat[1::7] = math.inf
        flat[3::11] = -math.inf
        return x
    if domain == "cond":
        return torch.randn(shape)
    raise ValueError(domain)


def _int_values(shape: tuple[int, ...], dtype: torch.dtype, domain: str) -> torch.Tensor:
    lo = 0 if dtype == u8 else -20
    if domain in ("nonzero",):
        mag = torch.randint(1, 20, shape)
        sign = torch.where(torch.rand(shape) < 0.5, -1, 1) if dtype != u8 else 1
        return (mag * sign).to(dtype)
    if domain in ("pos", "gt_m1"):
        return torch.randint(1, 20, shape, dtype=dtype)
    if domain in ("small", "tan", "intlike", "pow2"):
        return torch.randint(0 if dtype == u8 else -3, 4, shape, dtype=dtype)
    return torch.randint(lo, 20, shape, dtype=dtype)


def values(shape: tuple[int, ...], dtype: torch.dtype, domain: str = "any") -> torch.Tensor:
    """A fresh random tensor of ``shape`` and ``dtype`` inside the op's ``domain``."""
    if domain == "cond" or dtype == b1:
        return torch.rand(shape) < 0.5
    if dtype.is_floating_point:
        return _float_values(shape, domain).to(dtype)
    return _int_values(shape, dtype, domain)


LAYOUT_SHAPE = (3, 4, 5, 6)
LAYOUTS = ["contiguous", "transposed", "permuted", "strided", "strided_inner", "expanded", "offset",
           "channels_last"]


def make(shape: tuple[int, ...], dtype: torch.dtype, domain: str = "any", layout: str = "contiguous") -> torch.Tensor:
    """A tensor of logical ``shape`` whose memory is laid out as ``layout`` says."""
    if layout == "contiguous":
        return values(shape, dtype, domain)
    if layout == "transposed":  # x.t() on the last two dims
        base = values(shape[:-2] + (shape[-1], shape[-2]), dtype, domain)
        return base.transpose(-1, -2)
    if layout == "permuted":  # a full permutation: innermost memory dim becomes dim 0
        base = values(shape[1:] + shape[:1], dtype, domain)
        return base.permute(3, 0, 1, 2)
    if layout == "strided":  # x[::2]
        return values((2 * shape[0],) + shape[1:], dtype, domain)[::2]
    if layout == "strided_inner":  # x[..., ::2]: inner stride 2
        return values(shape[:-1] + (2 * shape[-1],), dtype, domain)[..., ::2]
    if layout == "expanded":  # x[:1].expand(...): stride 0
        return values((1,) + shape[1:], dtype, domain).expand(shape)
    if layout == "offset":  # x[1:]: storage offset
        return values((shape[0] + 1,) + shape[1:], dtype, domain)[1:]
    if layout == "channels_last":
        return values(shape, dtype, domain).contiguous(memory_format=torch.channels_last)
    raise ValueError(layout)


# -------------------------------------------------------------------------------- op table


@dataclasses.dataclass(frozen=True)
class OpInfo:
    name: str
    fn: Callable[..., torch.Tensor]
    domains: tuple[str, ...]  # one per tensor operand ("cond" is always a bool tensor)
    dtypes: tuple[torch.dtype, ...]  # the first one is used for the shape and layout matrices
    exact: bool = False  # the result must equal eager bit for bit (no rounding involved)
    # Domains for fp16/bf16 when they differ. Eager rounds a half-precision quotient to the half
    # type before truncating or flooring it; we keep it in fp32 (as Inductor does), so those ops
    # get quotients that are exact in every float type.
    half_domains: tuple[str, ...] | None = None


def _op(name: str, fn: Callable[..., torch.Tensor], domains: str | tuple[str, ...], dtypes: tuple[torch.dtype, ...],
        exact: bool = False, half_domains: tuple[str, ...] | None = None) -> OpInfo:
    return OpInfo(name, fn, (domains,) if isinstance(domains, str) else domains, dtypes, exact, half_domains)


EXACT_QUOTIENT = ("quarters", "pow2")


OPS: list[OpInfo] = [
    # arithmetic
    _op("add", torch.add, ("any", "any"), FLOATS64 + ALL_INTS + (b1,), exact=True),
    _op("add_alpha", lambda a, b: torch.add(a, b, alpha=2), ("any", "any"), FLOATS + INTS),
    _op("add_alpha_float", lambda a, b: torch.add(a, b, alpha=0.5), ("any", "any"), FLOATS),
    _op("add_scalar", lambda a: a + 3, "any", (f32, f16, i64, u8), exact=True),
    _op("sub", torch.sub, ("any", "any"), FLOATS + ALL_INTS, exact=True),
    _op("sub_alpha", lambda a, b: torch.sub(a, b, alpha=3), ("any", "any"), (f32, bf16, i32)),
    _op("rsub_scalar", lambda a: 2 - a, "any", FEW, exact=True),
    _op("mul", torch.mul, ("any", "any"), FLOATS64 + ALL_INTS + (b1,), exact=True),
    _op("mul_scalar", lambda a: a * 0.5, "any", FEW),
    _op("div", torch.div, ("any", "nonzero"), FLOATS64 + INTS),
    _op("div_scalar", lambda a: a / 3, "any", FEW),
    _op("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), ("any", "nonzero"), FLOATS + ALL_INTS,
        half_domains=EXACT_QUOTIENT),
    _op("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), ("any", "nonzero"), FLOATS + ALL_INTS,
        half_domains=EXACT_QUOTIENT),
    _op("div_floor_scalar", lambda a: torch.div(a, -3, rounding_mode="floor"), "any", (f32, f16, i64)),
    _op("floor_divide", torch.floor_divide, ("any", "nonzero"), FLOATS + ALL_INTS,
        half_domains=EXACT_QUOTIENT),
    _op("remainder", torch.remainder, ("any", "nonzero"), FLOATS + ALL_INTS),
    _op("remainder_scalar", lambda a: torch.remainder(a, -3), "any", FEW),
    _op("fmod", torch.fmod, ("any", "nonzero"), FLOATS + ALL_INTS),
    _op("fmod_scalar", lambda a: torch.fmod(a, 3), "any", FEW),
    _op("neg", torch.neg, "any", FLOATS + ALL_INTS, exact=True),
    _op("abs", torch.abs, "any", FLOATS + (i32, i64, i8), exact=True),
    _op("reciprocal", torch.reciprocal, "nonzero", FLOATS),
    _op("sign", torch.sign, "any", FLOATS + INTS + (b1,), exact=True),
    # comparisons
    _op("eq", torch.eq, ("quarters", "quarters"), FLOATS + INTS + (b1,), exact=True),
    _op("ne", torch.ne, ("quarters", "quarters"), (f32, bf16, i64, b1), exact=True),
    _op("lt", torch.lt, ("any", "any"), FLOATS + ALL_INTS + (b1,), exact=True),
    _op("le", torch.le, ("quarters", "quarters"), (f32, f16, i32), exact=True),
    _op("gt", torch.gt, ("any", "any"), FLOATS + INTS + (b1,), exact=True),
    _op("ge", torch.ge, ("quarters", "quarters"), (f32, bf16, i64), exact=True),
    _op("gt_scalar", lambda a: a > 0.5, "any", FEW, exact=True),
    _op("eq_scalar", lambda a: a == 2, "quarters", FEW, exact=True),
    # logic and bits
    _op("logical_and", torch.logical_and, ("any", "any"), (b1, f32, i32), exact=True),
    _op("logical_or", torch.logical_or, ("any", "any"), (b1, bf16, i64), exact=True),
    _op("logical_xor", torch.logical_xor, ("any", "any"), (b1, f16, i32), exact=True),
    _op("logical_not", torch.logical_not, "any", (b1, f32, i64), exact=True),
    _op("bitwise_and", torch.bitwise_and, ("any", "any"), ALL_INTS + (b1,), exact=True),
    _op("bitwise_or", torch.bitwise_or, ("any", "any"), ALL_INTS + (b1,), exact=True),
    _op("bitwise_xor", torch.bitwise_xor, ("any", "any"), ALL_INTS + (b1,), exact=True),
    _op("bitwise_not", torch.bitwise_not, "any", ALL_INTS + (b1,), exact=True),
    _op("bitwise_and_scalar", lambda a: a & 6, "any", INTS, exact=True),
    _op("where", torch.where, ("cond", "any", "any"), FLOATS64 + INTS + (b1,), exact=True),
    _op("where_scalar", lambda c, a: torch.where(c, a, 0.5), ("cond", "any"), FLOATS, exact=True),
    _op("where_scalar_self", lambda c, a: torch.where(c, -1, a), ("cond", "any"), (i32, bf16), exact=True),
    # float math
    _op("exp", torch.exp, "small", FLOATS64),
    _op("exp2", torch.exp2, "small", FLOATS),
    _op("expm1", torch.expm1, "small", FLOATS),
    _op("log", torch.log, "pos", FLOATS64),
    _op("log2", torch.log2, "pos", FLOATS),
    _op("log10", torch.log10, "pos", FLOATS),
    _op("log1p", torch.log1p, "gt_m1", FLOATS),
    _op("sqrt", torch.sqrt, "pos", FLOATS64),
    _op("rsqrt", torch.rsqrt, "pos", FLOATS),
    _op("sin", torch.sin, "any", FLOATS),
    _op("cos", torch.cos, "any", FLOATS),
    _op("tan", torch.tan, "tan", FLOATS),
    _op("tanh", torch.tanh, "any", FLOATS64),
    _op("sigmoid", torch.sigmoid, "any", FLOATS64),
    _op("erf", torch.erf, "any", FLOATS),
    # int tensors in, float out (type promotion to the default dtype)
    _op("exp_of_int", torch.exp, "small", INTS),
    _op("sqrt_of_int", torch.sqrt, "pos", INTS),
    _op("sin_of_bool", torch.sin, "any", (b1,)),
    # rounding
    _op("floor", torch.floor, "quarters", FLOATS + INTS, exact=True),
    _op("ceil", torch.ceil, "quarters", (f32, f16, i64), exact=True),
    _op("trunc", torch.trunc, "quarters", (f32, bf16, i32), exact=True),
    _op("round", torch.round, "quarters", FLOATS + INTS, exact=True),
    _op("round_any", torch.round, "any", FLOATS, exact=True),
    # pow
    _op("pow_2", lambda a: a**2, "any", FLOATS + ALL_INTS),
    _op("pow_3", lambda a: a**3, "any", FLOATS + INTS),
    _op("pow_0", lambda a: a**0, "any", FEW, exact=True),
    _op("pow_half", lambda a: a**0.5, "pos", FLOATS),
    _op("pow_m_half", lambda a: a**-0.5, "pos", FLOATS),
    _op("pow_m1", lambda a: a**-1, "nonzero", FLOATS),
    _op("pow_m2", lambda a: a**-2, "nonzero", FLOATS),
    _op("pow_1_7", lambda a: a**1.7, "pos", FLOATS64),
    _op("pow_1_7_neg_base", lambda a: a**1.7, "any", FLOATS),  # NaN for negative bases
    _op("pow_tensor_int_exponent", torch.pow, ("any", "intlike"), FLOATS),
    _op("pow_tensor_frac_exponent", torch.pow, ("pos", "any"), FLOATS),
    _op("pow_scalar_base", lambda a: 2.0**a, "small", FLOATS),
    _op("pow_neg_scalar_base", lambda a: (-1.5) ** a, "intlike", FLOATS),
    # clamps and activations
    _op("clamp", lambda a: torch.clamp(a, -0.5, 0.75), "any", FLOATS + INTS, exact=True),
    _op("clamp_int_bounds", lambda a: torch.clamp(a, -3, 5), "any", (i64, f32), exact=True),
    _op("clamp_min", lambda a: torch.clamp_min(a, 0.25), "any", (f32, f16, i32), exact=True),
    _op("clamp_max", lambda a: torch.clamp_max(a, 0.25), "any", (f32, bf16, i64), exact=True),
    _op("clamp_tensor", lambda a, lo, hi: torch.clamp(a, lo, hi), ("any", "any", "any"), FLOATS + INTS, exact=True),
    _op("maximum", torch.maximum, ("any", "any"), FLOATS + INTS + (b1,), exact=True),
    _op("minimum", torch.minimum, ("any", "any"), FLOATS + INTS + (b1,), exact=True),
    _op("relu", torch.relu, "any", FLOATS + INTS, exact=True),
    _op("gelu", F.gelu, "any", FLOATS64),
    _op("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), "any", FLOATS),
    _op("silu", F.silu, "any", FLOATS),
    _op("leaky_relu", F.leaky_relu, "any", FLOATS),
    _op("leaky_relu_slope", lambda a: F.leaky_relu(a, 0.2), "any", FLOATS),
    _op("hardtanh", F.hardtanh, "any", FLOATS, exact=True),
    _op("hardtanh_bounds", lambda a: F.hardtanh(a, -0.5, 2.0), "any", FLOATS, exact=True),
    _op("softplus", F.softplus, "any", FLOATS),
    _op("softplus_beta", lambda a: F.softplus(a, beta=2.0, threshold=3.0), "any", FLOATS),
    _op("isnan", torch.isnan, "nan", FEW, exact=True),
    _op("isinf", torch.isinf, "nan", FEW, exact=True),
]

OPS_BY_NAME = {o.name: o for o in OPS}
assert len(OPS_BY_NAME) == len(OPS), "duplicate op names in the table"


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _inputs(info: OpInfo, shape: tuple[int, ...], dtype: torch.dtype,
            layout: str = "contiguous") -> list[torch.Tensor]:
    domains = info.half_domains if info.half_domains and dtype in (f16, bf16) else info.domains
    return [make(shape, dtype, d, layout) for d in domains]


def _check_op(info: OpInfo, args: list[torch.Tensor]) -> torch.Tensor:
    exact = {"atol": 0.0, "rtol": 0.0} if info.exact else {}
    out = check(info.fn, *args, **exact)
    # The op was generated, not left to ATen (which would only compare eager with eager).
    assert not fusebackend.metrics.fallbacks, f"ATen fallbacks: {dict(fusebackend.metrics.fallbacks)}"
    if out.numel() > 0:
        assert kernel_count() >= 1
    return out


# ---------------------------------------------------------------------------- the matrices

# by default one dtype per op, taken in turn down the table (op 0 in its first dtype, op 1 in its
# second...), and each dtype this leaves out with its first op
_DTYPE_SAMPLE = in_turn([o.dtypes for o in OPS])
OP_DTYPE_CASES = [pytest.param(o, d, id=f"{o.name}-{_dtype_id(d)}", marks=() if (i, j) in _DTYPE_SAMPLE else FULL)
                  for i, o in enumerate(OPS) for j, d in enumerate(o.dtypes)]


@pytest.mark.parametrize("info,dtype", OP_DTYPE_CASES)
def test_op_dtype(info: OpInfo, dtype: torch.dtype) -> None:
    _check_op(info, _inputs(info, (1000,), dtype))


# (1000,) is the dtype matrix's shape; (1,), () and empty shapes have their own test below.
SHAPES = [(7,), (4097,), (3, 5, 7)]


SHAPE_OPS = ["add", "add_scalar", "sub_alpha", "mul", "div", "div_floor", "remainder", "neg", "sign", "lt",
             "logical_and", "bitwise_xor", "where", "exp", "log1p", "tanh", "sigmoid", "erf", "round", "pow_1_7",
             "pow_tensor_int_exponent", "clamp", "maximum", "gelu", "silu", "softplus", "isnan"]


@pytest.mark.parametrize("name,shape", diagonal({n: n for n in SHAPE_OPS}, {"x".join(map(str, s)): s for s in SHAPES}))
def test_op_shape(name: str, shape: tuple[int, ...]) -> None:
    info = OPS_BY_NAME[name]
    _check_op(info, _inputs(info, shape, info.dtypes[0]))


# One element, 0-dim and empty tensors, for a few ops of each kind.
DEGENERATE_OPS = ["add", "mul_scalar", "div", "sigmoid", "lt", "where", "floor_divide", "bitwise_xor", "gelu"]


@pytest.mark.parametrize("name,shape", diagonal({n: n for n in DEGENERATE_OPS},
                                                {"1": (1,), "0dim": (), "0x4": (0, 4), "0": (0,)}, per=2))
def test_op_degenerate_shape(name: str, shape: tuple[int, ...]) -> None:
    info = OPS_BY_NAME[name]
    out = _check_op(info, _inputs(info, shape, info.dtypes[0]))
    assert out.shape == torch.Size(shape)


LAYOUT_OPS = ["add", "sub", "mul_scalar", "div", "div_floor", "remainder", "abs", "lt", "where", "exp", "sqrt",
              "tanh", "sigmoid", "erf", "round", "pow_tensor_int_exponent", "clamp_tensor", "maximum", "gelu",
              "silu"]


# (contiguous is the other matrices' layout)
@pytest.mark.parametrize("name,layout", diagonal({n: n for n in LAYOUT_OPS}, {la: la for la in LAYOUTS[1:]}, per=2))
def test_op_layout(name: str, layout: str) -> None:
    info = OPS_BY_NAME[name]
    args = _inputs(info, LAYOUT_SHAPE, info.dtypes[0], layout)
    out = _check_op(info, args)
    # Elementwise outputs keep eager's memory layout (transposed in, transposed out).
    assert out.stride() == info.fn(*args).stride()


@pytest.mark.parametrize("layout", ["transposed", "permuted", "channels_last"])
@pytest.mark.parametrize("dtype", [f16, bf16, i32, b1], ids=_dtype_id)
def test_layout_other_dtypes(layout: str, dtype: torch.dtype) -> None:
    x, y = make(LAYOUT_SHAPE, dtype, layout=layout), make(LAYOUT_SHAPE, dtype, layout=layout)
    fn = (lambda a, b: a ^ b) if dtype == b1 else (lambda a, b: a * b + a)
    out = check(fn, x, y)
    assert out.stride() == fn(x, y).stride()
    assert kernel_count() == 1


# Operands of different layouts: eager picks the output layout from both; so must we.
MIXED_LAYOUTS = [("transposed", "contiguous"), ("contiguous", "transposed"), ("channels_last", "contiguous"),
                 ("contiguous", "channels_last"), ("expanded", "strided"), ("offset", "permuted"),
                 ("strided_inner", "channels_last")]


@pytest.mark.parametrize("la,lb", MIXED_LAYOUTS, ids=lambda v: v)
def test_mixed_layouts(la: str, lb: str) -> None:
    a, b = make(LAYOUT_SHAPE, f32, layout=la), make(LAYOUT_SHAPE, f32, layout=lb)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(a) * b - a

    out = check(fn, a, b)
    assert out.stride() == fn(a, b).stride()


def test_transposed_output_matches_eager_strides_2d() -> None:
    x = torch.randn(37, 29).t()
    out = check(lambda x: torch.tanh(x) + 1, x)
    assert out.stride() == (1, 29)


# ------------------------------------------------------------------------ NaN and infinity

NAN_OPS = {
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "clamp": lambda a, b: torch.clamp(a, -0.5, 0.5),
    "clamp_min": lambda a, b: torch.clamp_min(a, 0.0),
    "clamp_max": lambda a, b: torch.clamp_max(a, 0.0),
    "clamp_tensor": lambda a, b: torch.clamp(a, b, b + 1),
    "relu": lambda a, b: torch.relu(a),
    "hardtanh": lambda a, b: F.hardtanh(a),
    "sign": lambda a, b: torch.sign(a),
    "abs": lambda a, b: torch.abs(a),
    "neg": lambda a, b: -a,
    "floor": lambda a, b: torch.floor(a),
    "ceil": lambda a, b: torch.ceil(a),
    "round": lambda a, b: torch.round(a),
    "trunc": lambda a, b: torch.trunc(a),
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "isnan": lambda a, b: torch.isnan(a),
    "isinf": lambda a, b: torch.isinf(a),
    "where_isnan": lambda a, b: torch.where(torch.isnan(a), b, a),
    "exp": lambda a, b: torch.exp(a),
    "sigmoid": lambda a, b: torch.sigmoid(a),
    "tanh": lambda a, b: torch.tanh(a),
    "add": torch.add,
    "mul": torch.mul,
    "to_int_guarded": lambda a, b: torch.where(torch.isfinite(a), a, torch.isnan(a).to(a.dtype)).to(torch.int32),
}


@pytest.mark.parametrize("name,dtype", diagonal({n: n for n in NAN_OPS}, {_dtype_id(d): d for d in (f32, bf16)}))
def test_nan_and_inf_inputs(name: str, dtype: torch.dtype) -> None:
    a, b = values((97,), dtype, "nan"), values((97,), dtype, "nan").flip(0)
    exact = {} if name in ("exp", "sigmoid", "tanh") else {"atol": 0.0, "rtol": 0.0}
    check(NAN_OPS[name], a, b, **exact)
    assert not fusebackend.metrics.fallbacks


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.clamp(x, min=math.nan),
        lambda x: torch.clamp(x, max=math.nan),
        lambda x: torch.clamp(x, min=torch.full_like(x, math.nan)),
    ],
    ids=["min_nan_scalar", "max_nan_scalar", "min_nan_tensor"],
)
def test_clamp_nan_bound_gives_nan(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    # CPU eager: a NaN bound makes every element NaN. CUDA eager ignores a NaN *scalar* bound;
    # the kernels follow the eager of the device they run on (lowering/pointwise.py, _clamp).
    x = torch.randn(16)
    assert x.device.type != "cpu" or fn(x).isnan().all()
    check(fn, x)


# ------------------------------------------------------------------------------------ casts

CAST_DTYPES = [f32, f16, bf16, f64, i32, i64, i8, u8, b1]


def _cast_source(dtype: torch.dtype, target: torch.dtype) -> torch.Tensor:
    """Values that convert without undefined behaviour (in range, no NaN into an int)."""
    n = 257
    if dtype == b1:
        return torch.rand(n) < 0.5
    if target in (u8,) or (target == i8):
        lo, hi = (0, 120) if target == u8 else (-120, 120)
        x = torch.rand(n) * (hi - lo) + lo
    else:
        x = torch.randn(n) * 50
    x[::4] = torch.round(x[::4])  # some integral values
    x[::9] = 0  # zeros, for casts to bool
    if dtype.is_floating_point:
        if target.is_floating_point:
            x[1::13] = math.nan
            x[2::17] = math.inf
            x[5::19] = -math.inf
            x[3::23] = 1e-3 + torch.rand(x[3::23].shape) * 1e-2  # many mantissa bits
        return x.to(dtype)
    return torch.trunc(x).to(dtype)


# by default each source dtype with half of the eight targets: every other one, from the first
# target for one source and from the second for the next
CAST_PAIRS = [pytest.param(s, t, id=f"{_dtype_id(s)}-{_dtype_id(t)}", marks=() if (i + k) % 2 == 0 else FULL)
              for i, s in enumerate(CAST_DTYPES) for k, t in enumerate([t for t in CAST_DTYPES if t != s])]


@pytest.mark.parametrize("source,target", CAST_PAIRS)
def test_cast(source: torch.dtype, target: torch.dtype) -> None:
    x = _cast_source(source, target)
    # A conversion is exact: rounding to nearest even for narrower floats, truncation to ints.
    out = check(lambda x: x.to(target), x, atol=0.0, rtol=0.0)
    assert out.dtype == target
    assert kernel_count() == 1


@pytest.mark.parametrize("dtype", [f16, bf16], ids=_dtype_id)
def test_cast_rounds_to_nearest_even(dtype: torch.dtype) -> None:
    # fp32 values just above, below and exactly at half an ulp of the narrow type.
    one_ulp = 2.0 ** (-10 if dtype == f16 else -7)
    x = torch.tensor([1 + one_ulp / 2, 1 + 1.5 * one_ulp, 1 + one_ulp * 0.51, 1 + one_ulp * 0.49,
                      -(1 + one_ulp / 2), 3 + one_ulp * 1.5 * 2], dtype=f32)
    check(lambda x: (x * 1.0).to(dtype), x, atol=0.0, rtol=0.0)


def test_cast_chain_float_int_bool() -> None:
    x = torch.randn(300) * 10
    check(lambda x: (x.to(torch.int32) * 3).to(torch.float16).to(torch.bool).to(torch.float32) + x, x)


def test_int_wraparound() -> None:
    a = torch.randint(0, 256, (200,), dtype=u8)
    b = torch.randint(0, 256, (200,), dtype=u8)
    c = torch.randint(-128, 128, (200,), dtype=i8)
    check(lambda a, b, c: (a - b, a * b, a + b, -a, c * 3, c + 100), a, b, c)


# ------------------------------------------------------ scalars, broadcasting, type promotion

BROADCAST_SHAPES = [((3, 1, 5), (7, 1)), ((5,), (4, 1)), ((2, 3, 4, 5), (5,)), ((1,), (6, 7)),
                    ((), (6, 7)), ((6, 1), (1, 7)), ((2, 1, 4, 1), (3, 1, 5))]


@pytest.mark.parametrize("sa,sb", BROADCAST_SHAPES, ids=lambda s: "x".join(map(str, s)) or "0dim")
def test_broadcast_between_ranks(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a, b = torch.randn(sa), torch.randn(sb)
    out = check(lambda a, b: torch.where(a > b, a * b, a - b) + 1, a, b)
    assert out.shape == torch.broadcast_shapes(sa, sb)
    assert kernel_count() >= 1


SCALAR_FNS = {
    "add_int": lambda x: x + 2,
    "radd_float": lambda x: 2.5 + x,
    "rsub": lambda x: 1 - x,
    "rmul": lambda x: 3 * x,
    "rdiv": lambda x: 1.5 / x,
    "pow_scalar": lambda x: x**2.5,
    "scalar_pow": lambda x: 2.5**x,
    "cmp": lambda x: (x > 1) & (x < 3.5),
    "where_two_scalars": lambda x: torch.where(x > 1, 1.0, -1.0),
    "max_scalar": lambda x: torch.clamp(x, min=1, max=2.5),
    "bool_scalar": lambda x: x * True,
}


@pytest.mark.parametrize("name,dtype", diagonal({n: n for n in SCALAR_FNS},
                                               {_dtype_id(d): d for d in (f32, f16, i32, i64)}, per=2))
def test_python_scalars(name: str, dtype: torch.dtype) -> None:
    x = values((123,), dtype, "pos")
    check(SCALAR_FNS[name], x)
    assert kernel_count() >= 1


@pytest.mark.parametrize("value", [2.5, 3, -1])
def test_scalar_argument(value: float) -> None:
    x = torch.randn(50)
    check(lambda x, s: x * s + s, x, value)


PROMOTIONS = [(f16, f32), (bf16, f16), (i32, i64), (i32, f16), (i64, f32), (b1, f16), (b1, i32), (u8, i8),
              (f32, f64), (bf16, i64), (i8, b1)]


@pytest.mark.parametrize("da,db", PROMOTIONS, ids=lambda d: _dtype_id(d))
def test_type_promotion(da: torch.dtype, db: torch.dtype) -> None:
    a, b = values((64,), da, "pos"), values((64,), db, "pos")
    out = check(lambda a, b: (a + b, a * b, a > b, torch.where(a > b, a, b)), a, b)
    assert out[0].dtype == torch.result_type(a, b)


def test_zero_dim_tensor_does_not_promote() -> None:
    a = torch.randn(33, dtype=f16)
    s = torch.tensor(2.5, dtype=f64)
    out = check(lambda a, s: a * s + 1, a, s)
    assert out.dtype == f16
