"""Which ``aten.copy_`` into graph inputs may be written in place by the kernels computing them.

AOTAutograd leaves input mutations (batch norm's running statistics, ``x.add_(y)``, an
optimizer's parameters and states) at the end of the graph as ``copy_(input, value)``. Lowering
makes ``value`` a pointwise node with the input's layout; the wrapper can then pass the input's
memory as that node's output, so no copy runs. The copies are taken together: an optimizer step
computes a parameter's new value from the new moments, whose copies write the moments' inputs, so
one copy's value reads what another copy overwrites. A set of copies is written in place when,
with ``T`` the inputs they write:

- every node that reads an input of ``T``, directly or through other nodes, is pointwise, is not
  a result of the graph, and flows only into copies of the set;
- each copy's value at each element, with those nodes inlined, reads each input of ``T`` of its
  own shape at that same element alone (no gather); an input of another shape (an optimizer's
  0-dim step count, read by every element of the parameter's update) it may read anywhere.

Then the lane that stores an element reads the old values of that element only, so kernels that
compute the copies read every input of ``T`` before storing into it, provided the schedule runs
no kernel that reads an input of ``T`` after the kernel that writes it, and no kernel writes one
that its other lanes read. The scheduler orders every reader of an input before its writer
(``scheduler.groups``), and the schedule is checked (``order_hazards``); where it fails the graph
is lowered again with those inputs copied by ATen. A copy that fails the conditions is refused with its reason and the conditions
are taken again without it: refused copies are made by ATen after everything else, as for any
mutation, and the schedule says why.

A copy whose value is a scatter into a copy of the same input (a static key-value cache's
``index_copy_``) is taken first, by ``scatters_into_inputs``: the scatter writes the input's
memory itself, and neither copy runs.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Collection, Iterable, Sequence

import sympy

from fusebackend import indexing, ir
from fusebackend.inlining import substitute


def in_place_reason(graph: ir.IRGraph, copy: ir.Pointwise, target: ir.Buffer) -> str | None:
    """Why ``copy`` alone cannot write its value into input ``target`` in place; None when it can."""
    return in_place_copies(graph, [(copy, target)])[1].get(copy.buffer.name)


def in_place_copies(graph: ir.IRGraph, copies: Sequence[tuple[ir.Pointwise, ir.Buffer]],
                    copied: Collection[str] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """The copies of ``copies`` (node, input) written in place, as {copy buffer: input}, and
    the others, as {copy buffer: why not}. ``copied``: inputs to copy by ATen in any case (a
    schedule that read them after writing them, ``order_hazards``)."""
    refused: dict[str, str] = {}
    writes = collections.Counter(target.name for _, target in copies)
    taken: dict[str, tuple[ir.Pointwise, ir.Buffer]] = {}
    for copy, target in copies:
        if writes[target.name] > 1:
            refused[copy.buffer.name] = "the input is written twice"
        elif target.name in copied:
            refused[copy.buffer.name] = "the schedule read the input after the kernel writing it"
        else:
            taken[copy.buffer.name] = (copy, target)
    while taken:
        blamed = _blame(graph, taken, {c.buffer.name for c, _ in copies} - taken.keys())
        if not blamed:
            break
        for name, (_, target) in list(taken.items()):
            if target.name in blamed:
                refused[name] = blamed[target.name]
                del taken[name]
    return {name: target.name for name, (_, target) in taken.items()}, refused


def _blame(graph: ir.IRGraph, taken: dict[str, tuple[ir.Pointwise, ir.Buffer]],
           by_aten: set[str]) -> dict[str, str]:
    """{input: why} for the inputs of ``taken`` whose copies break the conditions (module
    docstring); ``by_aten``: copies into inputs that ATen makes at the end (they read their
    value after every kernel)."""
    targets = {target.name: target for _, target in taken.values()}
    returned = {o.buffer.name for o in graph.outputs if isinstance(o, ir.View)}
    blamed: dict[str, str] = {}

    def blame(inputs: Iterable[str], why: str) -> None:
        for name in inputs:
            blamed.setdefault(name, why)

    for name in targets.keys() & returned:
        blame([name], "the graph returns it")
    sources: dict[str, frozenset[str]] = {}  # node -> the inputs of ``targets`` its value depends on
    readers: dict[str, int] = {}
    tainted: dict[str, ir.Node] = {}
    for node in graph.nodes:
        names = {v.buffer.name for v in node.reads()}
        for name in names:
            readers[name] = readers.get(name, 0) + 1
        found = frozenset(names & targets.keys()).union(*(sources[n] for n in names if n in sources))
        if found:
            sources[node.name], tainted[node.name] = found, node
    for name, (_, target) in taken.items():
        if readers.get(name) or name in returned:
            blame([target.name], "something reads the copy")
    for name, node in tainted.items():
        if name in taken:
            continue
        if not isinstance(node, ir.Pointwise):
            blame(sources[name], f"{name} reads the input and is not pointwise")
        elif name in by_aten:
            blame(sources[name], f"{name} reads the input and is copied into another input by ATen")
        elif name in returned or not readers.get(name):
            blame(sources[name], f"{name} reads the input and is a result of its own")
    if blamed:
        return blamed
    expanded: dict[str, ir.Pointwise] = {}  # tainted nodes with the tainted nodes they read inlined
    for name, node in tainted.items():
        if name not in taken:
            assert isinstance(node, ir.Pointwise)
            expanded[name] = dataclasses.replace(node, body=substitute(node, expanded))
    for name, (copy, copy_target) in taken.items():
        for load in ir.loads(substitute(copy, expanded)):
            read_name = load.view.buffer.name
            if read_name in sources:  # every plain load of a tainted node is inlined
                blame(sources[read_name], f"{read_name} is read from memory")
                continue
            if read_name not in targets:
                continue
            target = targets[read_name]
            if isinstance(load, ir.IndirectLoad):
                blame([read_name], f"a gather reads {read_name}")
            elif target.sizes != copy.buffer.sizes:
                # another copy's input read by every element (an optimizer's 0-dim step count):
                # the scheduler writes it after its readers (``Groups``), and ``order_hazards``
                # refuses a kernel that would both read it at other lanes and write it
                if read_name == copy_target.name:
                    blame([read_name], f"{name}, of another shape, reads it")
            elif not _at_own_element(load, copy.buffer.sizes, target.strides):
                blame([read_name], "its value reads the input at another element")
    return blamed


def _identity_load(node: ir.Node, source: ir.Buffer) -> bool:
    """Whether pointwise ``node`` is ``source`` itself: a plain load of its whole at the node's
    own element, in the same layout and dtype."""
    if not isinstance(node, ir.Pointwise) or not isinstance(node.body, ir.Load):
        return False
    view, buf = node.body.view, node.buffer
    if view.buffer.name != source.name or (buf.dtype, buf.sizes, buf.strides) != (source.dtype, source.sizes, source.strides):
        return False
    return _at_own_element(node.body, buf.sizes, buf.strides)


def _at_own_element(load: ir.Load, sizes: Sequence[Any], strides: Sequence[Any]) -> bool:
    """Whether ``load``, in a node of ``sizes`` over loop variables ``i0, i1, ...``, reads the
    element that a buffer of ``strides`` holds at the node's own element (a dim of one element
    may be read at 0)."""
    ivars = indexing.loop_vars("i", len(sizes))
    ranges = dict(zip(ivars, (max(n, 1) for n in sizes)))
    unit = {v: 0 for v, n in zip(ivars, sizes) if n == 1}
    read = indexing.ravel(list(load.index), load.view.strides, load.view.offset)
    written = indexing.ravel(list(ivars), strides, 0)
    return sympy.expand(indexing.simplify(read - written, ranges).xreplace(unit)) == 0


def scatters_into_inputs(graph: ir.IRGraph, copies: Sequence[tuple[ir.Pointwise, ir.Buffer]],
                         copied: Collection[str] = ()) -> dict[str, str]:
    """Scatters into a copy of an input whose result is copied back into that input (a static
    key-value cache's ``index_copy_``, ``x[i] = v`` on an input), rewritten to scatter into the
    input's memory: the copy before the scatter and the ``copy_`` after it leave the graph, and
    ``graph.mutations`` records the scatter's buffer as written into the input. Returns {copy
    buffer: scatter buffer} for the copies it removed.

    Without it every step copies the whole input twice to change a few elements of it: a decode
    step over a static cache of ``L`` positions moves ``O(L)`` bytes per layer where it needs
    one position's. Taken where, with ``T`` the input:

    - the ``copy_``'s value is the scatter's result, read whole at each element;
    - the scatter's target is a plain copy of ``T`` in ``T``'s layout;
    - ``T`` is written by that one copy, is not returned, is not in ``copied``, and nothing reads
      the ``copy_``'s buffer;
    - no node that reads ``T`` depends on the copy of ``T`` (the scheduler runs every reader of
      the old ``T`` before the scatter, ``scheduler.groups``), and the scatter's values and
      positions are not computed from ``T`` (its kernel would read what its other lanes write).
    """
    producers = graph.producers()
    returned = {o.buffer.name for o in graph.outputs if isinstance(o, ir.View)}
    readers: dict[str, list[ir.Node]] = collections.defaultdict(list)
    for node in graph.nodes:
        for name in {v.buffer.name for v in node.reads()}:
            readers[name].append(node)
    writes = collections.Counter(target.name for _, target in copies)
    done: dict[str, str] = {}
    for copy, target in copies:
        if writes[target.name] > 1 or target.name in copied or target.name in returned:
            continue
        if readers.get(copy.buffer.name) or copy.buffer.name in returned:
            continue
        body = copy.body
        scatter = producers.get(body.view.buffer.name) if isinstance(body, ir.Load) else None
        if not isinstance(scatter, ir.Scatter) or not _identity_load(copy, scatter.buffer):
            continue
        first = producers.get(scatter.target.name)
        if not _identity_load(first, target):
            continue
        after = _descendants(first, readers)
        if any(r.name in after for r in readers[target.name] if r is not first):
            continue  # a reader of the old value needs the new one too
        if target.name in _ancestor_reads(scatter, producers, stop=first.name):
            continue
        at = {n.name: k for k, n in enumerate(graph.nodes)}
        graph.nodes[at[scatter.name]] = dataclasses.replace(scatter, target=target)
        for gone in sorted((at[first.name], at[copy.name]), reverse=True):
            del graph.nodes[gone]
        graph.mutations[scatter.buffer.name] = target.name
        done[copy.buffer.name] = scatter.buffer.name
        producers = graph.producers()
    return done


def _descendants(node: ir.Node, readers: dict[str, list[ir.Node]]) -> set[str]:
    """Names of the nodes that read what ``node`` writes, directly or through others."""
    seen: set[str] = set()
    stack = [node]
    while stack:
        for buf in ir.written_buffers(stack.pop()):
            for r in readers.get(buf.name, ()):
                if r.name not in seen:
                    seen.add(r.name)
                    stack.append(r)
    return seen


def _ancestor_reads(node: ir.Node, producers: dict[str, ir.Node], stop: str) -> set[str]:
    """Buffers ``node``'s value is computed from, through every node but ``stop``."""
    reads: set[str] = set()
    stack, seen = [node], {node.name}
    while stack:
        for view in stack.pop().reads():
            name = view.buffer.name
            producer = producers.get(name)
            if producer is not None and producer.name == stop:
                continue
            reads.add(name)
            if producer is not None and producer.name not in seen:
                seen.add(producer.name)
                stack.append(producer)
    return reads


def order_hazards(steps: Sequence[Any], graph: ir.IRGraph) -> set[str]:
    """The inputs written in place (``graph.mutations``) that the schedule may read after writing
    them: a step of ``steps`` (its kernels and extern calls, in order) that reads one after the
    step that writes it, or, inside the kernel that writes it, a value that flows into the copy
    into another input reading it, where that kernel is a reduction or scan (whose stores are not
    all at the end) or the other input has another shape (its lanes are not the writer's)."""
    mutations = graph.mutations
    writer: dict[str, int] = {}
    for k, step in enumerate(steps):
        for node in _nodes(step):
            for buf in ir.written_buffers(node):
                if buf.name in mutations:
                    writer[mutations[buf.name]] = k
    hazards: set[str] = set()
    flows: dict[str, set[str]] | None = None
    sizes = {b.name: b.sizes for b in graph.inputs if isinstance(b, ir.Buffer)}
    for k, step in enumerate(steps):
        for node in _nodes(step):
            hazards |= {v.buffer.name for v in node.reads() if writer.get(v.buffer.name, k) < k}
        written = {t for t, w in writer.items() if w == k}
        if not written or not hasattr(step, "space"):
            continue  # an extern call
        # a pointwise kernel loads every element before it stores, each lane its own elements:
        # a value read for a copy of another shape is read by other lanes than the one writing
        anchored = getattr(step.space, "anchor", None) is not None
        if flows is None:
            flows = _copies_fed(graph)
        for node in _nodes(step):
            for target in {v.buffer.name for v in node.reads()} & written:
                into = flows.get(node.name, set()) | ({mutations[node.name]} if node.name in mutations else set())
                if any(anchored or sizes.get(other) != sizes.get(target) for other in into - {target}):
                    hazards.add(target)
    return hazards


def _copies_fed(graph: ir.IRGraph) -> dict[str, set[str]]:
    """For each node, the inputs written in place by copies its value flows into."""
    readers: dict[str, list[str]] = collections.defaultdict(list)
    for node in graph.nodes:
        for v in node.reads():
            readers[v.buffer.name].append(node.name)
    flows: dict[str, set[str]] = {}
    for node in reversed(graph.nodes):
        into: set[str] = set()
        for buf in ir.written_buffers(node):
            for reader in readers.get(buf.name, ()):
                into |= flows.get(reader, set())
                if reader in graph.mutations:
                    into.add(graph.mutations[reader])
        flows[node.name] = into
    return flows


def _nodes(step: Any) -> tuple[ir.Node, ...]:
    return step.nodes if hasattr(step, "nodes") else (step.node,)
