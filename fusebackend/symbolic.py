"""Symbolic sizes in the graphs fuse is handed.

Dynamo gives a graph symbolic sizes under ``dynamic=True``, for a dimension marked with
``torch._dynamo.mark_dynamic``, and by default once a second size has been seen (automatic
dynamic shapes). AOTAutograd's graph then has ``SymInt`` placeholders and fake tensors whose sizes
are expressions in Dynamo's symbols (``s77``, ``s27``...).

fuse compiles each concrete input signature of such a graph on its own (``backend.FusedGraph``):
lowering, scheduling and codegen work on concrete sizes. ``symbols`` names a graph's symbols so
that the metrics (``metrics.specialized``) can say which graphs were symbolic and how many shapes
each was compiled for. ``binding`` and ``concrete`` give lowering a node's traced value at the
sizes being compiled, without a guard on Dynamo's shape environment.
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch
import torch.fx

from fusebackend import sizevars


def symbols(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The names of the symbols in the sizes, strides and int inputs of ``gm``'s placeholders
    (their traced values, ``node.meta["val"]``), sorted; empty where none has any (or where the
    graph kept no traced values, as one rebuilt from a cache)."""
    found: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            found.update(_symbols_of(node.meta.get("val")))
    return tuple(sorted(found, key=lambda s: (len(s), s)))


def _symbols_of(value: Any) -> set[str]:
    if isinstance(value, torch.SymInt):
        return {str(s) for s in value.node.expr.free_symbols}
    if isinstance(value, torch.Tensor):
        out: set[str] = set()
        for n in (*value.shape, *value.stride()):
            out |= _symbols_of(n)
        return out
    return set()


def binding(gm: torch.fx.GraphModule, args: Sequence[Any]) -> dict[sympy.Symbol, int]:
    """Each symbol that is a placeholder's size, stride or int value, bound to that value in
    ``args`` (the call being compiled)."""
    bound: dict[sympy.Symbol, int] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, arg in zip(placeholders, args):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(arg, int):
            _bind(val, arg, bound)
        elif isinstance(val, torch.Tensor) and isinstance(arg, torch.Tensor) and val.dim() == arg.dim():
            for s, n in zip((*val.shape, *val.stride()), (*arg.shape, *arg.stride())):
                _bind(s, n, bound)
    return bound


def fits(gm: torch.fx.GraphModule, args: Sequence[Any]) -> bool:
    """Whether ``args`` are what ``gm``'s traced inputs are at the symbols' values that ``args``
    give (``binding``): each tensor's dtype, device type, sizes and strides, and each int. A
    graph compiled for every value of its symbols serves such a call."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        return False
    bound = binding(gm, args)
    for node, arg in zip(placeholders, args):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            if not isinstance(arg, torch.Tensor) or (arg.dtype, arg.dim(), arg.device.type) != (
                    val.dtype, val.dim(), val.device.type):
                return False
            want = concrete(val, bound)
            if want is None or tuple(want.shape) != tuple(arg.shape) or not sizevars.same_layout(
                    arg.shape, want.stride(), arg.stride()):  # a stride of a dim of size 1 addresses nothing
                return False
        elif isinstance(val, torch.SymInt):
            if type(arg) is not int or _int(val, bound) != arg:
                return False
        elif type(arg) is not type(val) or arg != val:  # a number the graph was traced with
            return False
    return True


def _bind(value: Any, actual: int, bound: dict[sympy.Symbol, int]) -> None:
    if isinstance(value, torch.SymInt) and isinstance(value.node.expr, sympy.Symbol):
        bound[value.node.expr] = int(actual)


def concrete(value: Any, bound: dict[sympy.Symbol, int]) -> Any:
    """A traced value at this call's sizes, read without asking Dynamo's shape environment (a
    comparison of a ``SymInt`` would guard on it, and specialize the graph's values to the
    first sizes compiled): a ``SymInt`` as its int, a tensor with symbolic sizes or strides as a
    meta tensor of the bound ones; None for a tensor or int whose symbols are not all bound.
    Lists and tuples are mapped."""
    if isinstance(value, (list, tuple)):
        return type(value)(concrete(v, bound) for v in value)
    if isinstance(value, torch.SymInt):
        return _int(value, bound)
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        dims = (*value.shape, *value.stride())
        if all(type(d) is int for d in dims):
            return value
        ints = [_int(d, bound) for d in dims]
        if any(d is None for d in ints):
            return None
        return torch.empty_strided(ints[:value.dim()], ints[value.dim():], dtype=value.dtype, device="meta")
    return value


def _int(value: Any, bound: dict[sympy.Symbol, int]) -> int | None:
    if type(value) is int:
        return value
    expr = sympy.sympify(sympy.sympify(value.node.expr).xreplace(bound))
    return int(expr) if expr.is_Integer else None
