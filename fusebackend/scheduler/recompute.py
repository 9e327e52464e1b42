"""Recompute cheap pointwise chains in each reader instead of storing their results.

Every pointwise node has an *expansion*: its body with each pointwise producer's load replaced by
that producer's expansion, down to *leaves* that are not pointwise (graph inputs, extern results,
reductions) or whose own expansion is too large. A node is recomputed in its readers when

- it has two or more readers (a single reader is ordinary fusion's business), none of them an
  extern, a gather, a scatter (those need it in memory), a node after a mutating extern that
  follows it (recomputed there, it could see the mutated values) or a node that reads it at
  several positions (a window, which would compute it once per position), and the graph does
  not return it;
- its expansion holds at most ``MAX_OPS`` distinct operations and no gather;
- the leaves it reads in full (views with at least as many distinct elements as the node; a
  per-channel or per-row value is served by the cache) take no more bytes per element than the
  node itself;
- the instructions it adds are worth the bytes it saves: with ``k`` kernels reading it, its
  ops that depend on the element's own values (``instructions.varying_instructions``) are
  evaluated ``k - 1`` more times an element, and it saves the node's write and ``k`` reads of
  it, less the ``k`` reads of its leaves, ``(k + 1) s - k L`` bytes an element (``s`` the node's
  itemsize, ``L`` its leaves'); at most ``cost_model.OPS_PER_BYTE_SAVED`` instructions a byte,
  past what a small kernel's worth of bytes (``SMALL_KERNEL_BYTES``) buys (``too_costly``; the
  schedule's report lists the values it keeps stored so).

The third condition makes recomputing never cost more device memory traffic, however the readers
end up grouped into kernels: each reader in another kernel reads the leaves instead of the node,
no more bytes, and the node is never written. The fourth keeps a costly value stored where
evaluating it again would bind the readers' kernels by their instructions: ConvNeXt V2's exact
GELU, read by GRN's sum of squares and its output pass (``erf``: 39 instructions for 2 bytes
saved an element in bf16). Storing a value changes what fusion makes of its readers, so the
scheduler fuses such a graph both ways and keeps the one that moves fewer bytes, counting the
instructions as bytes (``scheduler.schedule``). ConvNeXt V2 on an H200 (bf16, b64, 2026-12-01):
inference 5.49 -> 5.01 ms of GPU time a step (its generated kernels 2556 -> 2076 us), the
training step 18.61 -> 18.13 ms (its forward stores the GELU; its backward, where storing it
made fusion store more, recomputes it; stored in both, the step took 18.73 ms);
``benchmarks/studies/costly_recompute_study.py`` times the two kernels alone.

The common cases recomputed:

- an upcast (``x.float()`` of a bf16 ``x``: 2 bytes read where 4 would be stored and read back),
  read by the mean, the variance and the normalization of a batch norm whose statistics are a
  split reduction and so a kernel apart;
- the fp32 chains of a batch-norm backward in half precision, ``(x.float() - mean)`` and the
  ReLU-masked gradient upcast, read by its statistics (split reductions) and again by its last
  pass: two fp32 tensors written and read back per layer when stored, where recomputing reads
  the two bf16 tensors they come from.

A pointwise node read through a gather (an ``IndirectLoad`` at positions read from data) is
evaluated by the gather at the positions it reads (``inlining.substitute_gathered``) whatever
its number of readers: a gather never fuses with its source, so the source would be stored in
full for the few elements read (a loss's log-softmax, [rows, vocabulary], for one value a row).

``inline_cheap(graph, within)`` substitutes each such node's expansion into its readers, then
drops the pointwise nodes that this leaves unread. The scheduler offers it only the nodes that
fusion left stored: a node fused into all its readers costs nothing to keep, and keeping it
keeps the kernel's comments naming it.
"""

from __future__ import annotations

import dataclasses

from fusebackend import ir
from fusebackend.sizevars import size_hint
from fusebackend.inlining import substitute, substitute_gathered
from fusebackend.scheduler.cost_model import OPS_PER_BYTE_SAVED, SMALL_KERNEL_BYTES, positions_read
from fusebackend.scheduler.instructions import varying_instructions

MAX_OPS = 24  # distinct ops of an expansion cheap enough to evaluate again in every reader


Inlined = tuple[ir.IRGraph, tuple[ir.Pointwise, ...], tuple[ir.Pointwise, ...], dict[str, "Costly"]]


def inline_cheap(graph: ir.IRGraph, within: set[str] | None = None,
                 kernel_of: dict[str, str] | None = None, weigh: bool = True,
                 memo: Expanded | None = None) -> Inlined:
    """The graph with cheap multi-reader pointwise chains recomputed in their readers; the nodes
    recomputed; the pointwise nodes that this leaves unread (the chains they absorbed); and the
    nodes left stored for the instructions recomputing them would add, each with why
    (``too_costly``, for the schedule's report).

    ``within``: consider only these nodes (the scheduler passes those fusion would store);
    ``kernel_of``: each node's kernel as fusion grouped them, so that the readers that would
    evaluate a node again are counted by kernel (codegen computes a value once in a kernel);
    ``weigh``: false recomputes costly values too (the scheduler compares both ways);
    ``memo``: expansions made by earlier calls on this graph's rewrites (``_expansions``).
    """
    memo = {} if memo is None else memo
    expansions = _expansions(graph, memo=memo)
    pins = _pins(graph, kernel_of)
    refused: dict[str, Costly] = {}
    candidates = _candidates(graph, expansions, pins, refused, weigh)
    gather_sources = _gather_sources(graph, expansions, pins)
    if within is not None:
        candidates = {name: node for name, node in candidates.items() if name in within}
        gather_sources = {name: node for name, node in gather_sources.items() if name in within}
        refused = {name: why for name, why in refused.items() if name in within}
        # Then the nodes cheap to compute from what stays stored: a bf16 gradient that stays in
        # memory for another reader, and its fp32 upcast, which a batch-norm backward reads in
        # two kernels, are cheap as the upcast of the stored bf16 (2 bytes an element read
        # instead of 4 written and read back), not as the sum of the three tensors it came from.
        kept = within - candidates.keys()
        more = _candidates(graph, _expansions(graph, stop=kept, memo=memo), pins, weigh=weigh)
        candidates.update((name, node) for name, node in more.items() if name in kept)
    refused = {name: why for name, why in refused.items() if name not in candidates}
    if not candidates and not gather_sources:
        return graph, (), (), refused
    nodes: list[ir.Node] = []
    done: dict[str, None] = {}  # the nodes recomputed somewhere
    for node in graph.nodes:
        if isinstance(node, (ir.Pointwise, ir.Reduction, ir.Scan)):
            used = dict.fromkeys(ld.view.buffer.name for ld in node.body_loads
                                 if isinstance(ld, ir.Load) and ld.view.buffer.name in candidates)
            body = substitute(node, candidates) if used else node.body
            if gather_sources:
                body = _into_gathers(body, gather_sources, used)
            if used:
                sources = {**gather_sources, **candidates}
                names = tuple(f"{name} ({sources[name].origin})" for name in used)
                node = dataclasses.replace(node, body=body, recomputes=node.recomputes + names)
                done.update(used)
        nodes.append(node)
    if not done:
        return graph, (), (), refused
    unread = _unread(graph, nodes) - _unread(graph, graph.nodes)  # made unread by the substitution
    recomputed = tuple(n for n in graph.nodes if n.name in done)
    absorbed = tuple(n for n in graph.nodes if n.name in unread and n.name not in done)
    kept = [n for n in nodes if n.name not in unread]
    return dataclasses.replace(graph, nodes=kept), recomputed, absorbed, refused  # type: ignore[return-value]


def _expansions(graph: ir.IRGraph, stop: set[str] = frozenset(), memo: Expanded | None = None) -> dict[str, ir.Pointwise]:
    """Each pointwise node whose expansion is small enough, with the expansion as its body;
    ``stop``: nodes that stay stored, loaded as they are (leaves) by the expansions of others;
    ``memo``: expansions made before (``_expand``)."""
    out: dict[str, ir.Pointwise] = {}
    through: dict[str, ir.Pointwise] = {}  # the expansions that others expand through
    memo = {} if memo is None else memo
    for node in graph.nodes:
        if not isinstance(node, ir.Pointwise):
            continue
        expanded, cheap = _expand(node, through, memo)
        if cheap:
            out[node.name] = expanded
            if node.name not in stop:
                through[node.name] = expanded
    return out


# node name -> its latest expansions: (the node, the expansions it was expanded through, its
# expansion, whether that has at most MAX_OPS operations), as many as the ways a round expands
# the graph (with and without its stored nodes)
Expanded = dict[str, list[tuple[ir.Pointwise, tuple[ir.Pointwise, ...], ir.Pointwise, bool]]]
MEMO_WAYS = 2


def _expand(node: ir.Pointwise, through: dict[str, ir.Pointwise], memo: Expanded) -> tuple[ir.Pointwise, bool]:
    """``node`` with the expansions in ``through`` of the buffers it loads substituted, and
    whether that is cheap (``_at_most_ops``); made once for one node and the same expansions:
    the scheduler expands the graph twice in each round of fusing and recomputing, and a round
    rewrites few nodes. Mamba's loop traced over 32 positions (3201 nodes) took 12 passes,
    about a quarter of its schedule on a 2-core CPU."""
    used = tuple(through[name] for name in dict.fromkeys(ld.view.buffer.name for ld in node.body_loads)
                 if name in through)
    kept = memo.setdefault(node.name, [])
    for was, over, expanded, cheap in kept:
        if was is node and len(over) == len(used) and all(a is b for a, b in zip(over, used)):
            return expanded, cheap
    expanded = dataclasses.replace(node, body=substitute(node, through)) if used else node
    cheap = _at_most_ops(expanded.body, MAX_OPS)
    kept[:] = [*kept[-(MEMO_WAYS - 1):], (node, used, expanded, cheap)]
    return expanded, cheap


def _at_most_ops(expr: ir.Expr, limit: int) -> bool:
    """Whether ``expr`` holds at most ``limit`` distinct operations (codegen computes equal ones
    once); stops at the first one past the limit.

    Equal operations are found by a number per distinct subtree, given children first: an op's
    number is that of (name, dtype, its arguments' numbers), so comparing two ops compares a few
    integers, where hashing the op itself would hash its whole argument tree again at every
    level (an expansion through a chain repeats its inputs' trees). A subtree met again as the
    same object keeps the number of its first visit. Leaves are numbered by their own equality,
    so two ops get one number exactly where they are equal."""
    numbers: dict[object, int] = {}
    number_of: dict[int, int] = {}  # id(subtree) -> its number
    ops: set[int] = set()
    stack: list[tuple[ir.Expr, bool]] = [(expr, False)]
    while stack:
        e, children_done = stack.pop()
        if id(e) in number_of:
            continue
        if isinstance(e, ir.Op):
            children: tuple[ir.Expr, ...] = e.args
        elif isinstance(e, ir.IndirectLoad):
            children = tuple(p for _, p in e.positions) + (() if e.valid is None else (e.valid,))
        else:
            children = ()
        if children and not children_done:
            stack.append((e, True))
            stack.extend((c, False) for c in children)
            continue
        if isinstance(e, ir.Op):
            key: object = ("op", e.name, e.dtype, tuple(number_of[id(a)] for a in e.args))
        elif isinstance(e, ir.IndirectLoad):
            key = ("gather", e.view, e.index, e.dim, number_of[id(e.position)],
                   None if e.valid is None else number_of[id(e.valid)],
                   tuple((d, number_of[id(p)]) for d, p in e.more), e.checked)
        else:
            key = e
        number = numbers.setdefault(key, len(numbers))
        number_of[id(e)] = number
        if isinstance(e, ir.Op):
            ops.add(number)
            if len(ops) > limit:
                return False
    return True


_Pins = tuple[dict[str, int], set[str], set[str], dict[str, int]]


def _pins(graph: ir.IRGraph, kernel_of: dict[str, str] | None = None) -> _Pins:
    """Readers per buffer; the buffers that must stay in memory (read by an extern or a
    scatter, or read after a mutation that follows them); those read through a gather; and the
    kernels that read each buffer (``kernel_of``: each node's group; a node in none counts as a
    kernel of its own)."""
    kernel_of = kernel_of or {}
    readers: dict[str, int] = {}
    kernels: dict[str, set[str]] = {}
    pinned: set[str] = set()  # read by an extern or a scatter: must be in memory
    gathered: set[str] = set()  # read through a gather (recomputed there only by substitute_gathered)
    computed: set[str] = set()  # pointwise nodes so far
    before_mutation: set[str] = set()  # those computed before the latest mutating extern
    size_of = {n.buffer.name: size_hint(n.buffer.numel) for n in graph.nodes if isinstance(n, ir.Pointwise)}
    for node in graph.nodes:
        for view in node.reads():
            readers[view.buffer.name] = readers.get(view.buffer.name, 0) + 1
            kernels.setdefault(view.buffer.name, set()).add(kernel_of.get(node.name, node.name))
            if view.buffer.name in before_mutation:
                pinned.add(view.buffer.name)  # recomputed after the mutation, it could differ
        if isinstance(node, ir.Pointwise):
            computed.add(node.name)
        if isinstance(node, ir.Extern):
            pinned |= {v.buffer.name for v in node.reads()}
            if node.mutates:
                before_mutation = set(computed)
        else:
            gathered |= {ld.view.buffer.name for ld in ir.node_loads(node) if isinstance(ld, ir.IndirectLoad)}
            # read at several positions by one node (a window): recomputed there, it would be
            # computed once per position (cost_model.window_recompute); not where the positions
            # together are no more evaluations than its elements (a reduction over few
            # positions unrolled, reading each element once: ``lowering.unrolled``)
            evaluations = size_hint(node.buffer.numel)
            pinned |= {name for name, count in positions_read(node).items()
                       if count > 1 and count * evaluations > size_of.get(name, 0)}
        if isinstance(node, ir.Scatter):
            # its target is the memory it writes into; and its expressions take no substitution
            pinned |= {v.buffer.name for v in node.reads()}
    return readers, pinned, gathered, {name: len(group) for name, group in kernels.items()}


def _candidates(graph: ir.IRGraph, expansions: dict[str, ir.Pointwise], pins: _Pins,
                refused: dict[str, Costly] | None = None, weigh: bool = True) -> dict[str, ir.Pointwise]:
    """The nodes recomputed in their readers; ``refused`` collects those that would be but for
    the instructions (``too_costly``, over the kernels that read them; not weighed where
    ``weigh`` is false)."""
    readers, pinned, gathered, kernels = pins
    returned = graph.results()
    out = {}
    for name, node in expansions.items():
        if name in returned | pinned | gathered or readers.get(name, 0) < 2 or not _cheap(node):
            continue
        costly = too_costly(node, kernels[name]) if weigh else None
        if costly is None:
            out[name] = node
        elif refused is not None:
            refused[name] = dataclasses.replace(costly, why=f"{node.origin}: {costly.why}")
    return out


def _gather_sources(graph: ir.IRGraph, expansions: dict[str, ir.Pointwise], pins: _Pins) -> dict[str, ir.Pointwise]:
    """The pointwise nodes read through gathers whose expansions the gathers may evaluate at
    the positions they read (``inlining.substitute_gathered``) instead of reading them from
    memory: any number of readers (a gather never fuses with its source, so the source is
    stored whatever its readers), not returned, and not pinned for another reason."""
    _, pinned, gathered, _ = pins
    returned = graph.results()
    return {name: node for name, node in expansions.items()
            if name in gathered and name not in returned | pinned}


def _into_gathers(expr: ir.Expr, sources: dict[str, ir.Pointwise], used: dict[str, None]) -> ir.Expr:
    """``expr`` with each gather of a ``sources`` buffer replaced by the source's expansion at
    the gathered positions, where that can be done; ``used`` collects the sources substituted."""

    def leaf(e: ir.Expr) -> ir.Expr | None:
        if not isinstance(e, ir.IndirectLoad) or e.view.buffer.name not in sources:
            return None
        body = substitute_gathered(e, sources[e.view.buffer.name])
        if body is None:
            return None
        used[e.view.buffer.name] = None
        return body

    return ir.map_expr(expr, leaf)


def _cheap(expanded: ir.Pointwise) -> bool:
    loads = ir.loads(expanded.body)
    if any(isinstance(ld, ir.IndirectLoad) for ld in loads):
        return False
    return _leaf_bytes(expanded) <= expanded.buffer.dtype.itemsize


def _leaf_bytes(expanded: ir.Pointwise) -> int:
    """Bytes an element of the node its expansion reads from memory; a broadcast view (fewer
    distinct elements) is served by the cache."""
    numel = size_hint(expanded.buffer.numel)
    views = {ld.view for ld in ir.loads(expanded.body) if isinstance(ld, ir.Load)}
    return sum(view.dtype.itemsize for view in views if view.distinct_elements() >= numel)


@dataclasses.dataclass(frozen=True)
class Costly:
    """A value kept stored for the instructions recomputing it would add: how many (at the
    sizes compiled), and why, as the schedule's report says it."""

    instructions: int
    why: str


def too_costly(expanded: ir.Pointwise, readers: int) -> Costly | None:
    """Why evaluating the expansion in each of the ``readers`` kernels that read it costs more
    instructions than the bytes recomputing it saves (module docstring); None where it does
    not."""
    numel = size_hint(expanded.buffer.numel)

    def leaf(e: ir.Expr) -> bool:
        return isinstance(e, ir.Load) and e.view.distinct_elements() >= numel

    each = varying_instructions(expanded.body, leaf)
    saved = (readers + 1) * expanded.buffer.dtype.itemsize - readers * _leaf_bytes(expanded)
    extra = (readers - 1) * each * numel
    if extra <= OPS_PER_BYTE_SAVED * (saved * numel + SMALL_KERNEL_BYTES):
        return None
    return Costly(extra, f"recomputed, {each} instructions an element in {readers - 1} more kernel(s) to save "
                         f"{saved} B an element: {(readers - 1) * each / saved:.0f} a byte (most {OPS_PER_BYTE_SAVED})")


def _unread(graph: ir.IRGraph, nodes: list[ir.Node]) -> set[str]:
    """The pointwise nodes of ``nodes`` whose results nothing needs, directly or through others."""
    needed = graph.results()
    unread = set()
    for node in reversed(nodes):
        if isinstance(node, ir.Pointwise) and node.name not in needed:
            unread.add(node.name)
            continue
        needed |= {v.buffer.name for v in node.reads()}
    return unread
