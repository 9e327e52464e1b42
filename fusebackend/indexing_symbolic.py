"""Proofs about Dynamo's size symbols for the index algebra (``indexing.py``).

A graph with symbolic sizes (``symbolic.py``) has sizes, strides and divisors that are sympy
expressions in Dynamo's symbols: ``positive=True``, at least ``SIZE_FLOOR`` (Dynamo compiles
sizes 0 and 1 apart). Loop variables are only ``nonnegative``. Every answer here holds for any
value the symbols take; where that is not proven the answer is the conservative one (False, None,
not dense), never a guess made at one value. Nothing here builds ``FloorDiv`` or ``ModIdx``, so
``indexing`` imports this module, not the other way round.

Python's ``<`` on two sympy expressions raises TypeError where sympy cannot decide it, and
``int()`` raises on anything but a number: these helpers decide by ``known_le`` (a proof) or by
structure (``sympy.expand`` equality) instead.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import sympy

SIZE_FLOOR = 2


def is_size(expr: sympy.Expr) -> bool:
    """A positive integer made of Dynamo's size symbols and constants (a symbolic divisor)."""
    return bool(expr.free_symbols) and expr.is_integer is True and all(
        s.is_positive is True for s in expr.free_symbols) and expr.is_positive is True


def known_nonneg(expr: sympy.Expr, floors: Mapping[sympy.Symbol, int] | None = None) -> bool:
    """Whether ``expr`` is >= 0 for every value of its symbols (loop variables >= 0, size
    symbols >= ``SIZE_FLOOR``, or >= their ``floors`` where given: the ranges Dynamo learned,
    ``sizevars.known_le``); False where that is not proven. Each size symbol is written as its
    floor plus a non-negative remainder, and the expanded polynomial is decided by sympy's
    assumptions.

    A call that divides by sizes (``FloorDiv(x, s0)``: a size symbol past its first argument)
    stands for an unknown value of its sign: shifted, its divisor ``s0_above + 2`` would be no
    divisor ``FloorDiv`` accepts. A call by constants is shifted with the rest and evaluates
    again (``FloorDiv(s0, 2) - 1`` is ``FloorDiv(s0_above, 2)``)."""
    if isinstance(expr, int):
        return expr >= 0
    expr = sympy.sympify(expr)
    if expr.is_Number:
        return bool(expr >= 0)
    floors = floors or {}
    calls = {f: sympy.Dummy(**{fact: True for fact in ("integer", "nonnegative") if getattr(f, f"is_{fact}") is True})
             for f in expr.atoms(sympy.Function)
             if any(s.is_positive is True for a in f.args[1:] for s in a.free_symbols)}
    expr = expr.xreplace(calls)
    shifted = {v: sympy.Symbol(f"{v.name}_above", integer=True, nonnegative=True) + max(floors.get(v, 0), SIZE_FLOOR)
               for v in expr.free_symbols if v.is_positive is True}
    return sympy.expand(expr.xreplace(shifted)).is_nonnegative is True


def known_le(a: sympy.Expr | int, b: sympy.Expr | int, floors: Mapping[sympy.Symbol, int] | None = None) -> bool:
    """``a <= b`` for every value of the symbols (for ints, the comparison itself); ``floors``
    as in ``known_nonneg``."""
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return known_nonneg(sympy.sympify(b) - sympy.sympify(a), floors)


def quotient(term: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
    """``term / b`` where that is an integer for every value of the symbols (a polynomial with
    integer coefficients in integer-valued atoms), else None: ``64*s0*x / (64*s0)`` is ``x``,
    ``x / s0`` is None."""
    q = sympy.cancel(sympy.sympify(term) / b)
    if sympy.fraction(q)[1] != 1:
        return None
    q = sympy.expand(q)
    if not all(c.is_Integer for c in q.as_coefficients_dict().values()):
        return None
    return q if q.is_integer is True else None


def common_factors(terms: Sequence[sympy.Expr], d: sympy.Expr) -> list[sympy.Expr]:
    """The divisors > 1 of ``d`` that some term's constant-and-size factor shares with it, the
    higher degree and then the larger constant first (a divisor before the divisors of it).

    ``_split_small`` tries each: ``64*y + r`` over ``64*s0`` splits at 64 where ``r < 64``."""
    found: set[sympy.Expr] = set()
    for term in terms:
        sized = sympy.Mul(*(f for f in sympy.Mul.make_args(term)
                            if f.is_Number or (f.free_symbols and f.is_positive is True and f.is_polynomial())))
        c = sympy.gcd(sized, d)
        if c != 1 and c.is_positive is True and quotient(d, c) is not None:
            found.add(c)

    def size_order(c: sympy.Expr) -> tuple[int, sympy.Expr]:
        degree = sum(sympy.degree_list(c)) if c.free_symbols else 0
        return -degree, -c.as_coeff_Mul()[0]

    return sorted(found, key=lambda c: (*size_order(c), sympy.default_sort_key(c)))


def at_least_one(size: sympy.Expr) -> sympy.Expr:
    """``max(size, 1)`` for a symbolic size: the size itself where it is proven >= 1 (any
    product of size symbols), else ``Max`` (a size such as ``s0 // 4``, which may be 0)."""
    return size if known_le(1, size) else sympy.Max(size, 1)


def dense_by_structure(sizes: Sequence[sympy.Expr], strides: Sequence[sympy.Expr]) -> bool:
    """Whether the dims (size 1 left out) chain from fastest to slowest with each stride, by
    structure (``sympy.expand`` equality), the product of the sizes of the dims before it: a
    layout that is non-overlapping and dense for every value of the symbols. False where no
    such chain is found (two dims of one stride, or a stride that matches no product): not
    dense for some value, or not decided, which callers treat alike."""
    left = [d for d, size in enumerate(sizes) if size != 1]
    expected: sympy.Expr = sympy.Integer(1)
    while left:
        matches = [d for d in left if sympy.expand(strides[d] - expected) == 0]
        if len(matches) != 1:
            return False
        left.remove(matches[0])
        expected = sympy.expand(expected * sizes[matches[0]])
    return True


def order_by_stride(strides: Sequence[sympy.Expr]) -> list[int]:
    """Dims from the largest stride to the smallest, by proofs: each dim ranks by how many
    strides are proven smaller than its own, ties in the logical order. Where every pair is
    decided (any dense chain of sizes of at least 2) this is the sort by stride; a pair that is
    not decided (``s0`` and ``64``) keeps its logical order rather than raising."""
    smaller = [sum(known_le(other + 1, own) for other in strides) for own in strides]
    return sorted(range(len(strides)), key=lambda d: (-smaller[d], d))
