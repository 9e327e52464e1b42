"""Reductions over a few positions, made pointwise nodes that load each position and combine
them in order (``unroll_short_reductions``).

A reduction's kernel takes blocks of rows by positions; over rows of 2 to 8 positions its blocks
are narrow, and where its rows are a channels-last tensor's channel runs they are as wide as one
pixel's channels (``codegen.reduction._column_run``). The split attention of ResNeSt sums a conv's
output over its 2 radix splits, twice a block: as reductions those sums ran at 12% of their floor
on ResNeSt-50d (b64, bf16, H100, 2026-12-07; the step 0.77x Inductor's). Unrolled, a sum is a
pointwise node of two loads, fused as any pointwise node, in a pointwise kernel's blocks.

A reduction stays one where a reader takes its result broadcast over the positions it reduced
(a batch norm's statistics over a few pixels, read back by each of them): a pointwise result
read so is evaluated again in each lane that reads it (``cost_model.window_recompute``), where
a reduction's kernel computes each row once and hands it to its epilogue. Nor where it reads a
pointwise value the graph returns, which is stored whatever fuses: a reduction's kernel sums it
beside that store (attention's three gradients stacked and returned, and their sum over the
rows), where a pointwise one would read it back. So the pass runs on the whole graph, where the
readers and the outputs are known. Not argmax or argmin (they give a position), a
Welford ``m2`` (a triple, not a value), a whole tensor's (one output: a pointwise kernel of one
program), nor a split's chunks that overrun the rows (``source_valid``). At most
``config.unrolled_reduction`` positions (``FUSE_UNROLLED_REDUCTION``, 8).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import sympy

from fusebackend import config, indexing, ir
from fusebackend.sizevars import size_hint, symbolic

_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum", "any": "logical_or"}


def unroll_short_reductions(graph: ir.IRGraph) -> ir.IRGraph:
    """``graph`` with each short reduction that no reader takes broadcast, and that reads no
    pointwise value the graph returns, made pointwise."""
    broadcast = _read_broadcast(graph)
    returned = {v.buffer.name for v in graph.outputs if isinstance(v, ir.View)}
    pointwise = {n.name for n in graph.nodes if isinstance(n, ir.Pointwise)}
    nodes: list[ir.Node] = []
    for node in graph.nodes:
        if (isinstance(node, ir.Reduction) and _short(node) and node.name not in broadcast
                and not any(v.buffer.name in returned & pointwise for v in node.reads())):
            body = ir.cast(unrolled(node.body, node.reduction_ranges, node.reduction_type), node.buffer.dtype)
            node = ir.Pointwise(node.buffer, body, node.origin, node.recomputes)
        nodes.append(node)
    return dataclasses.replace(graph, nodes=nodes)


def unrolled(value: ir.Expr, rranges: Sequence[int], reduction_type: str) -> ir.Expr:
    """``value`` (over the output's ``i`` and the row's ``r`` variables, in the accumulator's
    dtype) combined over every position of the row, first to last."""
    rvars = indexing.loop_vars("r", len(rranges))
    out: ir.Expr | None = None
    for position in itertools.product(*(range(n) for n in rranges)):
        v = ir.substitute_index(value, dict(zip(rvars, map(sympy.Integer, position))))
        out = v if out is None else ir.op(_COMBINE[reduction_type], out, v)
    assert out is not None
    return out


def _short(node: ir.Reduction) -> bool:
    return (node.reduction_type in _COMBINE and node.source_valid is None
            and not symbolic(node.reduction_ranges) and 1 < node.reduction_numel <= config.unrolled_reduction
            and size_hint(node.buffer.numel) > 1)


def _read_broadcast(graph: ir.IRGraph) -> set[str]:
    """The buffers some node reads at more (row, position) evaluations than they have elements,
    directly or through pointwise nodes read so (a variance's sum, divided by the count, then
    read by every pixel it was reduced over)."""
    out: set[str] = set()
    for node in reversed(graph.nodes):  # each node's readers before it
        if not isinstance(node, (ir.Pointwise, ir.Reduction)):
            continue  # an extern reads memory; a scan or a scatter reads each element once
        evaluations = size_hint(node.buffer.numel * (node.reduction_numel if isinstance(node, ir.Reduction) else 1))
        passed_on = isinstance(node, ir.Pointwise) and node.name in out
        out |= {v.buffer.name for v in node.reads() if passed_on or evaluations > size_hint(v.buffer.numel)}
    return out
