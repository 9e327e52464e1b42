"""Device functions for the gamma-family and modified Bessel functions: lgamma, digamma,
trigamma, i0, i0e, i1, i1e.

Generated kernels call them as ``th.<name>`` (``triton_helpers`` imports them). Like
``math_helpers`` (which says how the fits were made and how accurate they are), Triton builtins
only, fp32 tensors in and out. The Bessel fits: |x| <= 8 a polynomial in x^2/64 with positive
coefficients, beyond it sqrt(x) exp(-x) I(x) as a polynomial in 8/x; relative error 2e-7.
"""

import triton
import triton.language as tl

from fusebackend.kernels.math_helpers import neg, signbit

# ---------------------------------------------------------------------- gamma functions


@triton.jit
def _sinpi(r):
    # sin(pi r) for |r| <= 1/2, relative error 5e-9
    s = r * r
    p = tl.fma(s, 7.7560383247e-02, -5.9824212449e-01)
    p = tl.fma(p, s, 2.5500697260e+00)
    p = tl.fma(p, s, -5.1677096848e+00)
    p = tl.fma(p, s, 3.1415926369e+00)
    return r * p


@triton.jit
def _cospi(r):
    # cos(pi r) for |r| <= 1/2, absolute error 2e-10
    s = r * r
    p = tl.fma(s, -2.4396715783e-02, 2.3493755844e-01)
    p = tl.fma(p, s, -1.3352120566e+00)
    p = tl.fma(p, s, 4.0587091643e+00)
    p = tl.fma(p, s, -4.9348021372e+00)
    return tl.fma(p, s, 9.9999999978e-01)


@triton.jit
def _reduce_half(x):
    # x minus its nearest integer, in [-1/2, 1/2], exactly (sin(pi x) and cot(pi x) repeat).
    # x - floor(x) is exact from |x| >= 1/2 on; below, x itself is the answer.
    f = x - tl.floor(x)
    return tl.where(tl.abs(x) <= 0.5, x, tl.where(f > 0.5, f - 1.0, f))


@triton.jit
def _lgamma_near2(z):
    # lgamma(2 + z) for |z| <= 1/2, as z P(z): exactly 0 at z = 0, relative error 2.4e-9
    p = tl.fma(z, -2.6984333108e-04, 5.6982242772e-04)
    p = tl.fma(p, z, -1.1778459540e-03)
    p = tl.fma(p, z, 2.8790563786e-03)
    p = tl.fma(p, z, -7.3874265665e-03)
    p = tl.fma(p, z, 2.0581601959e-02)
    p = tl.fma(p, z, -6.7352218836e-02)
    p = tl.fma(p, z, 3.2246701878e-01)
    p = tl.fma(p, z, 4.2278433451e-01)
    return z * p


@triton.jit
def _lgamma_nonneg(x):
    # lgamma(x) for x >= 0 through lgamma(x + 1) = lgamma(x) + log(x), anchored at the fit
    # around 2 (which keeps the roots at 1 and 2 exact):
    #   [0, 1/2): lgamma(x + 2) - log(x (1 + x))     [1/2, 3/2): lgamma(x + 1) - log(x)
    #   [3/2, 5/2): the fit                          [5/2, 8): lgamma(x - k) + log((x-1)..(x-k))
    #   [8, inf): Stirling's series.
    # Every shifted argument below 8 is exact in fp32.
    k = tl.where(x < 2.5, 0.0, tl.floor(x - 1.5))
    z = tl.where(x < 0.5, x, tl.where(x < 1.5, x - 1.0, x - k - 2.0))
    prod = tl.where(x < 2.5, 1.0, x - 1.0)
    for j in tl.static_range(2, 7):
        prod = tl.where(k >= j, prod * (x - j), prod)
    below = tl.where(x < 0.5, x * (1.0 + x), x)
    shift = tl.where(x < 1.5, -tl.log(below), tl.log(prod))
    small = _lgamma_near2(z) + shift
    lx = tl.log(x)
    r = 1.0 / x
    r2 = r * r
    series = r * tl.fma(r2, tl.fma(r2, tl.fma(r2, -5.952380952380953e-04, 7.936507936507937e-04),
                                   -2.777777777777778e-03), 8.333333333333333e-02)
    stirling = x * (lx - 1.0) - 0.5 * lx + 0.9189385332046727 + series
    return tl.where(x < 8.0, small, stirling)


@triton.jit
def lgamma(x):
    # Negative x by reflection: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x), inf at the
    # poles (negative integers, zero) and at +-inf.
    neg = x < 0.0
    g = _lgamma_nonneg(tl.where(neg, 1.0 - x, x))
    reflected = 1.1447298858494002 - tl.log(tl.abs(_sinpi(_reduce_half(x)))) - g
    r = tl.where(neg, reflected, g)
    return tl.where(tl.abs(x) == float("inf"), float("inf"), r)


@triton.jit
def digamma(x):
    # As ATen computes it: psi(y) = psi(y + 1) - 1/y up to y >= 10, then the asymptotic series
    # log(y) - 1/(2y) - sum B2k / (2k y^2k); negative x by reflection, psi(1 - x) - pi cot(pi x).
    # Poles: NaN at negative integers and -inf, -inf at +0 and +inf at -0 (as eager).
    neg = x < 0.0
    y = tl.where(neg, 1.0 - x, x)
    acc = tl.full(y.shape, 0.0, tl.float32)
    for _ in tl.static_range(10):
        below = y < 10.0
        acc += tl.where(below, 1.0 / y, 0.0)
        y = tl.where(below, y + 1.0, y)
    r = 1.0 / y
    r2 = r * r
    series = r2 * tl.fma(r2, tl.fma(r2, tl.fma(r2, -4.1666666666666664e-03, 3.968253968253968e-03),
                                    -8.333333333333333e-03), 8.333333333333333e-02)
    psi = tl.log(y) - 0.5 * r - series - acc
    t = _reduce_half(x)
    reflected = psi - 3.141592653589793 * _cospi(t) / _sinpi(t)
    psi = tl.where(neg, tl.where(t == 0.0, float("nan"), reflected), psi)
    return tl.where(x == 0.0, tl.where(signbit(x), float("inf"), float("-inf")), psi)


@triton.jit
def trigamma(x):
    # psi'(y) = sum over k of 1/(y + k)^2: six terms, then the asymptotic series at t = y + 6,
    # 1/t + 1/(2t^2) + 1/(6t^3) - 1/(30t^5) + 1/(42t^7); x < 1/2 by reflection,
    # pi^2 / sin^2(pi x) - psi'(1 - x), which is +inf at the poles (0, -1, -2...).
    neg = x < 0.5
    y = tl.where(neg, 1.0 - x, x)
    acc = 1.0 / (y * y)
    for k in tl.static_range(1, 6):
        acc += 1.0 / ((y + k) * (y + k))
    r = 1.0 / (y + 6.0)
    r2 = r * r
    tail = r + r2 * tl.fma(r, tl.fma(r2, tl.fma(r2, 2.380952380952381e-02, -3.333333333333333e-02),
                                     1.6666666666666666e-01), 0.5)
    psi1 = acc + tail
    s = _sinpi(_reduce_half(x))
    return tl.where(neg, 9.869604401089358 / (s * s) - psi1, psi1)


# ------------------------------------------------------------------ modified Bessel functions


@triton.jit
def _bessel_i0_near(x):
    # I0(x) for |x| <= 8 as a polynomial in x^2/64 (positive coefficients: no cancellation),
    # relative error 9e-9
    u = x * x * 0.015625
    p = tl.fma(u, 1.0297146351e+00, 1.6369644883e+00)
    p = tl.fma(p, u, 1.1585264544e+01)
    p = tl.fma(p, u, 3.1772603498e+01)
    p = tl.fma(p, u, 7.3019772435e+01)
    p = tl.fma(p, u, 1.1373801314e+02)
    p = tl.fma(p, u, 1.1378198342e+02)
    p = tl.fma(p, u, 6.3999792184e+01)
    p = tl.fma(p, u, 1.6000003581e+01)
    return tl.fma(p, u, 9.9999999112e-01)


@triton.jit
def _bessel_i1_near(x):
    # I1(x) for |x| <= 8 as x times a polynomial in x^2/64, relative error 2e-9
    u = x * x * 0.015625
    p = tl.fma(u, 4.9547509854e-02, 9.8644771943e-02)
    p = tl.fma(p, u, 7.1152541022e-01)
    p = tl.fma(p, u, 2.2803072275e+00)
    p = tl.fma(p, u, 6.0796397747e+00)
    p = tl.fma(p, u, 1.1375314930e+01)
    p = tl.fma(p, u, 1.4222511711e+01)
    p = tl.fma(p, u, 1.0666650327e+01)
    p = tl.fma(p, u, 4.0000003337e+00)
    return x * tl.fma(p, u, 4.9999999897e-01)


@triton.jit
def _bessel_i0e_far(a):
    # exp(-a) I0(a) for a >= 8 (inf included) as a polynomial in 8/a over sqrt(a), error 1.2e-9
    v = 8.0 / a
    p = tl.fma(v, 6.9721680451e-06, -9.3274958086e-06)
    p = tl.fma(p, v, 2.0783167731e-05)
    p = tl.fma(p, v, 5.3224169366e-05)
    p = tl.fma(p, v, 4.3898157798e-04)
    p = tl.fma(p, v, 6.2334273726e-03)
    p = tl.fma(p, v, 3.9894228089e-01)
    return p / tl.sqrt(a)


@triton.jit
def _bessel_i1e_far(a):
    # exp(-a) I1(a) for a >= 8, as _bessel_i0e_far, error 1.4e-9
    v = 8.0 / a
    p = tl.fma(v, -7.9197813710e-06, 1.0303780974e-05)
    p = tl.fma(p, v, -2.5245527517e-05)
    p = tl.fma(p, v, -7.5506062927e-05)
    p = tl.fma(p, v, -7.3127868741e-04)
    p = tl.fma(p, v, -1.8700366389e-02)
    p = tl.fma(p, v, 3.9894227983e-01)
    return p / tl.sqrt(a)


@triton.jit
def _times_exp(scaled, a):
    # scaled * exp(a), exp(a/2) twice so that it overflows only where the product does. At
    # a = inf that is 0 * inf = NaN, which is what ATen gives for i0(+-inf) and i1(+-inf).
    h = tl.exp(0.5 * a)
    return (scaled * h) * h


@triton.jit
def i0(x):
    a = tl.abs(x)
    return tl.where(a <= 8.0, _bessel_i0_near(x), _times_exp(_bessel_i0e_far(a), a))


@triton.jit
def i0e(x):
    a = tl.abs(x)
    return tl.where(a <= 8.0, _bessel_i0_near(x) * tl.exp(-a), _bessel_i0e_far(a))


@triton.jit
def i1(x):
    # odd: computed at |x|, negated below 0 (so i1(-0.0) is +0.0, as ATen gives)
    a = tl.abs(x)
    r = tl.where(a <= 8.0, _bessel_i1_near(a), _times_exp(_bessel_i1e_far(a), a))
    return tl.where(x < 0.0, neg(r), r)


@triton.jit
def i1e(x):
    a = tl.abs(x)
    r = tl.where(a <= 8.0, _bessel_i1_near(a) * tl.exp(-a), _bessel_i1e_far(a))
    return tl.where(x < 0.0, neg(r), r)
