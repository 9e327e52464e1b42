"""Proving gather positions in range, so that their kernels need no index check.

A gather (``ir.IndirectLoad``) lowered from an index tensor is ``checked``: its kernel asserts
that every position lies in its dim. Where the index tensor is computed in the graph from values
whose range is known, that is proven here and the check dropped. ``prove_positions`` computes an
interval for every integer (and bool) buffer a pointwise node or a reduction writes, in graph
order, by interval arithmetic over its body:

- constants; loop indices (``IndexValue``: the index expression's bounds over the node's ranges);
- loads of buffers with a known interval: the graph's integer constants (their values), and
  the buffers proven before (graph inputs and extern results have none);
- ``argmax``/``argmin``: [0, reduced elements - 1]; ``max``/``min``: their body's interval;
- add, sub, mul, neg, abs, maximum, minimum, division and remainder by constants, integer casts
  that keep the interval in the target type, comparisons (bool);
- ``where(x < c, a, b)`` (any comparison of a value with another): ``a`` with ``x`` narrowed to
  where the comparison holds, ``b`` to where it does not. That is how ``clamp`` is lowered, and
  how advanced indexing wraps negative positions (``where(p < 0, p + n, p)``).

A gather whose positions all lie in [0, size of their dim) is then unchecked. Floats have no
interval here: a position computed through floats (nearest-neighbour upsampling's) stays
checked. Over symbolic sizes the bounds may be expressions in the size symbols; where
sympy cannot decide a comparison of them for every value, nothing of that node is proven.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.indexing_symbolic import known_le

Interval = Optional[tuple[int, int]]
_COMPARISONS = {"lt", "le", "gt", "ge"}
_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def prove_positions(graph: ir.IRGraph) -> ir.IRGraph:
    """The graph with the gathers whose positions are proven in range marked unchecked."""
    known = _constant_intervals(graph)
    nodes: list[ir.Node] = []
    for node in graph.nodes:
        if isinstance(node, (ir.Pointwise, ir.Reduction)):
            try:
                ranges = _ranges(node)
                proven = dataclasses.replace(node, body=ir.map_expr(node.body, lambda e: _proven(e, known, ranges)))
                interval = _buffer_interval(proven, known, ranges)
            except TypeError:  # over symbolic sizes, a comparison sympy cannot decide: nothing proven
                proven, interval = node, None
            node = proven
            if interval is not None:
                known[node.name] = interval
        nodes.append(node)
    return dataclasses.replace(graph, nodes=nodes)


def _constant_intervals(graph: ir.IRGraph) -> dict[str, tuple[int, int]]:
    """The interval of each integer or bool tensor the graph holds as a constant: its values are
    known when the graph is compiled (an index tensor written in the model's code, such as
    Falcon's selection of its key and value heads, ``qkv[..., [-2]]``)."""
    known = {}
    for buf, value in graph.constants:
        if value.numel() and not value.dtype.is_floating_point and not value.dtype.is_complex:
            known[buf.name] = (int(value.min()), int(value.max()))
    return known


def _ranges(node: ir.Pointwise | ir.Reduction) -> dict[sympy.Symbol, int]:
    # a symbolic size is at least 2 (Dynamo's size symbols)
    extent = lambda n: max(n, 1) if isinstance(n, int) else n  # noqa: E731
    ranges = dict(zip(indexing.loop_vars("i", len(node.ranges)), map(extent, node.ranges)))
    if isinstance(node, ir.Reduction):
        rr = node.reduction_ranges
        ranges.update(zip(indexing.loop_vars("r", len(rr)), map(extent, rr)))
    return ranges


def _proven(expr: ir.Expr, known: dict[str, tuple[int, int]], ranges: dict[sympy.Symbol, int]) -> ir.Expr | None:
    if isinstance(expr, ir.Op) and expr.name == "checked_position":  # a scatter's, as a comparison
        position, size = expr.args
        interval = _Intervals(known, ranges).of(position)
        if interval is None or not (_le(0, interval[0]) and _le(interval[1] + 1, int(size.value))):  # type: ignore[union-attr]
            return None
        return position
    if not isinstance(expr, ir.IndirectLoad) or not expr.checked:
        return None
    for dim, position in expr.positions:
        interval = _Intervals(known, ranges).of(position)
        if interval is None or not (_le(0, interval[0]) and _le(interval[1] + 1, expr.view.sizes[dim])):
            return None
    return dataclasses.replace(expr, checked=False)


def _buffer_interval(node: ir.Node, known: dict[str, tuple[int, int]], ranges: dict[sympy.Symbol, int]) -> Interval:
    dtype = node.buffer.dtype
    if dtype.is_floating_point or dtype.is_complex:
        return None
    if dtype == torch.bool:
        return (0, 1)
    if isinstance(node, ir.Reduction):
        if node.reduction_type in ("argmax", "argmin"):
            return (0, _max(node.reduction_numel - 1, 0))
        if node.reduction_type not in ("max", "min"):
            return None
    interval = _Intervals(known, ranges).of(node.body)
    info = torch.iinfo(dtype)
    return None if interval is None or interval == (info.min, info.max) else _fits(interval, dtype)


def _fits(interval: Interval, dtype: torch.dtype) -> Interval:
    """``interval`` where every value of it is representable in ``dtype`` (an integer type)."""
    if interval is None:
        return None
    if dtype == torch.bool:
        return (0, 1)
    info = torch.iinfo(dtype)
    if any(not isinstance(v, int) for v in interval):  # expressions in size symbols
        # taken as within int64's range (positions in tensors, whose sizes are); a narrower
        # type's range is not proven
        return interval if dtype == torch.int64 else None
    return interval if info.min <= interval[0] and interval[1] <= info.max else None


class _Intervals:
    """Intervals of integer expressions of one node's body; ``narrowed`` holds what a ``where``
    branch knows about an expression."""

    def __init__(self, known: dict[str, tuple[int, int]], ranges: dict[sympy.Symbol, int],
                 narrowed: dict[ir.Expr, tuple[int, int]] | None = None) -> None:
        self.known = known
        self.ranges = ranges
        self.narrowed = narrowed or {}

    def of(self, expr: ir.Expr) -> Interval:
        """The interval of an integer or bool expression (at worst its type's whole range);
        None for floats."""
        if expr in self.narrowed:
            return self.narrowed[expr]
        dtype = expr.dtype
        if dtype.is_floating_point or dtype.is_complex:
            return None
        if dtype == torch.bool:
            return (0, 1)
        interval: Interval = None
        if isinstance(expr, ir.Constant):
            interval = (int(expr.value), int(expr.value))
        elif isinstance(expr, ir.IndexValue):
            interval = indexing.bounds(sympy.sympify(expr.index), self.ranges)
        elif isinstance(expr, (ir.Load, ir.IndirectLoad)):
            interval = self.known.get(expr.view.buffer.name)
        elif isinstance(expr, ir.Op):
            interval = self._op(expr)
        # beyond the type's range the value wraps: it can be anything the type holds
        return _fits(interval, dtype) or (torch.iinfo(dtype).min, torch.iinfo(dtype).max)

    def _op(self, expr: ir.Op) -> Interval:
        name, args = expr.name, expr.args
        if name == "where":
            return self._where(*args)
        if name == "to":
            source = args[0]
            return None if source.dtype.is_floating_point else self.of(source)
        if name == "checked_position":  # asserted in [0, size) where used
            return (0, int(args[1].value) - 1)  # type: ignore[union-attr]
        values = [self.of(a) for a in args]
        if any(v is None for v in values):  # a float operand
            return None
        if name == "neg":
            (lo, hi), = values
            return (-hi, -lo)
        if name == "abs":
            (lo, hi), = values
            return (0 if _le(lo, 0) and _le(0, hi) else _min(abs(lo), abs(hi)), _max(abs(lo), abs(hi)))
        (a, b), (c, d) = values if len(values) == 2 else (values[0], values[0])
        if name == "add":
            return (a + c, b + d)
        if name == "sub":
            return (a - d, b - c)
        if name == "mul":
            products = (a * c, a * d, b * c, b * d)
            return (_min(*products), _max(*products))
        if name == "maximum":
            return (_max(a, c), _max(b, d))
        if name == "minimum":
            return (_min(a, c), _min(b, d))
        if name in ("int_truncdiv", "int_truncmod") and isinstance(c, int) and c == d and c > 0:
            if name == "int_truncdiv":  # truncation is monotone in the dividend
                return (_trunc_div(a, c, low=True), _trunc_div(b, c, low=False))
            bound = c - 1  # the remainder has the dividend's sign
            return (0 if _le(0, a) else _max(a, -bound), 0 if _le(b, 0) else _min(b, bound))
        if name == "bitwise_and" and (_le(0, a) or _le(0, c)):  # no larger than a non-negative operand
            return (0, _min(*(hi for lo, hi in ((a, b), (c, d)) if _le(0, lo))))
        return None

    def _where(self, condition: ir.Expr, then: ir.Expr, otherwise: ir.Expr) -> Interval:
        branches = []
        for holds, value in ((True, then), (False, otherwise)):
            known = self._branch(condition, holds)
            if known is not None:  # None: the branch is never taken
                branches.append(known.of(value))
        if not branches or any(b is None for b in branches):
            return None
        return (_min(*(b[0] for b in branches)), _max(*(b[1] for b in branches)))

    def _branch(self, condition: ir.Expr, holds: bool) -> "_Intervals | None":
        """What is known where ``condition`` is (or is not) true: a value compared with another
        lies on one side of it. None where the condition never is (or always is) true."""
        if not (isinstance(condition, ir.Op) and condition.name in _COMPARISONS):
            return self
        name = condition.name if holds else {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}[condition.name]
        narrowed = dict(self.narrowed)
        for x, y, cmp in ((condition.args[0], condition.args[1], name),
                          (condition.args[1], condition.args[0], _FLIPPED[name])):
            xi, yi = self.of(x), self.of(y)
            if xi is None or yi is None:
                continue
            lo, hi = xi
            if cmp == "lt":
                hi = _min(hi, yi[1] - 1)
            elif cmp == "le":
                hi = _min(hi, yi[1])
            elif cmp == "gt":
                lo = _max(lo, yi[0] + 1)
            else:
                lo = _max(lo, yi[0])
            if not _le(lo, hi):
                return None
            narrowed[x] = (lo, hi)
        return _Intervals(self.known, self.ranges, narrowed)


def _le(a: Any, b: Any) -> bool:
    """``a <= b``; over size symbols, for every value they take (``indexing_symbolic.known_le``),
    and TypeError where that is decided neither way (the caller proves nothing then)."""
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    if known_le(a, b):
        return True
    if known_le(sympy.sympify(b) + 1, a):
        return False
    raise TypeError(f"{a} <= {b} is not decided for every size")


def _min(*values: Any) -> Any:
    return functools.reduce(lambda a, b: b if _le(b, a) else a, values)


def _max(*values: Any) -> Any:
    return functools.reduce(lambda a, b: b if _le(a, b) else a, values)


def _trunc_div(a: Any, b: int, low: bool) -> Any:
    """``a`` divided by ``b`` > 0, truncated; for an expression in size symbols, a bound of it
    (``low``: a lower one): 0 below a non-negative ``a``, ``a`` itself above it."""
    if not isinstance(a, int):
        if not _le(0, a):
            raise TypeError(f"the sign of {a}")
        return 0 if low else a
    q = abs(a) // b
    return q if a >= 0 else -q
