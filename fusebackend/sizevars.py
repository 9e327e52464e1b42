"""Sizes as sympy expressions in Dynamo's symbols: what symbolic compilation reads them as.

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
- ``layout`` and ``dense_strides``: a traced tensor's sizes and strides so converted, and the
  strides that lay symbolic sizes out in the order a meta function chose at the hints.
- ``hint``: an expression's value at the sizes of the call being compiled. Heuristics (block
  sizes, the cost model, the memory plan's peak) may decide by it; correctness decisions may
  not. ``size_hint`` reads it for the graph being compiled (``hinted``, which the pipeline holds
  around lowering, scheduling and code generation), so that those figures stay ints.
- ``known_le`` and ``known_true``: proofs for every value the symbols may take, never a guard:
  the symbols' ranges in the shape environment (at least 2, and any bound Dynamo guarded, which
  PyTorch's ``bound_sympy`` applies), and the positive assumptions where the environment is not
  at hand.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import sympy
import torch
from torch.utils import _pytree as pytree
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


def shape_env_of(gm: Any) -> Any:
    """The shape environment of a graph's traced values (Dynamo's), or None."""
    for node in gm.graph.nodes:
        for value in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(value, torch.SymInt):
                return value.node.shape_env
            mode = getattr(value, "fake_mode", None)
            if mode is not None and getattr(mode, "shape_env", None) is not None:
                return mode.shape_env
    return None


def layout(value: Any) -> tuple[tuple[sympy.Expr, ...], tuple[sympy.Expr, ...]]:
    """A traced tensor's (``node.meta["val"]``) sizes and strides as fuse's expressions."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        raise NotSymbolic(f"no traced strided tensor to read sizes from ({type(value).__name__})")
    return tuple(to_sympy(s) for s in value.shape), tuple(to_sympy(s) for s in value.stride())


def dense_strides(sizes: Sequence[sympy.Expr], like: Sequence[int],
                  bound: Mapping[sympy.Symbol, int]) -> tuple[sympy.Expr, ...]:
    """Strides that lay ``sizes`` out in the dims' order of ``like`` (a dense layout of them at
    the bound sizes: what ATen's meta function gave there), each the product of the sizes inside
    it: dense for every value of the symbols. ``NotSymbolic`` where ``like`` is no such layout."""
    order = sorted(range(len(sizes)), key=lambda d: (-like[d], d))  # slowest first, as indexing.dense_order
    strides: list[sympy.Expr] = [sympy.Integer(1)] * len(sizes)
    inner: sympy.Expr = sympy.Integer(1)
    for d in reversed(order):
        strides[d], inner = inner, inner * sizes[d]
    if not same_layout(hints(sizes, bound), hints(strides, bound), like):
        raise NotSymbolic(f"layout {tuple(like)} of sizes {tuple(sizes)} is not dense")
    return tuple(strides)


def same_layout(sizes: Sequence[int], strides: Sequence[int], others: Sequence[int]) -> bool:
    """Whether two layouts of ``sizes`` address the same elements: equal strides, but for dims of
    size 1 (whose index is always 0)."""
    return len(strides) == len(others) and all(n == 1 or a == b for n, a, b in zip(sizes, strides, others))


def symbolic(values: Sequence[Any]) -> bool:
    """Whether any of ``values`` (sizes, strides) is an expression in size symbols."""
    return any(getattr(v, "free_symbols", None) for v in values)


def hints(exprs: Sequence[sympy.Expr | int], bound: Mapping[sympy.Symbol, int]) -> tuple[int, ...]:
    """``hint`` of each of ``exprs``."""
    return tuple(hint(e, bound) for e in exprs)


def hint(expr: sympy.Expr | int, bound: Mapping[sympy.Symbol, int]) -> int:
    """``expr`` at the bound sizes (``symbolic.binding`` of the call being compiled)."""
    if isinstance(expr, int):
        return expr
    value = sympy.sympify(sympy.sympify(expr).xreplace(dict(bound)))  # a lone symbol becomes its int
    if not value.is_Integer:  # a function of bound symbols is evaluated by xreplace; left over: unbound
        raise NotSymbolic(f"size {expr}: {sorted(map(str, value.free_symbols))} not bound by the inputs")
    return int(value)


_HINTS: list[Mapping[sympy.Symbol, int]] = [{}]


@contextlib.contextmanager
def hinted(bound: Mapping[sympy.Symbol, int]) -> Iterator[None]:
    """Within: ``size_hint`` reads symbols at ``bound`` (the call a graph is compiled at)."""
    _HINTS.append(bound)
    try:
        yield
    finally:
        _HINTS.pop()


def size_hint(expr: sympy.Expr | int) -> int:
    """``expr`` at the sizes of the graph being compiled (``hinted``), for the heuristics that
    may decide by them (the cost model, block sizes); an int as it is."""
    if isinstance(expr, int):
        return expr
    return int(expr) if getattr(expr, "is_Integer", False) else hint(expr, _HINTS[-1])


_DECLINED: list[tuple[list[str], bool]] = [([], False)]


@contextlib.contextmanager
def noting_declines(strict: bool = False) -> Iterator[list[str]]:
    """Within: ``decline`` notes, in the list this yields, each kernel choice that a compile for
    one shape would make at the hints and the compile for every size does not (a split
    reduction, an op lowered into kernels at one shape only); ``strict`` (``config.symbolic`` "auto"): the first one raises
    ``NotSymbolic`` instead, and the graph is compiled per shape, without lowering the rest."""
    _DECLINED.append(([], strict))
    try:
        yield _DECLINED[-1][0]
    finally:
        _DECLINED.pop()


def decline(what: str) -> None:
    """Note a kernel choice declined over symbolic sizes (``noting_declines``)."""
    noted, strict = _DECLINED[-1]
    if strict:
        raise NotSymbolic(f"{what} at the first call's sizes, which the compile for every size does not make "
                          "(FUSE_SYMBOLIC=on compiles it without)")
    noted.append(what)


def ceil_div(a: int | sympy.Expr, b: int) -> int | sympy.Expr:
    """``a / b`` rounded up (a grid over ``a`` elements in blocks of ``b``), an expression of
    fuse's where ``a`` is symbolic."""
    if isinstance(a, int) or a.is_Integer:
        return -(-int(a) // b)
    return indexing.FloorDiv(a + (b - 1), b)


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
    if indexing.known_le(a, b, floors):
        return True
    if shape_env is None or isinstance(a, int) and isinstance(b, int):
        return False
    # upper bounds too (a slice up to s0 guarded s0 <= its base's size): PyTorch's value ranges
    from torch.utils._sympy.value_ranges import bound_sympy

    difference = sympy.expand(sympy.sympify(b) - sympy.sympify(a))
    try:
        lower = bound_sympy(difference, shape_env.var_to_range).lower
    except Exception:  # a function of ours that PyTorch's ranges do not know (FloorDiv, ModIdx)
        return False
    return bool(lower.is_number and lower >= 0)


def known_true(relation: Any, shape_env: Any) -> bool | None:
    """True or False where Dynamo's shape environment decides ``relation`` (an expression of
    Dynamo's symbols and torch's functions, as traced) for every value of the symbols, without
    adding a guard; None where it does not."""
    result = shape_env._maybe_evaluate_static(sympy.sympify(relation))
    if result is None:
        return None
    return bool(result) if result in (sympy.true, sympy.false) else None
