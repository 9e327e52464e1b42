"""Device functions that generated kernels call as ``th.<name>``.

Each is written with Triton builtins only: no libdevice (the interpreter lacks it) and none of
Triton's own ``@jit`` library functions (``tl.sigmoid``, ``tl.sum``...), whose compiled-or-
interpreted mode was fixed when Triton was imported. Results must agree with eager PyTorch on
the CPU and on the GPU.
"""

import triton
import triton.language as tl

from fusebackend.config import use_interpreter


@triton.jit
def maximum(a, b):
    # NaN-propagating, like torch.maximum: a NaN on either side wins (one max.NaN instruction on
    # the GPU; integers ignore the flag).
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def minimum(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def floordiv(a, b):
    # an index's floor quotient by b > 0 (the indexing rules' FloorDiv): ``//`` truncates
    q = a // b
    return tl.where(a % b < 0, q - 1, q)


@triton.jit
def floormod(a, b):
    # an index's remainder in [0, b) for b > 0 (ModIdx): ``%`` takes the dividend's sign
    r = a % b
    return tl.where(r < 0, r + b, r)


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tanh(x):
    # tanh(x) = sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|); a short series near 0 keeps the
    # relative error small where 1 - e would cancel.
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = ax * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    t = tl.where(ax < 0.0625, small, big)
    return copysign(t, x)  # tanh(-0.0) is -0.0


@triton.jit
def log1p(x):
    # log(u) * x / (u - 1) with u = 1 + x corrects the rounding of 1 + x (Goldberg's trick);
    # log1p(inf) is inf (inf / inf would make it NaN).
    u = 1.0 + x
    d = u - 1.0
    r = tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))
    return tl.where(x == float("inf"), x, r)


@triton.jit
def expm1(x):
    # expm1(x) = (u - 1) * x / log(u) with u = exp(x), exact where exp(x) - 1 would cancel.
    u = tl.exp(x)
    d = u - 1.0
    lu = tl.log(u)
    safe = tl.where((d == 0.0) | (lu == 0.0), 1.0, lu)
    r = tl.where(d == 0.0, x, d * (x / safe))
    return tl.where(tl.abs(x) > 0.5, d, r)




# Combine functions for tl.reduce (Triton's own tl.sum/tl.max are @jit library functions).


@triton.jit
def as_bool(x):
    # A comparison of scalars (0-dim loads) as a bool tensor: Triton's interpreter otherwise gives
    # a value it cannot combine with a block (``|``) or use as a mask. Compiled, the OR folds away.
    return tl.full([], 0, tl.int1) | x


@triton.jit
def pair_take(x, c: tl.constexpr):
    """Element ``c`` (0 or 1) of each pair of neighbours along a 1-d block, given to both: what
    a load at ``2 * (i // 2) + c`` reads, from one contiguous load (``codegen.pairs.pair_load``)."""
    even, odd = tl.split(tl.reshape(x, [x.shape[0] // 2, 2]))
    taken = odd if c else even
    return tl.reshape(tl.join(taken, taken), [x.shape[0]])


@triton.jit
def pair_take_2d(x, c: tl.constexpr):
    """``pair_take`` along the last axis of a 2-d block."""
    even, odd = tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
    taken = odd if c else even
    return tl.reshape(tl.join(taken, taken), [x.shape[0], x.shape[1]])


@triton.jit
def combine_sum(a, b):
    return a + b


# The combine function of sums in tl.reduce. Triton's interpreter reduces with numpy only when
# given Triton's own sum combine (it checks identity, and never calls it); with any other function
# it calls that once per element, in Python. Compiled kernels get combine_sum: the same code.
reduce_sum = tl.standard._sum_combine if use_interpreter() else combine_sum


@triton.jit
def combine_prod(a, b):
    return a * b


@triton.jit
def combine_max(a, b):
    return maximum(a, b)


@triton.jit
def combine_min(a, b):
    return minimum(a, b)


@triton.jit
def combine_any(a, b):
    return a | b


@triton.jit
def combine_argmax(v1, i1, v2, i2):
    # torch.argmax: NaN counts as the largest value; ties go to the lowest index.
    n1 = v1 != v1
    n2 = v2 != v2
    first = (v1 > v2) | (n1 & (n2 == 0)) | (((v1 == v2) | (n1 & n2)) & (i1 < i2))
    return tl.where(first, v1, v2), tl.where(first, i1, i2)


@triton.jit
def combine_argmin(v1, i1, v2, i2):
    n1 = v1 != v1
    n2 = v2 != v2
    first = (v1 < v2) | (n1 & (n2 == 0)) | (((v1 == v2) | (n1 & n2)) & (i1 < i2))
    return tl.where(first, v1, v2), tl.where(first, i1, i2)


# Welford's one-pass mean and sum of squared deviations (the "m2" reduction): each lane keeps
# (mean, m2, weight) of the values it has seen; the lanes of a block combine with sums
# (codegen/reduction.py, _finish_welford), the chunks of a split reduction in its phase 2
# (lowering/reductions.py). No step subtracts two large sums, so a large mean costs no precision.
@triton.jit
def welford_update(mean, m2, weight, value):
    weight = weight + 1.0
    delta = value - mean
    mean = mean + delta / weight
    return mean, m2 + delta * (value - mean), weight


@triton.jit
def welford_update_step(mean, m2, weight, value, inverse):
    # every lane of an unmasked loop has seen as many values as the others: ``inverse`` is
    # 1 / (that count + 1), computed once a step. A division per value made the Welford update
    # of a column reduction (a GroupNorm's phase 1 over channels-last activations) bound by its
    # arithmetic, not by its reads.
    delta = value - mean
    mean = mean + delta * inverse
    return mean, m2 + delta * (value - mean), weight + 1.0


@triton.jit
def welford_update_masked(mean, m2, weight, value, valid):
    new_weight = weight + valid.to(tl.float32)
    delta = tl.where(valid, value - mean, 0.0)
    new_mean = mean + delta / tl.maximum(new_weight, 1.0)
    return new_mean, m2 + tl.where(valid, delta * (value - new_mean), 0.0), new_weight


if use_interpreter():

    @triton.jit
    def to_bf16(x):
        # Triton's interpreter truncates fp32 -> bf16; round to nearest even on the bits instead.
        bits = x.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True)).to(tl.bfloat16)

else:

    @triton.jit
    def to_bf16(x):
        return x.to(tl.bfloat16)


@triton.jit
def round_bf16(x):
    # fp32 -> the nearest bf16 value, kept in fp32: a fused bf16 result as eager's next op reads it
    return to_bf16(x.to(tl.float32)).to(tl.float32)


# Counter-based random numbers (lowering/random_ops.py). Philox4x32-10 (Salmon, Moraes, Dror and
# Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011): ten rounds that mix a 128-bit
# counter under a 64-bit key, written with builtins so that the interpreter runs the same code as
# the GPU (Triton's tl.rand is a @jit library function, whose mode is fixed at import). The key
# is the graph's seed; the counter is (element index: low and high words, stream, 0), so every
# element of every random node gets its own value, the same wherever it is computed. For stream 0
# the words are tl.randint4x's (checked on an H100 with Triton 3.6 over 2**20 indices, 2026-11-23).
@triton.jit
def philox(seed, stream, offset):
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    if tl.constexpr(offset.dtype.primitive_bitwidth) > 32:
        c0 = (offset & 0xFFFFFFFF).to(tl.uint32)
        c1 = ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
    else:  # int32 indices (nodes under 2**31 elements): the high word is 0, known when compiling
        c0 = offset.to(tl.uint32)
        c1 = c0 * 0
    c3 = c0 * 0
    c2 = c3 + stream
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, 0xD2511F53)
        hi2 = tl.umulhi(c2, 0xCD9E8D57)
        lo0 = c0 * 0xD2511F53
        lo2 = c2 * 0xCD9E8D57
        c0 = hi2 ^ c1 ^ k0
        c2 = hi0 ^ c3 ^ k1
        c1 = lo2
        c3 = lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def rand(seed, stream, offset, BITS: tl.constexpr):
    # Uniform on [0, 1) in steps of 2**-BITS, BITS the significand of the output dtype (as eager
    # draws them): every value is exact in that dtype, so none rounds up to 1 on store. fp32 for
    # up to 24 bits; fp64 (53 bits, from two words) above.
    r0, r1, _, _ = philox(seed, stream, offset)
    if BITS > 24:
        high = (r0 >> 5).to(tl.float64)
        low = (r1 >> 6).to(tl.float64)
        return (high * 67108864.0 + low) * (1.0 / 9007199254740992.0)
    else:
        return (r0 >> (32 - BITS)).to(tl.float32) * (1.0 / (1 << BITS))


@triton.jit
def randn(seed, stream, offset):
    # Standard normal, fp32, by Box-Muller on two 24-bit uniforms; u1 in (0, 1] keeps the log finite.
    r0, r1, _, _ = philox(seed, stream, offset)
    u1 = ((r0 >> 8).to(tl.float32) + 1.0) * (1.0 / 16777216.0)
    u2 = (r1 >> 8).to(tl.float32) * (1.0 / 16777216.0)
    return tl.sqrt(-2.0 * tl.log(u1)) * tl.cos(6.283185307179586 * u2)


@triton.jit
def randint(seed, stream, offset, span):
    # Uniform integers in [0, span), span <= 2**32: the high word of bits * span (Lemire's
    # multiply-shift; biased by at most span / 2**32, as eager's modulo is).
    r0, _, _, _ = philox(seed, stream, offset)
    return tl.umulhi(r0, r0 * 0 + span).to(tl.int64)


# Combine functions for tl.associative_scan (codegen/scan.py). Sums scan with ``reduce_sum`` and
# products with ``scan_prod``: in the interpreter Triton's own combines, which it recognises and
# scans with numpy (never calling them); compiled, ours.
scan_prod = getattr(tl.standard, "_prod_combine", combine_prod) if use_interpreter() else combine_prod


@triton.jit
def combine_logsumexp(a, b):
    # log(exp(a) + exp(b)) = hi + log1p(exp(lo - hi)); equal values (equal infinities among them)
    # give hi + log 2 without computing inf - inf; a NaN on either side gives NaN
    hi = maximum(a, b)
    lo = minimum(a, b)
    return hi + log1p(tl.exp(tl.where(lo == hi, 0.0, lo - hi)))


@triton.jit
def combine_cummax(v1, i1, v2, i2):
    # torch.cummax: a NaN, once seen, stays the maximum; of equal values the later position wins
    later = (v2 != v2) | ((v1 == v1) & (v2 >= v1))
    return tl.where(later, v2, v1), tl.where(later, i2, i1)


@triton.jit
def combine_cummin(v1, i1, v2, i2):
    later = (v2 != v2) | ((v1 == v1) & (v2 <= v1))
    return tl.where(later, v2, v1), tl.where(later, i2, i1)


# The special math functions (inverse trigonometric, hyperbolic, error, gamma and Bessel
# functions) and the sign-bit helpers have their own modules; kernels reach them as th.<name>.
from fusebackend.kernels.math_helpers import (  # noqa: E402,F401
    acosh, asinh, atan, atan2, copysign, div, erfc, erfcx, erfinv, frexp_exponent, frexp_mantissa, gcd, hypot, ldexp,
    ndtri, neg, nextafter, signbit, sinh, sqrt,
)
from fusebackend.kernels.special_helpers import (  # noqa: E402,F401
    digamma, i0, i0e, i1, i1e, lgamma, trigamma,
)
