"""The index algebra: simplification, bounds, and printing that Python and Triton evaluate right."""

import itertools

import pytest

from fusebackend import indexing
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
