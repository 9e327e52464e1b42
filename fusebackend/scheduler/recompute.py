"""Recompute cheap pointwise nodes in each reader instead of storing them.

A pointwise node that reads only memory-resident buffers (graph inputs, extern results) and reads
no more bytes per element than it writes (an upcast of a bf16 tensor to fp32, ``x * 2``) is
never worth storing: when its readers land in different kernels, each reading the node's inputs
again moves fewer bytes than one kernel writing the node and the others reading it back. A
batch norm in training mode is the common case: the fp32 copy of its input is read by the mean,
the variance and the normalization, which are separate kernels when the statistics reduction is
split.

``inline_cheap(graph)`` substitutes such a node's body into every reader and drops the node. It
leaves alone a node that the graph returns, that an extern or a gather reads, or that has a
single reader (ordinary fusion handles that one).
"""

from __future__ import annotations

import dataclasses

import sympy

from fusebackend import indexing, ir
from fusebackend.scheduler.space import producer_index

MAX_OPS = 4  # ops in a body cheap enough to evaluate again in every reader


def inline_cheap(graph: ir.IRGraph) -> tuple[ir.IRGraph, tuple[ir.Pointwise, ...]]:
    """The graph with cheap multi-reader pointwise nodes recomputed in their readers, and those nodes."""
    candidates = _candidates(graph)
    if not candidates:
        return graph, ()
    nodes: list[ir.Node] = []
    inlined: dict[str, ir.Pointwise] = {}
    for node in graph.nodes:
        if isinstance(node, (ir.Pointwise, ir.Reduction)) and any(
            ld.view.buffer.name in inlined for ld in ir.loads(node.body)
        ):
            node = dataclasses.replace(node, body=_substitute(node, inlined))
        if node.name in candidates:
            assert isinstance(node, ir.Pointwise)
            inlined[node.name] = node
            continue
        nodes.append(node)
    return dataclasses.replace(graph, nodes=nodes), tuple(inlined.values())


def _candidates(graph: ir.IRGraph) -> set[str]:
    memory = {b.name for b in graph.input_buffers()}
    for node in graph.nodes:
        if isinstance(node, ir.Extern):
            memory |= {b.name for b in ir.written_buffers(node)}
    returned = {o.buffer.name for o in graph.outputs if isinstance(o, ir.View)}
    readers: dict[str, int] = {}
    pinned: set[str] = set()  # read by an extern or through a gather: must be in memory
    for node in graph.nodes:
        for view in node.reads():
            readers[view.buffer.name] = readers.get(view.buffer.name, 0) + 1
        if isinstance(node, ir.Extern):
            pinned |= {v.buffer.name for v in node.reads()}
        else:
            pinned |= {ld.view.buffer.name for ld in ir.loads(node.body) if isinstance(ld, ir.IndirectLoad)}
    out = set()
    for node in graph.nodes:
        if (
            isinstance(node, ir.Pointwise)
            and node.name not in returned | pinned
            and readers.get(node.name, 0) >= 2
            and _cheap(node, memory)
        ):
            out.add(node.name)
    return out


def _cheap(node: ir.Pointwise, memory: set[str]) -> bool:
    ops = [e for e in ir.walk(node.body) if isinstance(e, ir.Op)]
    loads = ir.loads(node.body)
    if len(ops) > MAX_OPS or any(isinstance(ld, ir.IndirectLoad) for ld in loads):
        return False
    if any(ld.view.buffer.name not in memory for ld in loads):
        return False
    # bytes read per element written; a broadcast view (fewer distinct elements) is served by cache
    per_element = sum(
        ld.view.dtype.itemsize for ld in {ld.view: ld for ld in loads}.values()
        if ld.view.distinct_elements() >= node.buffer.numel
    )
    return per_element <= node.buffer.dtype.itemsize


def _substitute(node: ir.Pointwise | ir.Reduction, inlined: dict[str, ir.Pointwise]) -> ir.Expr:
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
