"""The index algebra over Dynamo's symbolic sizes (``indexing.py``, ``indexing_symbolic.py``):
every rewrite checked against plain integer arithmetic at several values of the symbols.

An index is written once as text over ``fd`` and ``md``; evaluated with ``FloorDiv``/``ModIdx``
and the symbols it is what fuse builds and simplifies, evaluated with Python's ``//``/``%`` and
ints it is the truth, independent of sympy."""

from __future__ import annotations

import itertools
import operator
import random
import re
from typing import Iterable, Mapping

import pytest
import sympy

from fusebackend import indexing
from fusebackend.indexing import FloorDiv, ModIdx, pexpr, simplify, var
from helpers import sampled

S0 = sympy.Symbol("s0", integer=True, positive=True)
S1 = sympy.Symbol("s1", integer=True, positive=True)
X, Y, R = var("X"), var("Y"), var("R")
VALUES = (2, 3, 5, 17, 64)
PAIRS = ((2, 2), (2, 3), (3, 2), (5, 17), (17, 5), (64, 2), (2, 64), (3, 64))
SYMBOLIC = {"fd": FloorDiv, "md": ModIdx, "s0": S0, "s1": S1, "X": X, "Y": Y, "R": R}


def _symbolic(text: str) -> sympy.Expr:
    return sympy.sympify(eval(text, {}, dict(SYMBOLIC)))


def _direct(text: str, values: Mapping[str, int]) -> int:
    return eval(text, {}, {"fd": operator.floordiv, "md": operator.mod, **values})


def _assignments(*exprs: object) -> list[dict[str, int]]:
    """Values of the size symbols that ``exprs`` (texts or expressions) name: each of VALUES
    for one, PAIRS for both."""
    names = sorted({name for e in exprs for name in ("s0", "s1") if re.search(rf"\b{name}\b", str(e))})
    if len(names) == 2:
        return [{"s0": a, "s1": b} for a, b in PAIRS]
    return [{names[0]: v} for v in VALUES] if names else [{}]


def _points(n: int, cap: int = 48) -> Iterable[int]:
    """Every value of a range of ``n``, or ``cap`` of them spread over it with both ends and the
    values around each multiple of 64 (where divisions by sizes turn)."""
    if n <= cap:
        return range(n)
    near = {k + d for k in range(0, n, 64) for d in (-1, 0, 1)}
    return sorted({*range(0, n, n // cap + 1), n - 1, *(v for v in near if 0 <= v < n)})


def _grid(ranges: Mapping[str, str], sizes: Mapping[str, int]) -> Iterable[dict[str, int]]:
    names = list(ranges)
    extents = [_direct(ranges[name], sizes) for name in names]
    for point in itertools.product(*(_points(n) for n in extents)):
        yield dict(zip(names, point))


def _value(expr: sympy.Expr, env: Mapping[str, int]) -> int:
    """An index's printed text (what a kernel computes), evaluated by Python."""
    return eval(pexpr(expr), {}, dict(env))


def _ranges(ranges: Mapping[str, str]) -> dict[sympy.Symbol, sympy.Expr]:
    return {SYMBOLIC[name]: _symbolic(extent) for name, extent in ranges.items()}


def _check(text: str, ranges: Mapping[str, str], *exprs: sympy.Expr) -> None:
    """Each of ``exprs`` equals ``text`` evaluated directly, at every size and point tried."""
    for sizes in _assignments(text, *ranges.values(), *exprs):
        for point in _grid(ranges, sizes):
            want = _direct(text, {**sizes, **point})
            for e in exprs:
                assert _value(e, {**sizes, **point}) == want, (text, e, sizes, point)


# -- FloorDiv and ModIdx by a size -------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("fd(s0*Y, s0)", "Y"),  # exact: the quotient itself
    ("md(s0*Y, s0)", "0"),
    ("fd(64*s0*s1*Y, 64*s1)", "s0*Y"),
    ("fd(64*s0*Y + X, 64*s0)", "Y + fd(X, 64*s0)"),  # a literal multiple pulled out
    ("md(64*s0*Y + X, 64*s0)", "md(X, 64*s0)"),
    ("fd(fd(X, 64), s0)", "fd(X, 64*s0)"),
    ("md(md(X, 4*s0), s0)", "md(X, s0)"),
    ("md(md(X, 64*s0), 64)", "md(X, 64)"),  # a symbolic multiple of a constant modulus
    ("fd(128*s0 - 1, 64*s0)", "1"),  # for every s0 >= 2
    ("fd(-1, s0)", "-1"),
    ("fd(2*s0*Y + 1, 2)", "s0*Y"),
    ("fd(s0 - 1 - X, s0)", "fd(s0 - 1 - X, s0)"),  # sympy's canonical order of the same sum
])
def test_div_and_mod_by_a_size_evaluate_only_where_proven(text: str, expected: str) -> None:
    got = _symbolic(text)
    assert got == _symbolic(expected)
    _check(text, {"X": "3*s0", "Y": "4"}, got)


@pytest.mark.parametrize("text", [
    "fd(X, s0)", "md(X, s0)", "fd(s0*X, 2)", "md(s0*X, 4)", "fd(2*X + s0, 2*s0)", "md(X + s1, s0*s1)",
    "fd(s0, s1)", "md(s0*s1 + X, 2*s0)", "fd(X + 64, 64*s0)",
])
def test_what_is_not_proven_stays_a_division(text: str) -> None:
    got = _symbolic(text)
    assert isinstance(got, (FloorDiv, ModIdx)) or any(isinstance(a, (FloorDiv, ModIdx)) for a in got.args)
    _check(text, {"X": "2*s0 + 3"}, got)


def test_proofs_see_through_divisions_by_constants_and_not_into_divisions_by_sizes() -> None:
    assert indexing.known_nonneg(FloorDiv(S0, 2) - 1)  # s0 >= 2
    assert not indexing.known_nonneg(FloorDiv(S0, 4) - 1)  # 0 for s0 < 4
    assert indexing.known_nonneg(FloorDiv(3, S0)) and indexing.known_nonneg(ModIdx(X, S0) + FloorDiv(X, S1))
    assert not indexing.known_le(FloorDiv(3, S0), 0)  # 1 for s0 <= 3: not proven, and no error
    assert indexing.known_le(ModIdx(FloorDiv(X, S0), 4), 3 * S1) is False  # only its sign is known


def test_a_divisor_must_be_a_positive_size() -> None:
    for divisor in (X, S0 - 1, -S0, S0 / 2):
        with pytest.raises(ValueError):
            FloorDiv(X, divisor)
        with pytest.raises(ValueError):
            ModIdx(X, divisor)


# -- bounds ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, ranges", [
    ("X", {"X": "s0"}),
    ("64*s0*Y + X", {"X": "64*s0", "Y": "s1"}),
    ("fd(X, 64)", {"X": "64*s0"}),
    ("md(X, s0) + 3*fd(X, s0)", {"X": "s0*s1"}),
    ("md(X, 64)", {"X": "s0"}),
    ("s0 - 1 - X", {"X": "s0"}),
    ("s0*s0*Y + s0*X", {"X": "s0", "Y": "3"}),
    ("md(Y, s0*s1) + fd(X, 2*s0)", {"X": "7", "Y": "5"}),
    ("2*s1*(s0 - 1 - X)", {"X": "s0"}),
])
def test_symbolic_bounds_hold_for_every_value(text: str, ranges: dict[str, str]) -> None:
    expr = _symbolic(text)
    lo, hi = indexing.bounds(expr, _ranges(ranges))
    for sizes in _assignments(text, *ranges.values(), lo, hi):
        low, high = _value(sympy.sympify(lo), sizes), _value(sympy.sympify(hi), sizes)
        values = [_direct(text, {**sizes, **point}) for point in _grid(ranges, sizes)]
        assert low <= min(values) and max(values) <= high, (text, lo, hi, sizes)


def test_bounds_over_integer_ranges_are_ints() -> None:
    for expr, ranges, want in [
        (ModIdx(FloorDiv(X, 4), 8) + 3 * Y, {X: 100, Y: sympy.Integer(5)}, (0, 19)),
        (FloorDiv(X + 7, 16) - Y, {X: 25, Y: 3}, (-2, 1)),
        (sympy.Integer(7), {}, (7, 7)),
    ]:
        got = indexing.bounds(expr, ranges)
        assert got == want and all(type(v) is int for v in got)


def test_a_product_of_unknown_sign_has_no_bounds_and_keeps_its_division() -> None:
    expr = X * (Y - 5)
    with pytest.raises(indexing.UnknownSign):
        indexing.bounds(expr, {X: 4, Y: S0})
    assert simplify(FloorDiv(expr, 4), {X: 4, Y: S0}) == FloorDiv(expr, 4)
    assert simplify(ModIdx(expr, S0), {X: 4, Y: S0}) == ModIdx(expr, S0)


# -- simplify: redundant divisions, small terms, and the unravel/ravel round trip ---------------

@pytest.mark.parametrize("text, ranges, expected", [
    ("fd(X, s0)", {"X": "s0"}, "0"),
    ("md(X, s0)", {"X": "s0"}, "X"),
    ("md(X, 64*s0)", {"X": "s0"}, "X"),  # s0 <= 64*s0
    ("md(fd(X, 64*s1), s0)", {"X": "64*s0*s1"}, "fd(X, 64*s1)"),
    ("fd(64*Y + R, 64*s0)", {"Y": "2*s0", "R": "64"}, "fd(Y, s0)"),  # R < 64 splits off
    ("md(64*Y + R, 64*s0)", {"Y": "2*s0", "R": "64"}, "64*md(Y, s0) + R"),
    ("fd(s1*Y + R, 64*s1)", {"Y": "64*s0", "R": "s1"}, "fd(Y, 64)"),  # a symbolic small part
    ("md(s1*Y + R, 64*s1)", {"Y": "64*s0", "R": "s1"}, "s1*md(Y, 64) + R"),
    ("fd(64*Y + R, 64*s0)", {"Y": "2*s0", "R": "65"}, "fd(64*Y + R, 64*s0)"),  # R reaches 64: kept
    ("md(X, s0)", {"X": "s0 + 1"}, "md(X, s0)"),
])
def test_simplify_with_symbolic_sizes(text: str, ranges: dict[str, str], expected: str) -> None:
    got = simplify(_symbolic(text), _ranges(ranges))
    assert got == _symbolic(expected)
    _check(text, ranges, got)


LAYOUTS = [
    ((2, S0, 64), None),
    ((S0, S1, 64), None),
    ((S0, 7, 64), None),
    ((S0, S1, 8), None),
    ((3, S0, S1), None),
    ((S0, 8, S1), (8 * S1, 1, 8)),  # channels-last-like
    ((S0, S1, 4), (4, 4 * S0, 1)),  # the two outer dims transposed
    ((2, S0, 1, 64), None),  # a size-1 dim
]


def _strides(sizes: tuple[sympy.Expr, ...], strides: tuple[sympy.Expr, ...] | None) -> tuple[sympy.Expr, ...]:
    return strides if strides is not None else indexing.contiguous_strides(sizes)


@pytest.mark.parametrize("sizes, strides", LAYOUTS)
def test_unravel_then_ravel_folds_back_to_the_flat_index(sizes, strides) -> None:
    strides = _strides(sizes, strides)
    numel = sympy.Mul(*sizes)
    ranges = {X: numel}
    index = [simplify(e, ranges) for e in indexing.unravel(X, sizes, strides)]
    assert simplify(indexing.ravel(index, strides), ranges) == X
    for assignment in _assignments(numel):
        env = {SYMBOLIC[k]: v for k, v in assignment.items()}
        concrete = [int(s.xreplace(env)) for s in sympy.sympify(sizes)]
        steps = [int(sympy.sympify(s).xreplace(env)) for s in strides]
        for flat in _points(int(numel.xreplace(env)), cap=200):
            want = [flat // st % sz for sz, st in zip(concrete, steps)]
            assert [_value(e, {**assignment, "X": flat}) for e in index] == want


@pytest.mark.parametrize("sizes", [(2, S0, 64), (S0, S1, 64), (S0, 7, 64), (4, S0, S1)])
def test_a_row_by_row_iteration_unravels_and_folds_back(sizes) -> None:
    # a [rows, inner] iteration (Y the row, R the column) over a contiguous buffer
    strides = indexing.contiguous_strides(sizes)
    inner = sizes[-1]
    ranges = {Y: sympy.Mul(*sizes[:-1]), R: inner}
    flat = inner * Y + R
    index = [simplify(e, ranges) for e in indexing.unravel(flat, sizes, strides)]
    assert index[-1] == R
    assert simplify(indexing.ravel(index, strides), ranges) == flat
    assert not indexing.window_arithmetic(index[-1])


def test_a_mod_of_a_symbolic_multiple_folds_with_its_division() -> None:
    # c*ModIdx(FloorDiv(x, a), m) + c*m*FloorDiv(ModIdx(x, M), a*m) == c*FloorDiv(ModIdx(x, M), a)
    text = "3*md(fd(X, 64), s0) + 3*s0*fd(md(X, 128*s0*s1), 64*s0)"
    ranges = {"X": "256*s0*s1"}
    got = simplify(_symbolic(text), _ranges(ranges))
    assert got == 3 * FloorDiv(ModIdx(X, 128 * S0 * S1), 64)
    _check(text, ranges, got)


TERMS = ("1", "2", "3", "64", "s0", "2*s0", "s1", "64*s1", "s0*s1")
DIVISORS = ("2", "4", "64", "s0", "2*s0", "64*s0", "s1", "8*s1", "s0*s1", "64*s0*s1")
RANGES = ({"X": "3*s0", "Y": "4"}, {"X": "64*s0", "Y": "s1"}, {"X": "s0*s1", "Y": "2*s0"}, {"X": "64", "Y": "s0"})


def _random_index(rng: random.Random, depth: int) -> str:
    terms = [f"{rng.choice(TERMS)}*{rng.choice(('X', 'Y'))}" for _ in range(rng.randint(1, 3))]
    if depth and rng.random() < 0.6:
        terms.append(_random_index(rng, depth - 1))
    if rng.random() < 0.2:
        terms.append(rng.choice(("-1", "1", "s0 - 1")))
    text = " + ".join(terms)
    if rng.random() < 0.85:
        text = f"{rng.choice(('fd', 'md'))}({text}, {rng.choice(DIVISORS)})"
    return text


# 12 seeds took 42 s on 2 cores (sympy); the default run takes every fourth (pytest --full: all)
@pytest.mark.parametrize("seed", sampled(range(12), lambda seed: seed % 4 == 0))
def test_random_indices_simplify_to_the_same_values(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(12):
        text = _random_index(rng, depth=2)
        ranges = rng.choice(RANGES)
        built = _symbolic(text)
        _check(text, ranges, built, simplify(built, _ranges(ranges)))


# -- layouts -----------------------------------------------------------------------------------

def test_contiguous_strides_of_symbolic_sizes_are_products() -> None:
    assert indexing.contiguous_strides([S0, 7, 64]) == (448, 64, 1)
    assert indexing.contiguous_strides([S0, S1, 64]) == (64 * S1, 64, 1)
    assert indexing.contiguous_strides([2, S0 * S1, S1]) == (S0 * S1**2, S1, 1)
    maybe_zero = FloorDiv(S0, 4)  # 0 where s0 < 4: strides as if it were 1, like a size-0 int
    assert indexing.contiguous_strides([3, maybe_zero, 5]) == (5 * sympy.Max(maybe_zero, 1), 5, 1)
    assert indexing.contiguous_strides([3, 0, 5]) == (5, 5, 1) and indexing.contiguous_strides([]) == ()


@pytest.mark.parametrize("sizes, strides, dense, order", [
    ((2, S0, 64), (64 * S0, 64, 1), True, [0, 1, 2]),
    ((S0, S1, 64), (64 * S1, 64, 1), True, [0, 1, 2]),
    ((S0, 8, S1), (8 * S1, 1, 8), True, [0, 2, 1]),
    ((S0, S1, 4), (4, 4 * S0, 1), True, [1, 0, 2]),
    ((S0, 1, S1), (S1, 7 * S0, 1), True, [0, 1, 2]),  # a size-1 dim's stride is free; s1 against 7*s0: not decided
    ((S0, S1), (S1, 1), True, [0, 1]),
    ((S0, S1), (1, S0), True, [1, 0]),
    ((S0, S1), (1, S1), False, [1, 0]),  # overlaps where s1 < s0
    ((S0, S1), (2 * S1, 1), False, [0, 1]),  # a gap between rows
    ((S0, S1), (1, 1), False, [0, 1]),
    ((S0, S1, 8), (8, 1, S0), False, [0, 2, 1]),  # 8 against s0: not decided, the logical order
    ((S0 - 1, 4), (4, 1), True, [0, 1]),
])
def test_symbolic_layouts_are_decided_by_structure(sizes, strides, dense, order) -> None:
    assert indexing.is_dense(sizes, strides) is dense
    assert indexing.dense_order(sizes, strides) == order


def test_integer_layouts_are_decided_as_before() -> None:
    assert indexing.is_dense((4, 1, 8), (8, 99, 1)) and not indexing.is_dense((4, 8), (9, 1))
    assert indexing.is_dense((0, 3), (1, 1)) is False and indexing.is_dense((3, 0), (1, 3)) is True
    assert indexing.dense_order((2, 3, 4), (1, 8, 2)) == [1, 2, 0]
    assert indexing.dense_order((2, 3), (sympy.Integer(3), 1)) == [0, 1]


def test_unravel_over_symbolic_sizes_needs_no_decision() -> None:
    index = indexing.unravel(X, (1, S0, 64), (64 * S0, 64, 1))
    assert index[0] == 0 and index[1] == ModIdx(FloorDiv(X, 64), S0) and index[2] == ModIdx(X, 64)


# -- block alignment ---------------------------------------------------------------------------

def test_a_division_by_a_symbolic_multiple_of_the_block_is_taken_at_its_start() -> None:
    start = var("xoffset")
    blocks = {X: (64, start)}
    expr = FloorDiv(X, 64 * S0) + 5 * ModIdx(X, 128 * S0)
    aligned = indexing.block_aligned(expr, blocks)
    assert aligned == FloorDiv(start, 64 * S0) + 5 * (X - 128 * S0 * FloorDiv(start, 128 * S0))
    for s0 in VALUES:
        for block in range(0, 4 * 128 * s0, 64):
            for lane in (0, 1, 31, 63):
                env = {"X": block + lane, "xoffset": block, "s0": s0}
                assert _value(aligned, env) == _value(expr, env)
    not_multiples = FloorDiv(X, S0) + ModIdx(X, 32 * S0) + FloorDiv(X, S0 + 64)
    assert indexing.block_aligned(not_multiples, blocks) == not_multiples


def test_a_symbolic_clamp_operand_is_decided_by_proofs() -> None:
    assert simplify(indexing.Clamp(X, 0, 1), {X: S0}) == indexing.Clamp(X, 0, 1)
    assert simplify(indexing.Clamp(X + S0, 0, 1), {X: S0}) == 1  # always at least s0 >= 2
    assert simplify(indexing.Clamp(X, 0, 63), {X: FloorDiv(S0, 64) + 1}) == indexing.Clamp(X, 0, 63)
