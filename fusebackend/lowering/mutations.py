"""When an ``aten.copy_`` into a graph input may be written in place by the kernel computing it.

AOTAutograd leaves input mutations (batch norm's running statistics, ``x.add_(y)``) at the end of
the graph as ``copy_(input, value)``. Lowering makes ``value`` a pointwise node with the input's
layout; the wrapper can then pass the input's memory as that node's output, so no copy runs.
That is safe when nothing but the node needs the input's old contents once the node has run:

- every node that reads the input, directly or through other nodes, is pointwise, is not a
  result of the graph, and flows only into the copy;
- the copy's value at each element, with those nodes inlined, reads the input at that element
  alone (no gather of it either).

Then each lane of the kernel that stores the copy reads its element before it writes it, and no
other lane, program or later kernel reads it. Otherwise the graph copies with ATen after
everything else, as for any mutation.
"""

from __future__ import annotations

import dataclasses

import sympy

from fusebackend import indexing, ir
from fusebackend.inlining import substitute


def in_place_reason(graph: ir.IRGraph, copy: ir.Pointwise, target: ir.Buffer) -> str | None:
    """Why ``copy`` cannot write its value into input ``target`` in place; None when it can."""
    returned = {o.buffer.name for o in graph.outputs if isinstance(o, ir.View)}
    if target.name in returned or copy.buffer.name in returned:
        return "the graph returns it"
    tainted: dict[str, ir.Node] = {}  # nodes whose values depend on the input's contents
    readers: dict[str, int] = {}
    for node in graph.nodes:
        names = {v.buffer.name for v in node.reads()}
        for name in names:
            readers[name] = readers.get(name, 0) + 1
        if target.name in names or names & tainted.keys():
            tainted[node.name] = node
    if readers.get(copy.buffer.name):
        return "something reads the copy"
    expanded: dict[str, ir.Pointwise] = {}  # tainted nodes with the tainted nodes they read inlined
    for node in tainted.values():
        if node is copy:
            continue
        if not isinstance(node, ir.Pointwise):
            return f"{node.name} reads the input and is not pointwise"
        if node.name in returned or not readers.get(node.name):
            return f"{node.name} reads the input and is a result of its own"
        expanded[node.name] = dataclasses.replace(node, body=substitute(node, expanded))
    value = substitute(copy, expanded)
    ivars = indexing.loop_vars("i", len(copy.buffer.sizes))
    ranges = dict(zip(ivars, (max(n, 1) for n in copy.buffer.sizes)))
    unit = {v: 0 for v, n in zip(ivars, copy.buffer.sizes) if n == 1}
    written = indexing.ravel(list(ivars), target.strides, 0)
    for load in ir.loads(value):
        if load.view.buffer.name not in tainted.keys() | {target.name}:
            continue
        if isinstance(load, ir.IndirectLoad):
            return f"a gather reads {load.view.buffer.name}"
        if load.view.buffer.name != target.name:  # every plain load of a tainted node is inlined
            return f"{load.view.buffer.name} is read from memory"
        read = indexing.ravel(list(load.index), load.view.strides, load.view.offset)
        if sympy.expand(indexing.simplify(read - written, ranges).xreplace(unit)) != 0:
            return "its value reads the input at another element"
    return None
