"""Sizes as sympy expressions in Dynamo's symbols: what symbolic compilation (issue 15) reads them as.

A graph with symbolic sizes (``symbolic.py``) holds ``SymInt`` sizes, strides and int inputs
whose expressions are in Dynamo's symbols (``s77``: integer, positive) and torch's own sympy
functions. fuse's IR and index arithmetic (``indexing.py``) have functions of their own
(``FloorDiv``, ``ModIdx``), whose proofs hold for every value of the symbols. This module is
the bridge, and the rules of the README's plan for symbolic compilation:

- ``to_sympy``: a traced size as an expression of fuse's, after the simplifications Dynamo's
  shape environment already knows without a new guard (its replacements, and the divisibility
  facts it guarded: ``view(-1, 4)`` of ``[s77, s27]`` traces its second size as
  ``(s27*s77)//((s27*s77)//4)``, which is 4 once ``s27*s77`` is known divisible by 4).
  Polynomials in the symbols, and divisions and remainders by a constant or a product of
  symbols; anything else raises ``NotSymbolic``, which sends the graph back to one compile per
  shape.
- ``hint``: an expression's value at the sizes of the call being compiled. Heuristics (block
  sizes, the cost model) may decide by it; correctness decisions may not.
- ``known_le`` and ``known_true``: proofs for every value the symbols may take, never a guard:
  the symbols' ranges in the shape environment (at least 2, and any bound Dynamo guarded), and
  the positive assumptions where the environment is not at hand.
"""

from __future__ import annotations

from typing import Any, Mapping

import sympy
import torch
from torch.utils._sympy import functions as torch_functions

from fusebackend import indexing


class NotSymbolic(Exception):
    """A graph, or one of its ops, that fuse cannot compile for every value of its symbols; the
    message says what. The graph is compiled once per shape instead."""


def to_sympy(value: Any) -> sympy.Expr:
    """An int or ``SymInt`` as an expression of fuse's (see the module's docstring)."""
    if isinstance(value, (int, sympy.Integer)) and not isinstance(value, bool):
        return sympy.Integer(int(value))
    if isinstance(value, torch.SymInt):
        node = value.node
        if node.is_nested_int():
            raise NotSymbolic(f"size {value}: a nested (jagged) size")
        expr = node.expr
        shape_env = getattr(node, "shape_env", None)
        if shape_env is not None:
            expr = shape_env.simplify(expr)  # replacements and divisibility known: no new guard
        return _convert(sympy.sympify(expr))
    raise NotSymbolic(f"{type(value).__name__} {value!r} is not a size")


def _convert(expr: sympy.Expr) -> sympy.Expr:
    if expr.is_Integer:
        return expr
    if expr.is_Symbol:
        if expr.is_integer is not True or expr.is_positive is not True:
            raise NotSymbolic(f"symbol {expr} is not a positive integer size")
        return expr
    if expr.is_Add or expr.is_Mul:
        return expr.func(*(_convert(a) for a in expr.args))
    if isinstance(expr, (sympy.Pow, torch_functions.PowByNatural)) and expr.args[1].is_Integer and expr.args[1] >= 0:
        return _convert(expr.args[0]) ** int(expr.args[1])
    if isinstance(expr, torch_functions.FloorDiv):
        return indexing.FloorDiv(_convert(expr.args[0]), _divisor(expr, expr.args[1]))
    if isinstance(expr, torch_functions.ModularIndexing):  # (base // divisor) % modulus
        base, divisor, modulus = expr.args
        return indexing.ModIdx(indexing.FloorDiv(_convert(base), _divisor(expr, divisor)), _divisor(expr, modulus))
    raise NotSymbolic(f"size {expr}: {type(expr).__name__} is not handled symbolically")


def _divisor(whole: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr:
    d = _convert(divisor)
    if (d.is_Integer and d > 0) or indexing.is_size(d):
        return d
    raise NotSymbolic(f"size {whole}: divides by {divisor}, neither a positive constant nor a product of sizes")


def hint(expr: sympy.Expr | int, bound: Mapping[sympy.Symbol, int]) -> int:
    """``expr`` at the bound sizes (``symbolic.binding`` of the call being compiled)."""
    if isinstance(expr, int):
        return expr
    value = sympy.sympify(expr).xreplace(dict(bound))
    if not value.is_Integer:  # a function of bound symbols is evaluated by xreplace; left over: unbound
        raise NotSymbolic(f"size {expr}: {sorted(map(str, value.free_symbols))} not bound by the inputs")
    return int(value)


def ranges(shape_env: Any) -> dict[sympy.Symbol, tuple[int, int | None]]:
    """Each symbol's (lower, upper) bound in Dynamo's shape environment (upper None: unbounded),
    as Dynamo learned them: at least 2 for a size, and any bound it guarded."""
    out: dict[sympy.Symbol, tuple[int, int | None]] = {}
    for symbol, vr in getattr(shape_env, "var_to_range", {}).items():
        lower = int(vr.lower) if vr.lower.is_Integer else indexing.SIZE_FLOOR  # not torch's int_oo
        upper = int(vr.upper) if vr.upper.is_Integer else None
        out[symbol] = (lower, upper)
    return out


def known_le(a: sympy.Expr | int, b: sympy.Expr | int, shape_env: Any = None) -> bool:
    """Whether ``a <= b`` for every value the symbols may take (``indexing.known_le``), each
    symbol at least its lower bound in ``shape_env`` where it is given: ``64*s0 >= 256`` is
    proven for a symbol Dynamo knows to be at least 4. Never guards."""
    floors = {s: lower for s, (lower, _) in ranges(shape_env).items()} if shape_env is not None else None
    return indexing.known_le(a, b, floors)


def known_true(relation: Any, shape_env: Any) -> bool | None:
    """True or False where Dynamo's shape environment decides ``relation`` (an expression of
    Dynamo's symbols and torch's functions, as traced) for every value of the symbols, without
    adding a guard; None where it does not."""
    result = shape_env._maybe_evaluate_static(sympy.sympify(relation))
    if result is None:
        return None
    return bool(result) if result in (sympy.true, sympy.false) else None
