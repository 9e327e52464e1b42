"""Index expressions: sympy over non-negative integer loop variables.

A view never copies data; it rewrites the index a load uses. Indices are sympy expressions built
from loop variables (non-negative integer symbols with known ranges), integer constants, ``+``,
``*`` by constants, and two functions defined here:

- ``FloorDiv(a, b)``: floor(a / b) for a positive integer constant ``b``, or a positive product
  of constants and Dynamo's size symbols (a graph with symbolic sizes, below);
- ``ModIdx(a, b)``: a mod b, in [0, b), for such a ``b``;
- ``Clamp(a, lo, hi)``: ``a`` limited to [lo, hi] for integer constants ``lo <= hi``: a pooling
  window that reaches past an edge reads the edge element, and a pad's or a scatter's source index
  stays in range where the element lies outside the source; a mask discards what is read there,
  and no address outside the source is formed.

Reshapes and inlined producers introduce them; ``simplify(expr, ranges)`` removes what the
variable ranges make redundant (a FloorDiv of something smaller than its divisor is 0) and folds
``b*FloorDiv(x, b) + ModIdx(x, b)`` back into ``x``, so that an unravel followed by a ravel
prints as the plain flat index. ``bounds`` gives an interval for any index; codegen uses it to
prove that int32 arithmetic is safe.

Symbolic sizes (not yet produced by lowering): a loop variable's range and a divisor
may be expressions in Dynamo's size symbols (``positive=True``, at least ``SIZE_FLOOR``). The
same rules hold where they are proven for every value of the symbols (``known_nonneg``,
``known_le``, in ``indexing_symbolic``), and ``bounds`` returns expressions; anything unproven is
left as it is (a ModIdx kept, a division not folded), which is slower code, never a wrong index.
Layouts with symbolic sizes or strides are decided by structure (``is_dense``: each stride the
product of the sizes inside it); one not proven dense is reported not dense.
"""

from __future__ import annotations

import functools
import math
from typing import Iterator, Mapping, Sequence

import sympy

# SIZE_FLOOR is re-exported: sizevars reads it, and is_size and known_le, from here.
from fusebackend.indexing_symbolic import SIZE_FLOOR  # noqa: F401
from fusebackend.indexing_symbolic import (at_least_one, common_factors, dense_by_structure, is_size, known_le,
                                           known_nonneg, order_by_stride, quotient)

Size = int | sympy.Expr  # an int, or an expression in Dynamo's size symbols
Ranges = Mapping[sympy.Symbol, Size]  # each loop variable's extent


def var(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


@functools.lru_cache(maxsize=None)
def loop_vars(prefix: str, count: int) -> tuple[sympy.Symbol, ...]:
    return tuple(var(f"{prefix}{k}") for k in range(count))


class FloorDiv(sympy.Function):
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if not b.is_Integer:
            return _floor_div_by_size(a, b)
        if not b > 0:
            raise ValueError(f"FloorDiv needs a positive constant divisor, got {b}")
        if b == 1:
            return a
        if a.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):
            return FloorDiv(a.args[0], a.args[1] * b)
        if a.is_Add:
            whole, rest = _split_multiples(a, int(b))
            if whole != 0:
                return whole + FloorDiv(rest, b)
        if a.is_Mul:
            coeff, term = a.as_coeff_Mul()
            if coeff.is_Integer and int(coeff) % int(b) == 0:
                return (int(coeff) // int(b)) * term
        return None

    def _eval_is_nonnegative(self) -> bool | None:
        return True if self.args[0].is_nonnegative and self.args[1].is_positive else None


class ModIdx(sympy.Function):
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if not b.is_Integer:
            return _mod_by_size(a, b)
        if not b > 0:
            raise ValueError(f"ModIdx needs a positive constant modulus, got {b}")
        if b == 1:
            return sympy.Integer(0)
        if a.is_Integer:
            return sympy.Integer(int(a) % int(b))
        if isinstance(a, ModIdx) and _divides(b, a.args[1]):
            return ModIdx(a.args[0], b)
        if a.is_Add:
            whole, rest = _split_multiples(a, int(b))
            if whole != 0:
                return ModIdx(rest, b)
        if a.is_Mul:
            coeff, _ = a.as_coeff_Mul()
            if coeff.is_Integer and int(coeff) % int(b) == 0:
                return sympy.Integer(0)
        return None


# -- symbolic sizes ----------------------------------------------------------------------------
#
# A divisor or modulus may be a product of Dynamo's size symbols and a positive constant
# (``is_size``); the proofs (``known_nonneg``, ``known_le``, ``quotient``) are in
# ``indexing_symbolic`` and hold for any value the symbols take.


def _split_by_size(expr: sympy.Expr, b: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    whole: sympy.Expr = sympy.Integer(0)
    rest: sympy.Expr = sympy.Integer(0)
    for term in expr.args:
        q = quotient(term, b)
        if q is None:
            rest += term
        else:
            whole += q
    return whole, rest


def _floor_div_by_size(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
    if not is_size(b):
        raise ValueError(f"FloorDiv needs a positive divisor of constants and size symbols, got {b}")
    if a.is_Integer:
        if known_nonneg(a) and known_le(a + 1, b):
            return sympy.Integer(0)
        if not known_nonneg(a) and known_nonneg(b + a):
            return sympy.Integer(-1)  # -b <= a < 0
        return None
    if isinstance(a, FloorDiv):
        return FloorDiv(a.args[0], a.args[1] * b)
    if a.is_Add:
        whole, rest = _split_by_size(a, b)
        if whole != 0:
            return whole + FloorDiv(rest, b)
        return None
    return quotient(a, b)


def _mod_by_size(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
    if not is_size(b):
        raise ValueError(f"ModIdx needs a positive modulus of constants and size symbols, got {b}")
    if a.is_Integer:
        return a if known_nonneg(a) and known_le(a + 1, b) else None
    if isinstance(a, ModIdx) and _divides(b, a.args[1]):
        return ModIdx(a.args[0], b)
    if a.is_Add:
        whole, rest = _split_by_size(a, b)
        return ModIdx(rest, b) if whole != 0 else None
    return sympy.Integer(0) if quotient(a, b) is not None else None


class Clamp(sympy.Function):
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, lo: sympy.Expr, hi: sympy.Expr) -> sympy.Expr | None:
        if not (lo.is_Integer and hi.is_Integer and lo <= hi):
            raise ValueError(f"Clamp needs constant bounds lo <= hi, got {lo}, {hi}")
        if lo == hi:
            return lo
        if a.is_Integer:
            return sympy.Integer(min(max(int(a), int(lo)), int(hi)))
        return None

    def _eval_is_nonnegative(self) -> bool | None:
        return True if self.args[1] >= 0 else None


def _split_multiples(expr: sympy.Expr, b: int) -> tuple[sympy.Expr, sympy.Expr]:
    """Split a sum into (the terms divisible by b, divided by b) and the remaining terms; a
    constant term splits into its floor quotient and its remainder in [0, b), which leaves the
    remaining sum non-negative wherever its other terms are."""
    whole: sympy.Expr = sympy.Integer(0)
    rest: sympy.Expr = sympy.Integer(0)
    for term in expr.args:
        coeff, factor = term.as_coeff_Mul()
        if term.is_Integer:  # a constant keeps its floor remainder: (a - 1023) % 16 is (a + 1) % 16
            whole += int(term) // b
            rest += int(term) % b
        elif coeff.is_Integer and int(coeff) % b == 0:
            whole += (int(coeff) // b) * factor
        else:
            rest += term
    return whole, rest


class UnknownSign(TypeError):
    """``bounds`` of a product over symbolic sizes whose factors' signs are not proven: no
    interval without ``Min``/``Max`` of expressions. ``simplify`` keeps such a division."""


def bounds(expr: sympy.Expr, ranges: Ranges) -> tuple[Size, Size]:
    """An interval [lo, hi] holding every value of ``expr`` over the variable ranges.

    With symbolic sizes (a range, or a divisor, that is an expression in Dynamo's size symbols;
    an expression in size symbols alone is one value per call) the bounds are expressions valid
    for every value of the symbols; a product whose factors' signs are not known raises
    UnknownSign. Integer ranges and divisors give ints."""
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        if expr not in ranges:
            if expr.is_positive is True:  # a size symbol
                return expr, expr
            raise KeyError(f"no range known for index variable {expr}")
        n = ranges[expr]
        return (0, max(int(n) - 1, 0)) if _is_int(n) else (0, n - 1)
    if expr.is_Add:
        lo = hi = 0
        for arg in expr.args:
            a, b = bounds(arg, ranges)
            lo, hi = lo + a, hi + b
        return lo, hi
    if expr.is_Mul:
        parts = [bounds(arg, ranges) for arg in expr.args]
        if all(_is_int(a) and _is_int(b) for a, b in parts):
            lo, hi = 1, 1
            for a, b in parts:
                cands = (lo * a, lo * b, hi * a, hi * b)
                lo, hi = min(cands), max(cands)
            return lo, hi
        negative = [k for k, (a, b) in enumerate(parts) if _is_int(a) and a == b and a < 0]
        rest = [p for k, p in enumerate(parts) if k not in negative[:1]]
        if len(negative) > 1 or not all(known_nonneg(a) for a, _ in rest):
            raise UnknownSign(f"bounds of a symbolic product with factors of unknown sign: {expr!r}")
        lo, hi = sympy.Mul(*(a for a, _ in rest)), sympy.Mul(*(b for _, b in rest))
        if negative:
            c = parts[negative[0]][0]
            return c * hi, c * lo
        return lo, hi
    if isinstance(expr, FloorDiv):
        a, b = bounds(expr.args[0], ranges)
        d = expr.args[1]
        if _is_int(a) and _is_int(b) and d.is_Integer:
            return a // int(d), b // int(d)
        return FloorDiv(a, d), FloorDiv(b, d)  # floor is monotonic for a positive divisor
    if isinstance(expr, ModIdx):
        a, b = bounds(expr.args[0], ranges)
        d = expr.args[1]
        if _is_int(a) and _is_int(b) and d.is_Integer:
            if a >= 0 and b < int(d):
                return a, b
            return 0, int(d) - 1
        if known_nonneg(a) and known_le(b + 1, d):
            return a, b
        return 0, d - 1
    if isinstance(expr, Clamp):
        a, b = bounds(expr.args[0], ranges)
        lo, hi = int(expr.args[1]), int(expr.args[2])
        if _is_int(a) and _is_int(b):
            return min(max(a, lo), hi), min(max(b, lo), hi)
        return lo, hi  # within the clamp's own bounds, whatever its operand
    if expr.free_symbols and all(s.is_positive is True and s not in ranges for s in expr.free_symbols):
        return expr, expr  # sizes alone (``s0**2``): one value per call
    raise TypeError(f"unsupported index expression {expr!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) or (isinstance(value, sympy.Expr) and value.is_Integer)


def simplify(expr: sympy.Expr, ranges: Ranges) -> sympy.Expr:
    """Remove FloorDiv/ModIdx that the ranges make redundant and fold div/mod pairs back."""
    if not isinstance(expr, sympy.Basic):
        expr = sympy.sympify(expr)
    if expr.is_Integer or expr.is_Symbol:
        return expr
    return _simplify(expr, tuple(ranges.items()))


# The scheduler simplifies the same indices again for every pair of groups it checks, and codegen
# for every position a window loads a producer at: a pure function of the expression and the
# ranges, remembered. Sympy expressions are immutable and compare structurally, so an equal key
# gives the expression computed the first time, which prints the same.
@functools.lru_cache(maxsize=1 << 16)
def _simplify(expr: sympy.Expr, range_items: tuple[tuple[sympy.Symbol, Size], ...]) -> sympy.Expr:
    ranges = dict(range_items)
    args = [simplify(a, ranges) for a in expr.args]
    if isinstance(expr, (FloorDiv, ModIdx)):
        inner, d = args
        try:
            lo, hi = bounds(inner, ranges)
        except UnknownSign:  # nothing is proven about the operand: the division stays
            return expr.func(inner, d)
        if known_nonneg(lo) and known_le(hi + 1, d):  # below its divisor
            return sympy.Integer(0) if isinstance(expr, FloorDiv) else inner
        if _is_int(lo) and _is_int(hi) and d.is_Integer and int(lo) // int(d) == int(hi) // int(d):
            k = int(lo) // int(d)  # within one period: [k*d, (k+1)*d)
            return sympy.Integer(k) if isinstance(expr, FloorDiv) else inner - k * d
        split = _split_small(inner, d, ranges)
        if split is None:
            return expr.func(inner, d)
        big, small, c, k = split
        if isinstance(expr, FloorDiv):  # (c*a + s) // (c*k) == a // k when 0 <= s < c
            return simplify(FloorDiv(big, k), ranges)
        return c * simplify(ModIdx(big, k), ranges) + small  # (c*a + s) % (c*k) == c*(a % k) + s
    if isinstance(expr, Clamp):
        inner, lo, hi = args[0], int(args[1]), int(args[2])
        a, b = bounds(inner, ranges)  # expressions where the ranges are: decided by proofs
        if known_le(lo, a) and known_le(b, hi):
            return inner
        if known_le(b, lo) or known_le(hi, a):  # always clamped to the same bound
            return sympy.Integer(lo if known_le(b, lo) else hi)
        return Clamp(inner, lo, hi)
    rebuilt = expr.func(*args)
    if rebuilt.is_Add:
        rebuilt = _fold_div_mod(rebuilt, ranges)
    return rebuilt


def simplify_at(expr: sympy.Expr, subst: Mapping[sympy.Symbol, sympy.Expr], ranges: Ranges) -> sympy.Expr:
    """``simplify(expr.xreplace(subst), ranges)``, remembered: the scheduler's proofs that a
    kernel's loads address the current row substitute the same producer indices for every
    candidate fusion that holds the producer."""
    if not isinstance(expr, sympy.Basic):
        expr = sympy.sympify(expr)
    return _simplify_at(expr, tuple(subst.items()), tuple(ranges.items()))


@functools.lru_cache(maxsize=1 << 16)
def _simplify_at(expr: sympy.Expr, subst_items: tuple[tuple[sympy.Symbol, sympy.Expr], ...],
                 range_items: tuple[tuple[sympy.Symbol, int], ...]) -> sympy.Expr:
    return simplify(expr.xreplace(dict(subst_items)), dict(range_items))


def _split_small(expr: sympy.Expr, d: sympy.Expr, ranges: Ranges) -> tuple[sympy.Expr, sympy.Expr, Size, Size] | None:
    """Write a sum as ``c*big + small`` with ``c*k == d`` and ``0 <= small < c``.

    Returns (big, small, c, k) for the largest such ``c`` > 1 the terms' coefficients allow, or
    None. A tiled kernel's flat index ``65536*x_outer + 1024*y_index + x_inner`` divided by
    1048576, say, is ``x_outer // 16``: the other terms never reach a multiple of 65536. A
    symbolic ``d`` splits at a factor it shares with a term (``common_factors``): a [rows, 64]
    iteration over a [2, s0, 64] buffer unravels ``(64*y + r) // (64*s0)`` to ``y // s0``.
    """
    if not expr.is_Add:
        return None
    for c, big, small in _splits(expr.args, d):
        if not small:
            continue  # FloorDiv/ModIdx's own eval already divides whole multiples out
        rest = sympy.Add(*small)
        try:
            lo, hi = bounds(rest, ranges)
        except UnknownSign:
            continue
        if known_nonneg(lo) and known_le(hi + 1, c):
            return sympy.Add(*big), rest, c, int(d) // c if d.is_Integer else quotient(d, c)
    return None


def _splits(terms: tuple[sympy.Expr, ...], d: sympy.Expr) -> Iterator[tuple[Size, list[sympy.Expr], list[sympy.Expr]]]:
    """Each ``c`` for ``_split_small``, largest first, with the terms it divides (divided by it)
    and the others. A constant ``d`` takes the gcds with the terms' constant coefficients."""
    if not d.is_Integer:
        for c in common_factors(terms, d):
            quotients = [quotient(t, c) for t in terms]
            yield c, [q for q in quotients if q is not None], [t for t, q in zip(terms, quotients) if q is None]
        return
    coeffs = [t.as_coeff_Mul() for t in terms]
    for c in sorted({math.gcd(int(d), int(k)) for k, _ in coeffs if k.is_Integer}, reverse=True):
        if c <= 1:
            return
        divides = [k.is_Integer and int(k) % c == 0 for k, _ in coeffs]
        yield (c, [(int(k) // c) * f for (k, f), ok in zip(coeffs, divides) if ok],
               [k * f for (k, f), ok in zip(coeffs, divides) if not ok])


def _fold_div_mod(expr: sympy.Expr, ranges: Ranges) -> sympy.Expr:
    """Rewrite ``c*ModIdx(y, m) + c*m*FloorDiv(y, m)`` into ``c*y`` until nothing changes.

    FloorDiv(x, a*m) equals FloorDiv(FloorDiv(x, a), m), so the mod of a division pairs with a
    division by the product; repeated, this folds a whole unravel/ravel round trip. The partner
    may also divide ``ModIdx(x, M)`` for a multiple ``M`` of ``a*m`` (the mod that ``ModIdx``'s own
    rules dropped from inside the first term): ``c*ModIdx(FloorDiv(x, a), m) +
    c*m*FloorDiv(ModIdx(x, M), a*m)`` is ``c*FloorDiv(ModIdx(x, M), a)``. With symbolic sizes
    ``c``, ``m``, ``a`` and ``M`` may be products of size symbols (a pair matches by structure, ``M``
    a multiple of ``a*m`` by ``quotient``).
    """
    changed = True
    while changed and expr.is_Add:
        changed = False
        terms = list(expr.args)
        for i, term in enumerate(terms):
            coeff, mod = _coeff_and(term, ModIdx)
            if mod is None:
                continue
            y, m = mod.args[0], mod.args[1]
            base, div = (y.args[0], y.args[1]) if isinstance(y, FloorDiv) else (y, sympy.Integer(1))
            partner = FloorDiv(base, div * m)
            target = coeff * m * partner
            for j, other in enumerate(terms):
                if j == i:
                    continue
                folded = None
                if other == target:
                    folded = y
                else:
                    ocoeff, ofac = _coeff_and(other, FloorDiv)
                    if (ofac is not None and ocoeff == coeff * m and ofac.args[1] == div * m
                            and isinstance(ofac.args[0], ModIdx) and ofac.args[0].args[0] == base
                            and _divides(div * m, ofac.args[0].args[1])):
                        folded = FloorDiv(ofac.args[0], div)  # ModIdx(x, M) itself where div is 1
                if folded is not None:
                    rest = [t for k, t in enumerate(terms) if k not in (i, j)]
                    expr = sympy.Add(coeff * folded, *rest)
                    changed = True
                    break
            if changed:
                break
    return expr


def _coeff_and(term: sympy.Expr, func: type[sympy.Function]) -> tuple[sympy.Expr, sympy.Function | None]:
    """A term ``c * func(...)`` as (c, the call), ``c`` a number or a product with size
    symbols; (term, None) for any other term."""
    coeff, factor = term.as_coeff_Mul()
    if isinstance(factor, func):
        return coeff, factor
    if term.is_Mul:
        calls = [f for f in term.args if isinstance(f, func)]
        if len(calls) == 1 and all(f.is_Number or f.is_positive is True for f in term.args if f is not calls[0]):
            return term / calls[0], calls[0]
    return term, None


def _divides(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether ``b`` is a multiple of ``a``: by ints where both are constants (the common case,
    without sympy's cancel), else for every value of the symbols."""
    if a.is_Integer and b.is_Integer:
        return int(b) % int(a) == 0
    return quotient(b, a) is not None


def ravel(index: Sequence[sympy.Expr], strides: Sequence[Size], offset: Size = 0) -> sympy.Expr:
    """The storage offset of a strided access."""
    return _ravel(tuple(index), tuple(strides), offset)


# Codegen ravels a producer's index again at every position a window loads it from, and at
# every candidate kernel the scheduler proves: sympy's arithmetic is the cost, the result the
# same for the same operands.
@functools.lru_cache(maxsize=1 << 16)
def _ravel(index: tuple[sympy.Expr, ...], strides: tuple[Size, ...], offset: Size) -> sympy.Expr:
    total: sympy.Expr = sympy.sympify(offset)
    for i, s in zip(index, strides):
        total += sympy.sympify(s) * i
    return total


def unravel(flat: sympy.Expr, sizes: Sequence[Size], strides: Sequence[Size]) -> list[sympy.Expr]:
    """The per-dimension index of a storage offset into a dense (possibly permuted) layout.

    Valid when the layout is non-overlapping and dense: each dimension's stride is the product of
    the sizes of the dimensions that vary faster than it. Symbolic sizes and strides must be
    valid divisors (``is_size``); a size symbol is at least 2, never a size-1 dim.
    """
    out: list[sympy.Expr] = []
    for size, stride in zip(sizes, strides):
        if known_le(size, 1):  # a size-1 dim is always 0; a size-0 one is never reached
            out.append(sympy.Integer(0))
        else:
            out.append(ModIdx(FloorDiv(flat, stride), size))
    return out


def is_dense(sizes: Sequence[Size], strides: Sequence[Size]) -> bool:
    """Non-overlapping and dense: some permutation of the dims is contiguous. With symbolic
    sizes or strides, for every value of the symbols, decided by structure
    (``dense_by_structure``): a layout not proven dense is reported not dense."""
    if not all(_is_int(v) for v in (*sizes, *strides)):
        return dense_by_structure(sizes, strides)
    dims = sorted((st, sz) for sz, st in zip(sizes, strides) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def dense_order(sizes: Sequence[Size], strides: Sequence[Size]) -> list[int]:
    """Dimensions from slowest to fastest varying in memory (ties keep the logical order).
    Symbolic strides are ordered where proven (``order_by_stride``)."""
    if not all(_is_int(s) for s in strides):
        return order_by_stride(strides)
    return sorted(range(len(sizes)), key=lambda d: (-strides[d], d))


def contiguous_strides(sizes: Sequence[Size]) -> tuple[Size, ...]:
    """Row-major strides; a size-0 dim strides as 1. Symbolic sizes give products of them
    (``[s0, s1, 64]``: ``(64*s1, 64, 1)``)."""
    strides = []
    acc = 1
    for size in reversed(sizes):
        strides.append(acc)
        acc *= max(size, 1) if _is_int(size) else at_least_one(size)
    return tuple(reversed(strides))


class IndexPrinter(sympy.printing.str.StrPrinter):
    """Prints an index as Python/Triton integer arithmetic. ``FloorDiv``/``ModIdx`` take
    non-negative operands, where truncating and floor division agree; ``indexing_signed.floored``
    marks the others, which print themselves as calls of the kernels' floor helpers.

    A sum inside a division or modulus is parenthesized: ``a + b // c`` would divide ``b`` only.
    """

    def _operand(self, expr: sympy.Expr) -> str:
        text = self._print(expr)
        return f"({text})" if expr.is_Add else text

    def _divisor(self, expr: sympy.Expr) -> str:
        text = self._print(expr)
        return text if expr.is_Atom else f"({text})"  # 64*s0 divides as one number

    def _print_FloorDiv(self, expr: FloorDiv) -> str:
        return f"({self._operand(expr.args[0])} // {self._divisor(expr.args[1])})"

    def _print_ModIdx(self, expr: ModIdx) -> str:
        return f"({self._operand(expr.args[0])} % {self._divisor(expr.args[1])})"

    def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> str:
        # a product of sizes (s0*s0*64): Triton has no ** on integers
        base, exp = expr.args
        if not (exp.is_Integer and exp > 0):
            raise ValueError(f"index {expr}: not a product of sizes")
        return "*".join([self._operand(base) if not base.is_Atom else self._print(base)] * int(exp))

    def _print_Clamp(self, expr: Clamp) -> str:
        # Selects, not tl.minimum/tl.maximum: Triton 3.6 compiled the bilinear upsampling of a
        # channels-last tensor wrongly with those (3.2 off; right in the interpreter, and right
        # with selects, on an H200 2026-11-23). A Clamp of constants never reaches the printer.
        a, lo, hi = (self._print(e) for e in expr.args)
        return f"tl.where({a} < {lo}, {lo}, tl.where({a} > {hi}, {hi}, {a}))"


def window_arithmetic(expr: sympy.Expr, scalars: frozenset[sympy.Symbol] = frozenset()) -> bool:
    """Whether an offset clamps, divides or takes a remainder of a value that varies across the
    block (not only of ``scalars``, a block's start): the offsets whose loads are issued element
    by element. Triton 3.6 vectorized such loads wrongly on the GPU: an average pool's
    channels-last gradient came out 0.6 off, right in the interpreter, and right once every
    load whose offset divides carried contiguity, divisibility and constancy hints of 1 (H200,
    2026-11-23; hinting only the loads that clamp or divide a sum was not enough)."""
    return any(isinstance(e, (Clamp, FloorDiv, ModIdx)) and not e.args[0].free_symbols <= scalars
               for e in sympy.preorder_traversal(expr))


def block_aligned(expr: sympy.Expr, blocks: Mapping[sympy.Symbol, tuple[int, sympy.Symbol]]) -> sympy.Expr:
    """``expr`` with the divisions of a block's index by a multiple of the block's size taken
    at the block's start. ``blocks`` maps an index (``xindex``) to its block size and the
    symbol of its start (``xoffset``, a multiple of the size): every lane of a block then has
    the same quotient, ``xindex // d == xoffset // d`` and ``xindex % d == xindex - d *
    (xoffset // d)``. A split reduction's ``(xindex // C, xindex % C)`` (split, channel) becomes
    a scalar and a contiguous block, which Triton vectorizes without the hints of
    ``window_arithmetic``. A symbolic ``d`` is taken where it is a multiple of the block's size
    for every value of the symbols (``64*s0`` for a block of 64), else left alone."""
    swaps: dict[sympy.Expr, sympy.Expr] = {}
    for e in expr.atoms(FloorDiv, ModIdx):
        v, d = e.args
        if v not in blocks or not _divides(sympy.Integer(blocks[v][0]), d):
            continue
        start = FloorDiv(blocks[v][1], d)
        swaps[e] = start if isinstance(e, FloorDiv) else v - d * start
    return expr.xreplace(swaps) if swaps else expr


def pexpr(expr: sympy.Expr) -> str:
    return _pexpr(type(expr), expr)


# Codegen prints each index of a kernel several times (its offset, its mask, a comment); the
# text depends on the expression alone. The type is part of the key: ``True == 1`` in Python.
@functools.lru_cache(maxsize=1 << 16)
def _pexpr(kind: type, expr: sympy.Expr) -> str:
    return IndexPrinter().doprint(expr)
