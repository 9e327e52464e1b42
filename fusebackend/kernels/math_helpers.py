"""Device functions for the special math functions: inverse trigonometric and hyperbolic
functions, error functions, and sign-bit, nextafter and gcd helpers.

Generated kernels call them as ``th.<name>`` (``triton_helpers`` imports them; the gamma and
Bessel functions are in ``special_helpers``). They are written with Triton builtins only, as
every helper is (no libdevice: the interpreter lacks it), and take fp32 tensors, except those
exact in any float type (``signbit``, ``copysign``, ``hypot``, ``nextafter``, which also take
fp64) and ``gcd`` (integers); the lowerings (``lowering/math_ops.py``) keep every other function
of fp64 an ATen call.

The polynomials here and in ``special_helpers`` are our own near-minimax fits (least squares on
Chebyshev nodes, reweighted towards the largest error, against 40-digit mpmath values),
evaluated with fma. Accuracy, as the largest relative error against float64 over the fp32
domain, measured in the interpreter (tests/test_math_ops.py, test_fp32_accuracy): atan, atan2,
asin, acos, sinh, cosh, asinh, acosh, atanh, erfinv, ndtri, hypot: <= 4e-7 (eager: about
1.2e-7); erfc, erfcx: <= 6e-7 where the result is a normal float; lgamma of x > 0: <= 8e-7,
exactly 0 at 1 and 2, 1e-7 absolute near its minimum; lgamma of x < 0: <= 6e-7 of
|lgamma(x)| + |lgamma(1 - x)| (the reflection cancels near the zeros at -2.457, -2.748...);
digamma: eager's own fp32 algorithm, within 0.1 of the fp32 test tolerance of it. Compiled for a
GPU, tl.exp is ex2.approx: exp-based results (sinh, cosh, erfc for large arguments) lose a few
ulp more there.
"""

import triton
import triton.language as tl

# ---------------------------------------------------------------- IEEE negation, division, root


@triton.jit
def neg(x):
    # A float's sign bit flipped, so that -(0.0) is -0.0 as in eager: Triton 3.6 compiles a
    # float's unary minus as 0 - x, which is +0.0 for 0.0. Multiplying by -1 is exact.
    if x.dtype.is_floating():
        return x * -1.0
    else:
        return 0 - x


@triton.jit
def div(a, b):
    # Correctly rounded, as eager's division: Triton 3.6 compiles an fp32 "/" to div.full.f32,
    # up to 2 ulp off (a rounding of 1.0 / 10 ** 3 came out one ulp off). fp64 "/" is exact.
    q = a / b
    if q.dtype == tl.float32:
        q = tl.math.div_rn(a, b)
    return q


@triton.jit
def sqrt(x):
    # Correctly rounded, as eager's: tl.sqrt is the fast approximate root for fp32.
    if x.dtype == tl.float32:
        return tl.math.sqrt_rn(x)
    else:
        return tl.sqrt(x)


# ------------------------------------------------------------------------------- bit tests


@triton.jit
def signbit(x):
    # The sign bit itself, so that -0.0 and NaNs with the bit set count as negative.
    if x.dtype == tl.float64:
        return x.to(tl.int64, bitcast=True) < 0
    else:
        return x.to(tl.int32, bitcast=True) < 0


@triton.jit
def copysign(a, b):
    # Negation and abs only flip or clear the sign bit (NaN payloads stay as they are).
    a, b = tl.broadcast(a, b)
    m = tl.abs(a)
    return tl.where(signbit(b), neg(m), m)


@triton.jit
def hypot(a, b):
    # sqrt(a^2 + b^2) scaled by the larger magnitude, so that neither overflows nor underflows;
    # an infinite side wins over a NaN on the other, as in C.
    a, b = tl.broadcast(a, b)  # a 0-dim argument (a literal) is widened before any comparison
    a = tl.abs(a)
    b = tl.abs(b)
    big = tl.where(a > b, a, b)
    small = tl.where(a > b, b, a)
    r = small / tl.where(big == 0.0, 1.0, big)
    h = big * tl.sqrt(1.0 + r * r)
    return tl.where((a == float("inf")) | (b == float("inf")), float("inf"), h)


# ----------------------------------------------------------------- inverse trigonometry


@triton.jit
def _atan_reduced(t):
    # atan(t) for |t| <= tan(pi/8): t + t^3 P(t^2), relative error 5e-8
    s = t * t
    p = tl.fma(s, -6.4563736124e-02, 1.0745265511e-01)
    p = tl.fma(p, s, -1.4264121401e-01)
    p = tl.fma(p, s, 1.9999546242e-01)
    p = tl.fma(p, s, -3.3333331793e-01)
    return tl.fma(t * s, p, t)


@triton.jit
def _atan_nonneg(a):
    # atan(a) for a >= 0 (inf included): a, (a - 1) / (a + 1) or -1 / a lands in [-tan(pi/8),
    # tan(pi/8)], offset by 0, pi/4 or pi/2.
    mid = a > 0.41421356237309503
    far = a > 2.414213562373095
    t = tl.where(far, -1.0 / a, tl.where(mid, (a - 1.0) / (a + 1.0), a))
    base = tl.where(far, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    return base + _atan_reduced(t)


@triton.jit
def atan(x):
    return copysign(_atan_nonneg(tl.abs(x)), x)


@triton.jit
def atan2(y, x):
    # The first-quadrant angle of (|x|, |y|) from the smaller over the larger side (in [0, 1], so
    # no overflow), then mirrored: past the diagonal, into the left half-plane (x < 0 or -0.0),
    # and to y's sign. Zeros and infinities land on C's atan2 values (atan2(+-0, -0) = +-pi,
    # atan2(+-inf, -inf) = +-3pi/4...).
    y, x = tl.broadcast(y, x)
    ax = tl.abs(x)
    ay = tl.abs(y)
    big = tl.where(ay > ax, ay, ax)
    small = tl.where(ay > ax, ax, ay)
    both_inf = (ax == float("inf")) & (ay == float("inf"))
    t = tl.where(both_inf, 1.0, small / tl.where(big == 0.0, 1.0, big))
    a = _atan_nonneg(t)
    a = tl.where(ay > ax, 1.5707963267948966 - a, a)
    a = tl.where(signbit(x), 3.141592653589793 - a, a)
    return tl.where((x != x) | (y != y), x + y, copysign(a, y))


# ------------------------------------------------------------------- hyperbolic functions


@triton.jit
def sinh(x):
    # Taylor series below 1, where exp(x) - exp(-x) would cancel; above, half the difference,
    # and from 88 on (exp overflows, sinh not yet) exp(x/2)^2 / 2.
    ax = tl.abs(x)
    s = x * x
    p = tl.fma(s, 2.505210838544172e-08, 2.755731922398589e-06)
    p = tl.fma(p, s, 1.984126984126984e-04)
    p = tl.fma(p, s, 8.333333333333333e-03)
    p = tl.fma(p, s, 1.6666666666666666e-01)
    small = tl.fma(x * s, p, x)
    e = tl.exp(ax)
    h = tl.exp(0.5 * ax)
    big = tl.where(ax < 88.0, 0.5 * e - 0.5 / e, (0.5 * h) * h)
    return tl.where(ax < 1.0, small, copysign(big, x))


@triton.jit
def _log1p(x):
    # log(u) * x / (u - 1) with u = 1 + x, as triton_helpers.log1p (which imports this module);
    # only called with finite x here
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def asinh(x):
    # log1p(a + a^2 / (1 + sqrt(1 + a^2))) keeps the digits near 0; from 2^12 on, where the 1
    # no longer counts and a^2 would later overflow, log(2a).
    a = tl.abs(x)
    s = a * a
    near = _log1p(a + s / (1.0 + tl.sqrt(1.0 + s)))
    far = tl.log(a) + 0.6931471805599453
    return copysign(tl.where(a < 4096.0, near, far), x)


@triton.jit
def acosh(x):
    # log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact) keeps the digits near 1; log(2x) far out.
    t = x - 1.0
    near = _log1p(t + tl.sqrt(t * (t + 2.0)))
    far = tl.log(x) + 0.6931471805599453
    r = tl.where(x < 4096.0, near, far)
    return tl.where(x < 1.0, float("nan"), r)


# ---------------------------------------------------------------------- error functions


@triton.jit
def _exp_square(x, sign):
    # exp(sign * x^2) without the rounding of x^2 growing with x: x = hi + lo where hi keeps 12
    # bits, so hi^2 is exact and only the small part hi^2 - x^2 = (hi - x)(hi + x) is rounded.
    hi = (x.to(tl.int32, bitcast=True) & -4096).to(tl.float32, bitcast=True)
    return tl.exp(sign * hi * hi) * tl.exp(-sign * ((hi - x) * (hi + x)))


@triton.jit
def _erfcx_tail(x):
    # exp(x^2) erfc(x) for x >= 0.5 (inf included) as t P(t) with t = 2 / (2 + x), relative
    # error 5e-9 before fp32 rounding.
    t = 2.0 / (2.0 + x)
    p = tl.fma(t, 2.5113386504e-02, -1.6412227076e-01)
    p = tl.fma(p, t, 3.7705449209e-01)
    p = tl.fma(p, t, -3.4889643718e-01)
    p = tl.fma(p, t, 7.4265558058e-02)
    p = tl.fma(p, t, -3.9798748865e-02)
    p = tl.fma(p, t, 8.9538465763e-02)
    p = tl.fma(p, t, 1.7576635470e-01)
    p = tl.fma(p, t, 2.4685868598e-01)
    p = tl.fma(p, t, 2.8209432135e-01)
    p = tl.fma(p, t, 2.8209479318e-01)
    return t * p


@triton.jit
def erfc(x):
    # 1 - erf(x) where that does not cancel (x < 0.5); exp(-x^2) erfcx(x) beyond. Past 20 the
    # result is 0 in fp32 (clamped, so that inf gives no inf - inf).
    xc = tl.where(x > 20.0, 20.0, x)
    tail = _exp_square(xc, -1.0) * _erfcx_tail(xc)
    return tl.where(x < 0.5, 1.0 - tl.erf(x), tail)


@triton.jit
def erfcx(x):
    # exp(x^2) erfc(x): the tail fit from 0.5 on; below, exp(x^2) (1 - erf(x)), which overflows
    # to inf below about -9.4, as the function does in fp32 (clamped so that -inf gives inf).
    xc = tl.where(x < -20.0, -20.0, x)
    near = _exp_square(xc, 1.0) * (1.0 - tl.erf(xc))
    return tl.where(x < 0.5, near, _erfcx_tail(x))


@triton.jit
def _erfinv_given_w(x, w):
    # erfinv(x) = x P(w) with w = -log((1 - x)(1 + x)), passed in by the caller so that ndtri
    # can compute it from p without rounding 2p - 1. Three fits: w < 5 in w; then in sqrt(w),
    # up to 4 (the last fp32 below 1) and up to 10.2 (ndtri's smallest p).
    v = w - 2.5
    c = tl.fma(v, -8.7911832812e-09, 2.3232710624e-08)
    c = tl.fma(c, v, 4.6617241413e-07)
    c = tl.fma(c, v, -3.4627055728e-06)
    c = tl.fma(c, v, -4.9633558563e-06)
    c = tl.fma(c, v, 2.1834444252e-04)
    c = tl.fma(c, v, -1.2527418650e-03)
    c = tl.fma(c, v, -4.1773867848e-03)
    c = tl.fma(c, v, 2.4664028615e-01)
    c = tl.fma(c, v, 1.5014093593e+00)
    s = tl.sqrt(w)
    u = s - 3.0
    m = tl.fma(u, 1.2896687653e-04, -3.1872709805e-04)
    m = tl.fma(m, u, -7.6622032174e-05)
    m = tl.fma(m, u, 1.4958612889e-03)
    m = tl.fma(m, u, -3.5869870203e-03)
    m = tl.fma(m, u, 5.6831706846e-03)
    m = tl.fma(m, u, -7.6394100493e-03)
    m = tl.fma(m, u, 9.4456843799e-03)
    m = tl.fma(m, u, 1.0016750868e+00)
    m = tl.fma(m, u, 2.8329767957e+00)
    v = s - 7.0
    f = tl.fma(v, 1.6167138193e-08, -9.4513256766e-08)
    f = tl.fma(f, v, 2.3230707745e-07)
    f = tl.fma(f, v, -1.2968223100e-06)
    f = tl.fma(f, v, 6.4237168077e-06)
    f = tl.fma(f, v, 5.3921209288e-06)
    f = tl.fma(f, v, -5.1326403237e-04)
    f = tl.fma(f, v, 1.0085962633e+00)
    f = tl.fma(f, v, 6.8690198225e+00)
    return x * tl.where(w < 5.0, c, tl.where(s < 4.0, m, f))


@triton.jit
def erfinv(x):
    r = _erfinv_given_w(x, -tl.log((1.0 - x) * (1.0 + x)))  # NaN outside [-1, 1]
    return tl.where(tl.abs(x) == 1.0, x * float("inf"), r)


@triton.jit
def ndtri(p):
    # The normal quantile sqrt(2) erfinv(2p - 1), with (1 - x)(1 + x) = 4p(1 - p) exact for
    # small p, where 2p - 1 has already rounded to -1.
    r = 1.4142135623730951 * _erfinv_given_w(2.0 * p - 1.0, -tl.log(4.0 * p * (1.0 - p)))
    return tl.where(p == 0.0, float("-inf"), tl.where(p == 1.0, float("inf"), r))


# ------------------------------------------------------------------------ bits and integers


@triton.jit
def nextafter(x, y):
    # The neighbour of x towards y: one step of the bit pattern, up in magnitude when moving
    # away from zero (floats order as sign-magnitude integers). From +-0 the smallest subnormal
    # with y's sign; x == y gives y (so nextafter(0, -0) is -0); NaN in, NaN out.
    x, y = tl.broadcast(x, y)
    if x.dtype == tl.float64:
        bits = x.to(tl.int64, bitcast=True)
        tiny = tl.full(bits.shape, 1, tl.int64).to(tl.float64, bitcast=True)
    else:
        bits = x.to(tl.int32, bitcast=True)
        tiny = tl.full(bits.shape, 1, tl.int32).to(tl.float32, bitcast=True)
    away = (y > x) == (x > 0.0)
    r = tl.where(away, bits + 1, bits - 1).to(x.dtype, bitcast=True)
    r = tl.where(x == 0.0, copysign(tiny, y), r)
    r = tl.where(x == y, y, r)
    return tl.where((x != x) | (y != y), x + y, r)


@triton.jit
def ldexp(x, e):
    # x * 2^e (x fp32, e an integer) rounded once, as C's ldexp: the product is exact in fp64
    # wherever the fp32 result is neither 0 nor inf (e clamped to +-1000 changes neither), and
    # 2^e is built from its bits.
    x, e = tl.broadcast(x, e)
    k = tl.minimum(tl.maximum(e.to(tl.int64), -1000), 1000)
    power = ((k + 1023) << 52).to(tl.float64, bitcast=True)
    return (x.to(tl.float64) * power).to(tl.float32)


@triton.jit
def _frexp_parts(x):
    # fp32 x = m * 2^e with 0.5 <= |m| < 1, from the bits; a subnormal is scaled by 2^25 first
    tiny = tl.abs(x) < 1.1754943508222875e-38
    bits = tl.where(tiny, x * 33554432.0, x).to(tl.int32, bitcast=True)
    field = (bits >> 23) & 255
    special = (x == 0.0) | (field == 255)  # zeros, infinities and NaN: (x, 0), as ATen
    m = ((bits & -2139095041) | 1056964608).to(tl.float32, bitcast=True)  # 0x807FFFFF, 126 << 23
    e = field - tl.where(tiny, 151, 126)
    return tl.where(special, x, m), tl.where(special, 0, e)


@triton.jit
def frexp_mantissa(x):
    m, _ = _frexp_parts(x)
    return m


@triton.jit
def frexp_exponent(x):
    _, e = _frexp_parts(x)
    return e


@triton.jit
def _euclid(a, b, steps: tl.constexpr):
    # gcd of a, b >= 0 in a fixed number of steps; lanes that finish keep b == 0
    for _ in range(steps):
        more = b != 0
        r = a % tl.where(more, b, 1)
        a = tl.where(more, b, a)
        b = tl.where(more, r, b)
    return a


@triton.jit
def gcd(a, b):
    # Euclid's algorithm on the magnitudes, as many steps as the worst case (consecutive
    # Fibonacci numbers) takes: 45 for int32, 91 for int64. As ATen: gcd(0, 0) = 0, and the abs
    # of the most negative integer stays negative.
    a, b = tl.broadcast(a, b)
    if a.dtype == tl.int64:
        return _euclid(tl.abs(a), tl.abs(b), 92)
    else:
        return _euclid(tl.abs(a), tl.abs(b), 46)
