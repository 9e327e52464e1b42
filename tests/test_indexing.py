"""The index algebra: simplification, bounds, and printing that Python and Triton evaluate right."""

import itertools

import pytest
import sympy
import torch

from fusebackend import indexing, indexing_signed
from fusebackend.indexing import FloorDiv, ModIdx, pexpr, simplify, var

x, r = var("xindex"), var("rindex")


def _evaluate(expr, values):
    return eval(pexpr(expr), {}, {str(k): v for k, v in values.items()})


@pytest.mark.parametrize(
    "expr",
    [
        FloorDiv(r + 16384 * x, 1048576),
        ModIdx(r + 7 * x, 5),
        1048576 * FloorDiv(r + 16384 * x, 1048576) + ModIdx(r, 1024) + 1024 * ModIdx(16 * x + FloorDiv(r, 1024), 1024),
        3 * ModIdx(FloorDiv(x + 2 * r, 3), 4) + FloorDiv(x, 2),
    ],
)
def test_printed_index_evaluates_like_the_expression(expr):
    # A sum inside // or % must be parenthesized when printed.
    for xv, rv in itertools.product(range(0, 40, 3), range(0, 3000, 97)):
        want = int(expr.xreplace({x: xv, r: rv}))
        assert _evaluate(expr, {x: xv, r: rv}) == want, pexpr(expr)


def test_unravel_ravel_round_trip_simplifies_to_the_flat_index():
    ranges = {x: 2 * 3 * 4}
    for strides, sizes in [((12, 4, 1), (2, 3, 4)), ((12, 1, 3), (2, 3, 4))]:
        idx = indexing.unravel(x, sizes, strides)
        assert simplify(indexing.ravel(idx, strides), ranges) == x


def test_redundant_div_and_mod_vanish_within_ranges():
    ranges = {x: 24}
    assert simplify(ModIdx(x, 30), ranges) == x
    assert simplify(FloorDiv(x, 30), ranges) == 0
    assert indexing.bounds(ModIdx(x, 5) + 10 * FloorDiv(x, 6), ranges) == (0, 34)


def test_div_and_mod_see_through_terms_that_stay_below_a_divisor():
    # a tiled kernel's flat index: 65536*o + 1024*y + x with y < 64 and x < 1024
    o, y, i = var("o"), var("y"), var("i")
    ranges = {o: 128, y: 64, i: 1024}
    flat = 65536 * o + 1024 * y + i
    assert simplify(FloorDiv(flat, 1048576), ranges) == FloorDiv(o, 16)
    assert simplify(ModIdx(FloorDiv(flat, 1024), 64), ranges) == y
    assert simplify(ModIdx(flat, 2048), ranges) == 1024 * ModIdx(y, 2) + i
    # once i can reach 1024, no term of the sum stays below a divisor: nothing may be dropped
    wide = {o: 128, y: 64, i: 2048}
    assert simplify(FloorDiv(flat, 1048576), wide) == FloorDiv(flat, 1048576)
    assert simplify(FloorDiv(flat, 1048576), {o: 128, y: 65, i: 1024}) == FloorDiv(64 * o + y, 1024)
    for values in itertools.product((0, 5, 127), (0, 1, 63), (0, 17, 1023)):
        env = dict(zip((o, y, i), values))
        n = 65536 * values[0] + 1024 * values[1] + values[2]
        assert simplify(FloorDiv(flat, 1048576), ranges).subs(env) == n // 1048576
        assert simplify(ModIdx(flat, 2048), ranges).subs(env) == n % 2048


def test_round_trip_through_a_wrapped_index_folds_back():
    # a split whose chunks overrun the rows wraps its row index (f % 10000); unravelled over
    # [4, 2500, 6] and ravelled back, it must fold to the flat offset so loads of one address share
    # one load. The second form pairs a mod of a division with a division of the wrapped index.
    ranges = {x: 234, r: 512}
    f = r + 257 * FloorDiv(x, 6)
    wrapped = 6 * ModIdx(f, 10000) + ModIdx(x, 6)
    idx = indexing.unravel(wrapped, (4, 2500, 6), (15000, 6, 1))
    assert simplify(indexing.ravel(idx, (15000, 6, 1)), ranges) == wrapped
    pair = 7 * ModIdx(FloorDiv(f, 3), 5) + 35 * FloorDiv(ModIdx(f, 30), 15)
    folded = simplify(pair, ranges)
    assert folded == 7 * FloorDiv(ModIdx(f, 30), 3)
    for xv, rv in itertools.product(range(0, 234, 7), range(0, 512, 13)):
        env = {x: xv, r: rv}
        assert _evaluate(folded, env) == _evaluate(pair, env)
    # a mod whose modulus the division does not divide is left alone
    odd = 7 * ModIdx(f, 5) + 35 * FloorDiv(ModIdx(f, 12), 5)
    assert simplify(odd, ranges) == odd


def test_block_aligned_takes_divisions_by_multiples_of_the_block_at_its_start() -> None:
    x, start = indexing.var("xindex"), indexing.var("xoffset")
    blocks = {x: (64, start)}
    expr = 200704 * indexing.FloorDiv(x, 256) + indexing.ModIdx(x, 256)
    aligned = indexing.block_aligned(expr, blocks)
    assert aligned == 200704 * indexing.FloorDiv(start, 256) + x - 256 * indexing.FloorDiv(start, 256)
    # exact: every x of a block [64k, 64k + 64) gives the same value both ways
    for s in (0, 64, 192, 256, 4032):
        for lane in (0, 1, 63):
            values = {x: s + lane, start: s}
            assert expr.xreplace(values) == aligned.xreplace(values)
    # a divisor the block size does not divide is left alone, and so is a division of a sum
    assert indexing.block_aligned(indexing.FloorDiv(x, 96), blocks) == indexing.FloorDiv(x, 96)
    assert indexing.block_aligned(indexing.FloorDiv(x + 1, 128), blocks) == indexing.FloorDiv(x + 1, 128)
    assert not indexing.window_arithmetic(aligned, frozenset({start}))
    assert indexing.window_arithmetic(expr, frozenset({start}))


# -- symbolic sizes (Dynamo's symbols: positive integers, at least indexing.SIZE_FLOOR) ---------

S0 = sympy.Symbol("s0", integer=True, positive=True)
S1 = sympy.Symbol("s1", integer=True, positive=True)


@pytest.mark.parametrize("sizes, strides", [
    ((2, S0, 64), (64 * S0, 64, 1)),  # a symbolic sequence length
    ((S0, S1, 8), (8 * S1, 8, 1)),  # symbolic batch and length
    ((S0, 8, S1), (8 * S1, 1, 8)),  # channels-last-like: the symbolic dim strided
])
def test_a_round_trip_over_symbolic_sizes_folds_back(sizes, strides) -> None:
    x = var("X")
    ranges = {x: sympy.Mul(*sizes)}
    index = [simplify(e, ranges) for e in indexing.unravel(x, sizes, strides)]
    assert simplify(indexing.ravel(index, strides), ranges) == x
    assert not isinstance(index[0], ModIdx)  # the slowest dim's index stays below its size


def test_symbolic_div_and_mod_rules() -> None:
    x, y = var("X"), var("Y")
    assert FloorDiv(128 * S0 - 1, 64 * S0) == 1  # 2*64*s0 - 1 over 64*s0, for any s0 >= 2
    assert FloorDiv(3, 4 * S0) == 0 and FloorDiv(-1, S0) == -1
    assert FloorDiv(64 * S0 * y + x, 64 * S0) == y + FloorDiv(x, 64 * S0)
    assert ModIdx(64 * S0 * y + x, 64 * S0) == ModIdx(x, 64 * S0)
    assert FloorDiv(FloorDiv(x, 64), S0) == FloorDiv(x, 64 * S0)
    assert ModIdx(ModIdx(x, 4 * S0), S0) == ModIdx(x, S0)
    assert simplify(FloorDiv(x, S0), {x: S0}) == 0 and simplify(ModIdx(x, S0), {x: S0}) == x
    assert indexing.bounds(FloorDiv(x, 64), {x: 64 * S0}) == (0, S0 - 1)
    with pytest.raises(ValueError):
        FloorDiv(x, y)  # a loop variable is no divisor
    with pytest.raises(TypeError):
        indexing.bounds(x * (y - 5), {x: 4, y: S0})  # a factor of unknown sign


@pytest.mark.parametrize("s0, s1", [(2, 3), (5, 2), (7, 11)])
def test_a_printed_symbolic_index_evaluates_like_the_expression(s0: int, s1: int) -> None:
    x = var("X")
    expr = ModIdx(FloorDiv(x, 8 * S1), S0) + 3 * FloorDiv(x, S0 * S1)
    text = pexpr(expr)
    assert "// (8*s1)" in text and "% s0" in text
    for value in range(0, 8 * s0 * s1 * 2, 7):
        expected = (value // (8 * s1)) % s0 + 3 * (value // (s0 * s1))
        assert eval(text, {"X": value, "s0": s0, "s1": s1}) == expected


# -- operands below zero: the rules are floor division's, a GPU's // and % truncate -----------


def test_a_constant_keeps_its_floor_remainder_inside_a_division() -> None:
    # a slice's backward over a reshape shifts an index down: (i - 1023) % 16 is (i + 1) % 16,
    # whose operand is never negative, so truncating and floor division agree on it
    assert ModIdx(x - 1023, 16) == ModIdx(x + 1, 16)
    assert FloorDiv(x - 1023, 16) == FloorDiv(x + 1, 16) - 64
    assert ModIdx(x - 1, 16) == ModIdx(x + 15, 16) and FloorDiv(x - 1, 16) == FloorDiv(x + 15, 16) - 1
    for value in range(0, 40):
        assert int(ModIdx(x - 1023, 16).xreplace({x: value})) == (value - 1023) % 16
        assert int(FloorDiv(x - 1, 16).xreplace({x: value})) == (value - 1) // 16


def test_an_operand_within_one_period_divides_to_a_constant() -> None:
    ranges = {x: 16}
    assert simplify(FloorDiv(x + 32, 16), ranges) == 2 and simplify(ModIdx(x + 32, 16), ranges) == x
    assert simplify(FloorDiv(-x - 1, 16), ranges) == -1
    assert simplify(ModIdx(-x - 1, 16), ranges) == 15 - x


FLOOR_KERNEL = '''
import triton
import triton.language as tl
from fusebackend.kernels import triton_helpers as th


@triton.jit
def floor_index(out_ptr, n, XBLOCK: tl.constexpr):
    xindex = tl.arange(0, XBLOCK)
    tl.store(out_ptr + xindex, {text}, xindex < n)
'''


def test_a_division_of_a_possibly_negative_operand_rounds_down_in_the_kernel() -> None:
    from fusebackend.kernels import runtime

    ranges = {x: 40}
    expr = 100 * FloorDiv(5 - x, 4) + ModIdx(7 - 3 * x, 16)  # 5 - x < 0 from x = 6
    marked = indexing_signed.floored(expr, ranges)
    assert marked.atoms(indexing_signed.SignedFloorDiv) and marked.atoms(indexing_signed.SignedModIdx)
    assert not marked.atoms(FloorDiv, ModIdx)
    text = pexpr(marked)
    assert "th.floordiv(" in text and "th.floormod(" in text
    # a non-negative operand keeps Python's operators: its text is unchanged
    assert indexing_signed.floored(FloorDiv(x + 3, 4), ranges) == FloorDiv(x + 3, 4)
    out = torch.empty(40, dtype=torch.int64)
    runtime.load_kernel("floor_index", FLOOR_KERNEL.format(text=text))[(1,)](out, 40, XBLOCK=64)
    assert out.tolist() == [100 * ((5 - v) // 4) + (7 - 3 * v) % 16 for v in range(40)]
