"""Substituting a pointwise producer's body for loads of the buffer it writes.

Shared by the scheduler (recomputing cheap pointwise results in their readers, proving what a
fused kernel reads), codegen (evaluating in-kernel producers where they are loaded) and lowering
(tracing what an in-place write into an input reads of it).
"""

from __future__ import annotations

from typing import Mapping, Sequence

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


def substitute(node: ir.Pointwise | ir.Reduction | ir.Scan, inlined: Mapping[str, ir.Pointwise]) -> ir.Expr:
    """``node``'s body with each plain load of an ``inlined`` buffer replaced by that node's body
    (one level: pass bodies already expanded to inline chains)."""
    ranges = dict(zip(indexing.loop_vars("i", len(node.ranges)), node.ranges))
    if isinstance(node, ir.Reduction):
        ranges.update(zip(indexing.loop_vars("r", len(node.reduction_ranges)), node.reduction_ranges))

    def leaf(e: ir.Expr) -> ir.Expr | None:
        if not isinstance(e, ir.Load) or e.view.buffer.name not in inlined:
            return None
        producer = inlined[e.view.buffer.name]
        idx = [indexing.simplify(sympy.sympify(i), ranges) for i in e.index]
        pidx = producer_index(producer, e.view, idx, ranges)
        pvars = indexing.loop_vars("i", len(producer.buffer.sizes))
        return ir.substitute_index(producer.body, dict(zip(pvars, pidx)))

    return ir.map_expr(node.body, leaf)
