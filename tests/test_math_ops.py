"""Op tests for the special math functions: lowering/math_ops.py and kernels/math_helpers.py.

Each op is described once in ``OPS`` (its function, the value domain of each operand, the dtypes
eager takes). Over that table:

- ``test_op_dtype``: op x dtype (fp32, fp16, bf16, and integer inputs, which give fp32) on an odd
  1-D shape;
- ``test_op_layout``: op on a transposed and a sliced (strided) fp32 input, and on 0-dim and
  one-element tensors;
- ``test_special_values``: NaN, +-inf, +-0, domain edges and poles against eager, down to the
  sign of zero results; binary ops over every pair of such values;
- ``test_fp32_accuracy``: dense fp32 sweeps against float64, bounding the largest relative error
  (the numbers ``math_helpers`` documents).

By default the two matrices run a fixed sample: each op in one of its dtypes and in one of the
four layouts, both taken in turn down the table so that every dtype and layout runs
(``helpers.in_turn``, ``helpers.diagonal``); ``pytest --full`` runs every case.

Every case asserts that the op became a generated kernel (no ATen fallback). Separate tests cover
round with decimals, fmax/fmin's NaN rule and signed zeros, sinh/cosh near fp32 overflow, literal
arguments of helpers, which ops stay ATen calls in fp64, fusion of a chain of these ops, frexp's two
outputs, ldexp without intermediate overflow, gcd's worst case, and trigamma's poles.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import pytest
import torch
import torch.special as S

import fusebackend
from helpers import FULL, check, check_lowered, diagonal, in_turn, kernel_count, kernels

f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
i32, i64, b1 = torch.int32, torch.int64, torch.bool
FLOATS = (f32, f16, bf16)

# ----------------------------------------------------------------------------------- inputs


def _values(shape: tuple[int, ...], dtype: torch.dtype, domain: str) -> torch.Tensor:
    """A fresh random tensor of ``shape`` and ``dtype`` inside ``domain``."""
    if domain == "exps":  # ldexp's exponents: always integers
        return torch.randint(-30, 30, shape, dtype=i32)
    if not dtype.is_floating_point:
        lo, hi = {"unit": (-1, 2), "ge1": (1, 20), "prob": (0, 2), "pos": (1, 20)}.get(domain, (-3, 20))
        if domain == "shifts":  # past the bit width and negative amounts too
            lo, hi = (0, 70) if dtype == torch.uint8 else (-2, 70)
        if domain == "ints":
            lo, hi = (0, 200) if dtype == torch.uint8 else (-100, 100)
        if dtype == b1:
            return torch.rand(shape) < 0.5
        return torch.randint(lo, hi, shape, dtype=dtype)
    n = math.prod(shape)
    if domain == "wide":  # both signs, past the branch points of every fit (0.5, 1, 2.4...)
        x = torch.randn(n) * 3
    elif domain == "unit":  # inverse sines, atanh, erfinv: inside (-1, 1)
        x = torch.rand(n) * 1.9 - 0.95
    elif domain == "ge1":  # acosh
        x = 1 + torch.rand(n) * 6
    elif domain == "pos":  # trigamma (eager's reflection is inexact for x < 0)
        x = torch.rand(n) * 8 + 0.01
    elif domain == "prob":  # ndtri
        x = torch.rand(n) * 0.998 + 0.001
    elif domain == "gamma":  # lgamma, digamma: both signs, away from the poles by 0.05
        x = torch.randn(n) * 4
        x = torch.where((x - x.round()).abs() < 0.05, x + 0.25, x)
    elif domain == "nan":  # NaN-aware comparisons: NaN and infinities among numbers
        x = torch.randn(n) * 2
        x[::4] = math.nan
        x[1::9] = math.inf
        x[2::7] = -math.inf
    elif domain == "hundreds":  # round to tens
        x = torch.randn(n) * 300
    elif domain == "signs":  # signbit: +-0 among both signs
        x = torch.randn(n)
        x[::5] = 0.0
        x[1::5] = -0.0
    else:
        raise ValueError(domain)
    return x.reshape(shape).to(dtype)


@dataclasses.dataclass(frozen=True)
class MathOp:
    name: str
    fn: Callable[..., torch.Tensor]
    domains: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    helper: str | None  # the th.<helper> its kernel calls, if any
    exact: bool = False  # equal to eager bit for bit (no rounding involved)


def _op(name: str, fn: Callable[..., torch.Tensor], domains: str | tuple[str, ...], dtypes: tuple[torch.dtype, ...],
        helper: str | None = None, exact: bool = False) -> MathOp:
    return MathOp(name, fn, (domains,) if isinstance(domains, str) else domains, dtypes, helper, exact)


OPS: list[MathOp] = [
    _op("atan", torch.atan, "wide", FLOATS + (i32,), "atan"),
    _op("atan2", torch.atan2, ("wide", "wide"), FLOATS + (i64,), "atan2"),
    _op("asin", torch.asin, "unit", FLOATS + (i64,), "atan"),
    _op("acos", torch.acos, "unit", FLOATS + (i32,), "atan"),
    _op("sinh", torch.sinh, "wide", FLOATS + (i32,), "sinh"),
    _op("cosh", torch.cosh, "wide", FLOATS + (i64,)),
    _op("asinh", torch.asinh, "wide", FLOATS + (i64,), "asinh"),
    _op("acosh", torch.acosh, "ge1", FLOATS + (i32,), "acosh"),
    _op("atanh", torch.atanh, "unit", FLOATS + (i64,)),
    _op("erfc", torch.erfc, "wide", FLOATS + (i32,), "erfc"),
    _op("erfcx", S.erfcx, "wide", (f32, i64), "erfcx"),  # eager has no fp16/bf16 erfcx
    _op("erfinv", torch.erfinv, "unit", FLOATS + (i32,), "erfinv"),
    _op("ndtri", S.ndtri, "prob", (f32, i64), "ndtri"),
    _op("log_ndtr", S.log_ndtr, "wide", (f32,), "erfcx"),  # decomposed: erfc, erfcx, log
    _op("lgamma", torch.lgamma, "gamma", FLOATS + (i32,), "lgamma"),
    _op("digamma", torch.digamma, "gamma", FLOATS + (i64,), "digamma"),
    _op("hypot", torch.hypot, ("wide", "wide"), FLOATS, "hypot"),
    _op("copysign", torch.copysign, ("wide", "signs"), FLOATS + (i32,), "copysign", exact=True),
    _op("copysign_scalar", lambda a: torch.copysign(a, -0.0), "wide", FLOATS + (i64,), exact=True),
    _op("fmax", torch.fmax, ("nan", "nan"), FLOATS + (i32,), exact=True),
    _op("fmin", torch.fmin, ("nan", "nan"), FLOATS + (i64,), exact=True),
    _op("signbit", torch.signbit, "signs", FLOATS + (i32, b1), "signbit", exact=True),
    _op("round_decimals", lambda a: torch.round(a, decimals=2), "wide", FLOATS),
    _op("round_neg_decimals", lambda a: torch.round(a, decimals=-1), "hundreds", FLOATS),
    _op("trigamma", lambda a: torch.polygamma(1, a), "pos", FLOATS + (i32,), "trigamma"),
    _op("i0", torch.i0, "wide", FLOATS + (i64,), "i0"),
    _op("i0e", S.i0e, "wide", FLOATS + (i32,), "i0e"),
    _op("i1", S.i1, "wide", FLOATS + (i64,), "i1"),
    _op("i1e", S.i1e, "wide", FLOATS + (i32,), "i1e"),
    _op("spherical_bessel_j0", S.spherical_bessel_j0, "wide", (f32, i64)),
    _op("angle", torch.angle, "signs", FLOATS + (i32,), exact=True),
    _op("ldexp", torch.ldexp, ("wide", "exps"), FLOATS, exact=True),
    _op("nextafter", torch.nextafter, ("wide", "signs"), (f32, f64), "nextafter", exact=True),
    _op("xlogy_scalar", lambda a: torch.xlogy(2.0, a), "ge1", (f32, bf16)),
    _op("remainder_scalar_tensor", lambda a: torch.remainder(5.5, a), "ge1", (f32, f16, i32)),
    # integers
    _op("lshift", lambda a, b: a << b, ("ints", "shifts"), (i32, i64, torch.int8, torch.uint8), exact=True),
    _op("rshift", lambda a, b: a >> b, ("ints", "shifts"), (i64, i32, torch.int8, torch.uint8), exact=True),
    _op("lshift_scalar", lambda a: a << 3, "ints", (i64, torch.int8), exact=True),
    _op("rshift_scalar_wide", lambda a: torch.bitwise_right_shift(a, 40), "ints", (i32, i64), exact=True),
    _op("shift_scalar_tensor", lambda a: torch.bitwise_left_shift(3, a), "shifts", (i32, torch.int8), exact=True),
    _op("bitwise_and_scalar_tensor", lambda a: torch.bitwise_and(6, a), "ints", (i32, torch.uint8), exact=True),
    _op("gcd", torch.gcd, ("ints", "ints"), (i32, i64, torch.int8, torch.uint8), "gcd", exact=True),
    _op("lcm", torch.lcm, ("ints", "ints"), (i64, i32, torch.int16), "gcd", exact=True),
]
OPS_BY_NAME = {o.name: o for o in OPS}


def _inputs(info: MathOp, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    return [_values(shape, dtype, d) for d in info.domains]


def _check_op(info: MathOp, args: list[torch.Tensor]) -> torch.Tensor:
    tolerance = {"atol": 0.0, "rtol": 0.0} if info.exact or args[0].dtype == f32 and "round" in info.name else {}
    out = check(info.fn, *args, **tolerance)
    assert not fusebackend.metrics.fallbacks, f"ATen fallbacks: {dict(fusebackend.metrics.fallbacks)}"
    if out.numel() > 0:
        assert kernel_count() >= 1
        if info.helper is not None and (info.name != "signbit" or args[0].dtype.is_floating_point):
            assert any(f"th.{info.helper}(" in src for src in kernels().values())
    return out


def _on_gpu() -> bool:
    return torch.empty(0).device.type != "cpu"


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------- the matrices

# by default one dtype per op, taken in turn down the table (op 0 in its first dtype, op 1 in its
# second...), and each dtype this leaves out with its first op
_DTYPE_SAMPLE = in_turn([o.dtypes for o in OPS])
OP_DTYPE_CASES = [pytest.param(o, d, id=f"{o.name}-{_dtype_id(d)}", marks=() if (i, j) in _DTYPE_SAMPLE else FULL)
                  for i, o in enumerate(OPS) for j, d in enumerate(o.dtypes)]


@pytest.mark.parametrize("info,dtype", OP_DTYPE_CASES)
def test_op_dtype(info: MathOp, dtype: torch.dtype) -> None:
    on_gpu = torch.empty(0).device.type == "cuda"
    if on_gpu and info.name == "angle" and dtype in (torch.float16, torch.bfloat16):
        pytest.skip("eager's CUDA angle has no half-precision kernel")
    if on_gpu and info.name.startswith("round") and dtype in (torch.float16, torch.bfloat16):
        # eager's CUDA kernel rounds x * 10^d to the half type before rounding it to an integer;
        # its CPU kernel, which this lowering follows, computes in fp32
        pytest.skip("eager's CUDA and CPU kernels round half types differently")
    _check_op(info, _inputs(info, (67,), dtype))


@pytest.mark.parametrize("info,layout", diagonal({o.name: o for o in OPS},
                                               {la: la for la in ("transposed", "sliced", "0dim", "one")}))
def test_op_layout(info: MathOp, layout: str) -> None:
    dtype = info.dtypes[0]
    if layout == "transposed":
        args = [a.t() for a in _inputs(info, (7, 5), dtype)]
    elif layout == "sliced":
        args = [a[1::2, ::3] for a in _inputs(info, (9, 10), dtype)]
    else:
        args = _inputs(info, () if layout == "0dim" else (1,), dtype)
    out = _check_op(info, args)
    assert out.shape == args[0].shape and out.stride() == info.fn(*args).stride()


# ------------------------------------------------------------------------- special values

_SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 1e-30, -1e-30,
             1e-40, 1e30, -1e30, 0.9999999, -0.9999999, 1.0000001, 9.5, -9.5, 20.0, -20.0, 88.0, -88.0, 1e38]
# Float ops. Trigamma's poles and negative arguments have their own test (eager is inexact
# there); eager's remainder by a subnormal is NaN or not depending on its loop.
SPECIAL = [o for o in OPS if o.dtypes[0].is_floating_point and o.name not in ("trigamma", "remainder_scalar_tensor")]
UNARY_SPECIAL = [o for o in SPECIAL if len(o.domains) == 1]
BINARY_SPECIAL = [o for o in SPECIAL if len(o.domains) == 2 and "exps" not in o.domains]


def _same_signed_zeros(out: torch.Tensor, expected: torch.Tensor) -> None:
    zeros = expected == 0
    assert torch.equal(torch.signbit(out[zeros]), torch.signbit(expected[zeros])), "signs of zeros differ"


@pytest.mark.parametrize("info", UNARY_SPECIAL, ids=lambda o: o.name)
def test_special_values(info: MathOp) -> None:
    # Poles, domain edges, overflow and underflow, exactly as eager places them.
    x = torch.tensor(_SPECIALS, dtype=f32)
    if info.name == "signbit":
        x = torch.cat([x, -torch.tensor([math.nan])])  # a NaN with its sign bit set
    out = _check_op(info, [x])
    if out.dtype.is_floating_point:
        _same_signed_zeros(out, info.fn(x))


@pytest.mark.parametrize("info", BINARY_SPECIAL, ids=lambda o: o.name)
def test_special_value_pairs(info: MathOp) -> None:
    # atan2's quadrants and signed zeros, hypot's inf beats NaN, copysign onto NaN and zeros...
    v = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e-30, 3e38], dtype=f32)
    a, b = v.repeat_interleave(len(v)), v.repeat(len(v))
    out = _check_op(info, [a, b])
    if info.name in ("fmax", "fmin") and a.device.type == "cuda":
        return  # between +0 and -0 CUDA's fmax instruction may pick either (see the test below)
    _same_signed_zeros(out, info.fn(a, b))


# --------------------------------------------------------------------------- fp32 accuracy


def _sweep(lo: float, hi: float, n: int = 3000, log: bool = False, signs: bool = False) -> torch.Tensor:
    if log:
        x = torch.exp(torch.linspace(math.log(lo), math.log(hi), n, dtype=f64))
    else:
        x = torch.linspace(lo, hi, n, dtype=f64)
    x = x.float()
    return torch.cat([x, -x]) if signs else x


# op -> (inputs, the largest relative error allowed against float64 where |f| > floor, floor)
ACCURACY = {
    "atan": (lambda: _sweep(1e-30, 1e30, log=True, signs=True), 4e-7, 0.0),
    "asin": (lambda: torch.cat([_sweep(1e-20, 1, log=True, signs=True), 1 - _sweep(6e-8, 1e-2, log=True)]), 4e-7, 0.0),
    "acos": (lambda: torch.cat([_sweep(-1, 1), 1 - _sweep(6e-8, 1e-2, log=True)]), 4e-7, 0.0),
    # (up to 88.7: past it eager's vectorized CPU loop overflows; test_sinh_cosh_near_fp32_overflow)
    "sinh": (lambda: _sweep(1e-30, 88.7, log=True, signs=True), 4e-7, 0.0),
    "cosh": (lambda: _sweep(1e-30, 88.7, log=True, signs=True), 4e-7, 0.0),
    "asinh": (lambda: _sweep(1e-30, 3e38, log=True, signs=True), 4e-7, 0.0),
    "acosh": (lambda: 1 + _sweep(1.2e-7, 1e38, log=True), 4e-7, 0.0),
    "atanh": (lambda: torch.cat([_sweep(1e-30, 1, log=True, signs=True), 1 - _sweep(6e-8, 1e-2, log=True)]), 4e-7, 0.0),
    "erfc": (lambda: torch.cat([_sweep(-10, 9), _sweep(1e-30, 9, log=True, signs=True)]), 6e-7, 0.0),
    "erfcx": (lambda: torch.cat([_sweep(-9, 30), _sweep(0.5, 1e30, log=True)]), 6e-7, 0.0),
    "erfinv": (lambda: torch.cat([_sweep(1e-30, 1, log=True, signs=True), 1 - _sweep(6e-8, 1e-2, log=True)]),
               4e-7, 0.0),
    "ndtri": (lambda: torch.cat([_sweep(0, 1), _sweep(1e-44, 0.5, log=True), 1 - _sweep(6e-8, 0.5, log=True)]),
              4e-7, 0.0),
    # lgamma of x > 0 (x < 0: test_lgamma_reflection_accuracy): near the minimum at 1.46, where
    # lgamma(x + 1) - log(x) cancels, an absolute error of 1e-7
    "lgamma": (lambda: torch.cat([_sweep(1e-30, 1e30, log=True), _sweep(0, 10, n=6000)]), 8e-7, 0.2),
    # digamma: eager's own algorithm (the recurrence loses digits near the root at 1.4616)
    "digamma": (lambda: torch.cat([_sweep(1e-30, 1e30, log=True), _sweep(-10, 20, n=6000)]), 1e-5, 0.5),
    "trigamma": (lambda: torch.cat([_sweep(1e-30, 1e30, log=True), _sweep(0, 20, n=6000)]), 1e-6, 0.0),
    "i0": (lambda: _sweep(1e-30, 88.0, log=True, signs=True), 5e-7, 0.0),
    "i0e": (lambda: _sweep(1e-30, 1e30, log=True, signs=True), 5e-7, 0.0),
    "i1": (lambda: _sweep(1e-30, 88.0, log=True, signs=True), 5e-7, 0.0),
    "i1e": (lambda: _sweep(1e-30, 1e30, log=True, signs=True), 5e-7, 0.0),
    "spherical_bessel_j0": (lambda: torch.cat([_sweep(1e-30, 1e4, log=True, signs=True), _sweep(-20, 20)]), 4e-7, 0.01),
}


@pytest.mark.parametrize("name", list(ACCURACY))
def test_fp32_accuracy(name: str) -> None:
    make, bound, floor = ACCURACY[name]
    x = make()
    fn = OPS_BY_NAME[name].fn
    out = check(fn, x)  # within fp32 tolerance of eager everywhere
    assert not fusebackend.metrics.fallbacks
    ref = fn(x.double())
    counted = ref.isfinite() & (ref.abs() > max(floor, 1.2e-38)) & (ref.abs() < 3.4e38)
    rel = ((out.double() - ref).abs() / ref.abs())[counted]
    if x.device.type != "cpu":  # compiled tl.exp is ex2.approx: a few ulp more for large arguments
        bound = max(bound, 2e-5)
    assert rel.max() <= bound, f"relative error {rel.max():.3g} at x = {x[counted][rel.argmax()].item()!r}"
    if floor:  # near the zeros: absolute error
        near = ref.isfinite() & (ref.abs() <= floor)
        assert (out.double() - ref).abs()[near].max() <= floor * bound * 4


def test_lgamma_reflection_accuracy() -> None:
    # x < 0: log(pi / |sin(pi x)|) - lgamma(1 - x). The result is a difference of terms as large
    # as lgamma(1 - x), each rounded to fp32: its error is relative to them and the result, not
    # to the result alone (which vanishes at -2.457, -2.748...). eager's glibc lgammaf does
    # better there.
    x = torch.cat([_sweep(-10, 0, n=6000), -_sweep(1e-30, 1e6, log=True)])
    out = check(torch.lgamma, x)
    assert not fusebackend.metrics.fallbacks
    ref = torch.lgamma(x.double())
    scale = ref.abs() + torch.lgamma(1 - x.double()).abs()
    finite = ref.isfinite()
    assert ((out.double() - ref).abs() / scale)[finite].max() <= 6e-7
    assert torch.equal(out.isinf(), ref.isinf())  # the poles


def test_lgamma_is_exactly_zero_at_one_and_two() -> None:
    # Poisson and binomial likelihoods take lgamma(n + 1) of small counts: 0 for n = 0 and 1.
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5])
    out = check_lowered(torch.lgamma, x)
    assert out[0] == 0 and out[1] == 0


# ----------------------------------------------------------------------- single behaviours


def test_round_half_even_exact_and_signed_zero() -> None:
    # Ties to even, integers from 2^23 on (x + 0.5 would round there), and a zero result keeps
    # the sign of x, as eager's nearbyint.
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, -0.3, 0.49999997, 8388609.0, -8388609.0, 16777215.0, 1e30,
                      -0.0, math.nan, math.inf, -math.inf])
    out = check_lowered(torch.round, x, atol=0.0, rtol=0.0)
    _same_signed_zeros(out, torch.round(x))


@pytest.mark.parametrize("decimals", [-2, -1, 1, 3, 5])
def test_round_decimals(decimals: int) -> None:
    # The same fp32 arithmetic as ATen (x * 10^d, nearest even, / 10^d): equal bit for bit.
    x = torch.randn(200) * 10 ** (2 - min(decimals, 2))
    x[::7] = torch.randint(-400, 400, (29,)) * 0.5 * 10.0 ** -decimals  # exact ties
    out = check_lowered(lambda t: torch.round(t, decimals=decimals), x, atol=0.0, rtol=0.0)
    _same_signed_zeros(out, torch.round(x, decimals=decimals))


def test_round_decimals_past_the_double_range_stays_aten() -> None:
    x = torch.randn(20)
    check(lambda t: torch.round(t, decimals=400), x)
    assert dict(fusebackend.metrics.fallbacks) == {"round": 1}


def test_fmax_fmin_signed_zeros_and_nan() -> None:
    # A NaN loses to a number (two NaNs give NaN); between +0 and -0 the first argument wins, as
    # in eager on the CPU (CUDA's fmax instruction may pick either zero).
    nan = math.nan
    a = torch.tensor([nan, 1.0, nan, 0.0, -0.0, -math.inf, 2.0])
    b = torch.tensor([1.0, nan, nan, -0.0, 0.0, nan, 3.0])
    for fn in (torch.fmax, torch.fmin):
        out = check_lowered(fn, a, b, atol=0.0, rtol=0.0)
        if a.device.type == "cpu":
            _same_signed_zeros(out, fn(a, b))


def test_near_fp32_overflow() -> None:
    # sinh and cosh stay finite up to 89.41, i0 and i1 up to 91.9 (exp overflows at 88.72).
    # Eager's vectorized CPU loop gives inf from 88.72 on (its scalar loop and CUDA agree with
    # the function for sinh). We follow the function: compared with float64 here.
    x = torch.tensor([88.5, 88.75, 89.0, 89.4, 89.5, -88.9, -89.3, 90.5, 91.8, 92.0])
    # On a GPU, compiled Triton's exp is an approximate 2^(x log2 e): the rounding of x log2 e
    # costs up to |x| log2(e) 2^-24 of relative error, 8e-6 at 92 (Inductor's exp is the same).
    rtol = 1e-6 if x.device.type == "cpu" else 1e-5
    for fn in (torch.sinh, torch.cosh, torch.i0, S.i1):
        out = torch.compile(fn, backend="fuse")(x)
        torch.testing.assert_close(out, fn(x.double()).float(), rtol=rtol, atol=0.0)
    assert not fusebackend.metrics.fallbacks


def test_trigamma_poles_and_negative_arguments() -> None:
    # Reflection with an exact sin(pi x): +inf at 0 and the negative integers. Eager computes
    # sin(pi * x) after rounding pi * x, which gives about 1e15 at the poles and loses digits as
    # |x| grows (at x = -8011.0001 it is off by a factor of 400), so float64 is the reference.
    poles = torch.tensor([0.0, -0.0, -1.0, -2.0, -17.0, -1e6])
    out = torch.compile(lambda x: torch.polygamma(1, x), backend="fuse")(poles)
    assert torch.equal(out, torch.full_like(poles, math.inf))
    x = _sweep(-30, 0, n=5000)
    x = x[(x - x.round()).abs() > 1e-3]
    out = torch.compile(lambda x: torch.polygamma(1, x), backend="fuse")(x)
    ref = torch.polygamma(1, x.double())
    assert ((out.double() - ref).abs() / ref.abs()).max() <= 2e-6
    assert not fusebackend.metrics.fallbacks and kernel_count() == 2


def test_gcd_worst_case_and_signs() -> None:
    # Consecutive Fibonacci numbers take the most steps (45 for int32, 91 for int64); zeros and
    # signs as eager (gcd(0, 0) = 0, results non-negative, lcm |a / g * b|).
    fib = [0, 1]
    while len(fib) < 93:
        fib.append(fib[-1] + fib[-2])
    for dtype, n in ((i32, 46), (i64, 92)):
        a = torch.tensor([fib[n], fib[n - 1], 0, 0, -12, 12, -7, 1], dtype=dtype)
        b = torch.tensor([fib[n - 1], fib[n], 0, -5, 18, -18, 0, 1], dtype=dtype)
        out = check_lowered(torch.gcd, a, b)
        assert out[0] == 1 and out[1] == 1
        check_lowered(torch.lcm, a[2:], b[2:])


def test_ldexp_overflow_and_underflow() -> None:
    # Rounded once, with no overflow on the way: ldexp(1e-30, 129) is finite, ldexp(0, 300) is 0,
    # 0.75 * 2^-149 rounds to the smallest subnormal.
    x = torch.tensor([1.0, 3.0, -1.5, 1e30, 1e-30, 0.75, 2.0, 0.0, 1e-30, 0.75, 1e-40, -3e38])
    e = torch.tensor([128, 127, -126, -149, 60, -150, 200, 300, 129, -149, 200, -2000], dtype=i32)
    check_lowered(torch.ldexp, x, e, atol=0.0, rtol=0.0)


@pytest.mark.parametrize("dtype", FLOATS, ids=_dtype_id)
def test_frexp(dtype: torch.dtype) -> None:
    # Two outputs, one kernel: the mantissa (in [0.5, 1), with the sign; zeros, infinities and
    # NaN as they are, with exponent 0) and the int32 exponent, subnormals included.
    # (bf16 subnormals are left out: the interpreter converts them to fp32 wrongly.)
    subnormals = [1e-40, -1e-45, 1e-38] if dtype != bf16 or _on_gpu() else []
    x = torch.cat([torch.randn(50) * 1e3, torch.tensor([0.0, -0.0, 1.0, -3.0, 3e38, 0.75, math.inf, -math.inf,
                                                        math.nan] + subnormals)]).to(dtype)
    m, e = check_lowered(torch.frexp, x, atol=0.0, rtol=0.0)
    numbers = ~x.isnan()  # (a NaN's sign bit is the platform's choice)
    assert e.dtype == i32 and torch.equal(torch.signbit(m[numbers]), torch.signbit(torch.frexp(x).mantissa[numbers]))
    assert kernel_count() == 1
    xt = torch.randn(6, 9, dtype=dtype).t()
    m, e = check_lowered(torch.frexp, xt, atol=0.0, rtol=0.0)
    assert m.stride() == e.stride() == torch.frexp(xt).mantissa.stride()


def test_helpers_get_tensors_for_literal_arguments() -> None:
    # A constant tensor produced in the same kernel is inlined as a literal; a helper gets it as
    # a 0-dim tensor (tl.full), since it may bitcast it.
    x, y = torch.randn(50), torch.randn(50)
    check_lowered(lambda x, y: (torch.copysign(torch.ones_like(x), y), torch.atan2(torch.full_like(x, -2.0), y),
                                torch.hypot(x, torch.zeros_like(y))), x, y)
    sources = "\n".join(kernels().values())
    assert "th.copysign(tl.full([]," in sources and "th.atan2(tl.full([]," in sources


def test_float64_approximations_stay_aten_calls() -> None:
    # The fitted device functions are accurate to fp32: in fp64 those ops stay ATen calls...
    # (and so do fp64 ldexp, whose fp32 kernel multiplies in fp64, and polygamma of order 2 and
    # higher in any dtype)
    x, e = torch.rand(40, dtype=f64) + 0.5, torch.randint(-5, 5, (40,), dtype=i32)
    check(lambda x, e: (torch.lgamma(x), torch.atan(x), torch.erfinv(x - 1), torch.ldexp(x, e),
                        torch.polygamma(2, x.float())), x, e)
    assert dict(fusebackend.metrics.fallbacks) == {"lgamma": 1, "atan": 1, "erfinv": 1, "ldexp": 1, "polygamma": 1}


def test_float64_exact_ops_are_generated() -> None:
    # ...while those exact in any float type are generated in fp64 too.
    x, y = torch.randn(40, dtype=f64) * 3, torch.randn(40, dtype=f64)
    check_lowered(lambda x, y: (torch.hypot(x, y), torch.copysign(x, y), torch.signbit(y), torch.fmax(x, y),
                                torch.cosh(x), torch.round(x, decimals=1), torch.nextafter(x, y), torch.angle(y)), x, y)


def test_chain_fuses_into_one_kernel() -> None:
    x = torch.rand(300) * 4 + 0.1
    check_lowered(lambda x: torch.lgamma(x) + torch.digamma(x) * torch.erfinv(torch.tanh(x - 2))
                  - torch.atan2(x, 1 - x), x)
    assert kernel_count() == 1


def test_mvlgamma_reduction_of_lgamma() -> None:
    # multigammaln decomposes to lgamma of a broadcast sum: pointwise and reduction, all generated.
    x = torch.rand(6, 5) * 3 + 2
    check_lowered(lambda x: torch.mvlgamma(x, p=3), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_quotient_or_root_rounded_to_half_precision_is_approximate(dtype: torch.dtype) -> None:
    """fp32 division and square root are correctly rounded (th.div, th.sqrt) where their fp32
    result is kept; rounded to bf16 or fp16 at once, Triton's approximate ``/`` and ``tl.sqrt``
    (within 2 ulp of fp32) give the same half-precision value but for a rare unit in the last
    place, and per element the correctly rounded sequences cost a GRN's output kernel 60% more
    time (``codegen/fast_math.rounded_to_half``). A per-channel ratio as ConvNeXt V2's GRN makes."""
    x = (torch.randn(3, 7, 9, 40) * 4).to(dtype)
    g = (torch.rand(3, 1, 1, 40) + 0.5).to(dtype)
    check(lambda x, g: x * (g / (g.mean(-1, keepdim=True) + 1e-6)) + torch.sqrt(x.abs()), x, g)
    source = "\n".join(kernels().values())  # the mean's kernel, and the one that divides
    assert "th.div(" not in source and "th.sqrt(" not in source, source
    assert " / " in source and "tl.sqrt(" in source


def test_a_quotient_or_root_kept_in_fp32_stays_correctly_rounded() -> None:
    x, g = torch.randn(5, 40), torch.rand(5, 40) + 0.5
    check(lambda x, g: x / g + torch.sqrt(g), x, g)
    (source,) = kernels().values()
    assert "th.div(" in source and "th.sqrt(" in source and " / " not in source
