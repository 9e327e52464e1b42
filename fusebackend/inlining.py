"""Substituting a pointwise producer's body for loads of the buffer it writes.

Shared by the scheduler (recomputing cheap pointwise results in their readers, proving what a
fused kernel reads), codegen (evaluating in-kernel producers where they are loaded) and lowering
(tracing what an in-place write into an input reads of it).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import sympy

from fusebackend import indexing, ir


def producer_index(
    producer: ir.Node, view: ir.View, idx: Sequence[sympy.Expr], ranges: dict[sympy.Symbol, int]
) -> list[sympy.Expr]:
    """The index into ``producer``'s own dims of element ``view[idx]`` of the buffer it writes."""
    buf = producer.buffer
    if view.is_whole():
        return list(idx)
    flat = indexing.ravel(idx, view.strides, view.offset)
    return [indexing.simplify(e, ranges) for e in indexing.unravel(flat, buf.sizes, buf.strides)]


def loop_ranges(node: ir.Pointwise | ir.Reduction | ir.Scan) -> dict[sympy.Symbol, Any]:
    """The extent of each loop variable of ``node``'s body: ``i`` over its ranges, and for a
    reduction ``r`` over its reduction ranges."""
    ranges = dict(zip(indexing.loop_vars("i", len(node.ranges)), node.ranges))
    if isinstance(node, ir.Reduction):
        ranges.update(zip(indexing.loop_vars("r", len(node.reduction_ranges)), node.reduction_ranges))
    return ranges


def substitute(node: ir.Pointwise | ir.Reduction | ir.Scan, inlined: Mapping[str, ir.Pointwise]) -> ir.Expr:
    """``node``'s body with each plain load of an ``inlined`` buffer replaced by that node's body
    (one level: pass bodies already expanded to inline chains)."""
    ranges = loop_ranges(node)

    def leaf(e: ir.Expr) -> ir.Expr | None:
        if not isinstance(e, ir.Load) or e.view.buffer.name not in inlined:
            return None
        producer = inlined[e.view.buffer.name]
        idx = [indexing.simplify(sympy.sympify(i), ranges) for i in e.index]
        pidx = producer_index(producer, e.view, idx, ranges)
        pvars = indexing.loop_vars("i", len(producer.buffer.sizes))
        return ir.substitute_index(producer.body, dict(zip(pvars, pidx)))

    return ir.map_expr(node.body, leaf)


def substitute_gathered(load: ir.IndirectLoad, producer: ir.Pointwise) -> ir.Expr | None:
    """``producer``'s body evaluated where the gather ``load`` reads the buffer it writes: the
    loop indices along the gathered dims are the run-time positions, so each load of the body
    that runs along such a dim becomes a gather itself (checked as ``load`` is, against a dim of
    the same size), and the other loads read at the gather's index. None where the body uses a
    gathered dim otherwise (inside an index expression, or through a gather of its own), or
    where a checked position would go unchecked (no load of the body runs along its dim).

    This is how a log-softmax is never stored for a loss that gathers one value per row from it:
    the gather reads the logit, the row's maximum and its log-sum at the target's position."""
    if load.valid is not None or not load.view.is_whole():
        return None
    sizes = producer.buffer.sizes
    pvars = indexing.loop_vars("i", len(sizes))
    at = {pvars[d]: p for d, p in load.positions}
    fixed = {v: sympy.sympify(e) for v, e in zip(pvars, load.index) if v not in at}
    carried: set[sympy.Symbol] = set()
    failed = False

    def leaf(e: ir.Expr) -> ir.Expr | None:
        nonlocal failed
        if isinstance(e, ir.IndirectLoad):
            failed = True
            return e
        if isinstance(e, ir.IndexValue):
            index = sympy.sympify(e.index)
            if index in at:
                return ir.cast(at[index], e.dtype)
            failed = failed or bool(index.free_symbols & at.keys())
            return ir.IndexValue(index.xreplace(fixed), e.dtype)
        if not isinstance(e, ir.Load):
            return None
        idx = [sympy.sympify(i) for i in e.index]
        positions: list[tuple[int, ir.Expr]] = []
        for m, i in enumerate(idx):
            if not i.free_symbols & at.keys():
                continue
            if i not in at or e.view.sizes[m] != sizes[pvars.index(i)]:
                failed = True
                return e
            positions.append((m, at[i]))
            carried.add(i)
        rest = tuple(sympy.Integer(0) if any(m == d for d, _ in positions) else i.xreplace(fixed)
                     for m, i in enumerate(idx))
        if not positions:
            return ir.Load(e.view, rest)
        (dim, position), *more = positions
        return ir.IndirectLoad(e.view, rest, dim, position, more=tuple(more), checked=load.checked)

    body = ir.map_expr(producer.body, leaf)
    if failed or (load.checked and carried != set(at)):
        return None
    return body
