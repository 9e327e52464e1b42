"""Scheduler: IRGraph -> Schedule, an ordered list of kernel plans and extern calls.

``schedule(graph)`` fuses nodes (``fusion.py``) by the bytes each fusion saves
(``cost_model.py``), recomputes in their readers the cheap pointwise results fusion would store
(``recompute.py``; where a value is kept stored for the instructions recomputing it would add,
both ways are fused and the one that moves fewer bytes, instructions counted as bytes, taken)
and fuses again, and orders the groups (``ordering.py``: the graph's order,
unless another lowers the peak of memory). Each ``KernelPlan`` names its nodes, the buffers it
must store (read outside the group or returned by the graph), its byte accounting and the
Dynamo graph's nodes it computes (``provenance.py``); the ``Schedule`` keeps every fusion taken
and every one refused, with its reason.
"""

from __future__ import annotations

import dataclasses

from fusebackend import ir
from fusebackend.config import config
from fusebackend.provenance import kernel_sources
from fusebackend.scheduler.cost_model import OPS_PER_BYTE_SAVED, TrafficModel, graph_floor
from fusebackend.scheduler.fusion import Decision, Refusal, fuse
from fusebackend.scheduler.groups import Groups
from fusebackend.scheduler.ordering import memory_order
from fusebackend.scheduler.recompute import Costly, Expanded, inline_cheap
from fusebackend.scheduler.space import KernelSpace, plan_space


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    nodes: tuple[ir.Node, ...]
    stored: tuple[ir.Buffer, ...]
    bytes_read: int
    bytes_written: int
    space: KernelSpace
    # the Dynamo graph's nodes it computes, and how many of its nodes come from none (backward
    # nodes): ``provenance.kernel_sources``
    sources: tuple[str, ...] = ()
    unsourced: int = 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)


@dataclasses.dataclass(frozen=True)
class ExternCall:
    node: ir.Extern
    bytes_read: int
    bytes_written: int


Step = KernelPlan | ExternCall


@dataclasses.dataclass(frozen=True)
class Schedule:
    graph: ir.IRGraph
    steps: tuple[Step, ...]
    decisions: tuple[Decision, ...]
    refusals: tuple[Refusal, ...]
    floor_bytes: int
    recomputed: tuple[ir.Pointwise, ...] = ()
    absorbed: tuple[ir.Pointwise, ...] = ()  # computed only inside recomputed chains now
    costly: tuple[tuple[str, str], ...] = ()  # stored, not recomputed for the instructions: (name, why)
    compared: str = ""  # the bytes of both ways, where costly values were weighed (``schedule``)

    @property
    def kernels(self) -> list[KernelPlan]:
        return [s for s in self.steps if isinstance(s, KernelPlan)]

    @property
    def kernel_bytes(self) -> int:
        return sum(k.bytes_read + k.bytes_written for k in self.kernels)

    @property
    def extern_bytes(self) -> int:
        return sum(s.bytes_read + s.bytes_written for s in self.steps if isinstance(s, ExternCall))

    @property
    def total_bytes(self) -> int:
        """Bytes every kernel and extern call of the graph moves, by the cost model."""
        return self.kernel_bytes + self.extern_bytes

    def report(self) -> str:
        lines = [f"schedule of {self.graph.name}: {len(self.kernels)} kernels, "
                 f"{sum(isinstance(s, ExternCall) for s in self.steps)} extern calls"]
        k = 0
        for step in self.steps:
            if isinstance(step, KernelPlan):
                lines.append(
                    f"  kernel {k}: {', '.join(step.names)}"
                    f"  | read {format_bytes(step.bytes_read)}, write {format_bytes(step.bytes_written)}"
                    f"  | stores {', '.join(_stored_name(b, self.graph) for b in step.stored) or 'nothing'}"
                )
                if step.sources or step.unsourced:
                    named = list(step.sources) + ([f"{step.unsourced} nodes without one"] if step.unsourced else [])
                    lines.append(f"    source nodes: {', '.join(named)}")
                k += 1
            else:
                # a mutation says why it is an ATen call (a copy into an input not written in place)
                what = step.node.origin if step.node.mutates and step.node.origin else step.node.op
                lines.append(
                    f"  extern {step.node.name}: {what}"
                    f"  | read {format_bytes(step.bytes_read)}, write {format_bytes(step.bytes_written)}"
                )
                if step.node.name in self.graph.sources:
                    lines.append(f"    source nodes: {self.graph.sources[step.node.name]}")
        ratio = f" ({self.total_bytes / self.floor_bytes:.2f}x)" if self.floor_bytes else ""
        lines.append(
            f"  graph moves {format_bytes(self.total_bytes)} (kernels {format_bytes(self.kernel_bytes)}, externs "
            f"{format_bytes(self.extern_bytes)}) against a floor of {format_bytes(self.floor_bytes)}{ratio}: "
            f"the floor reads each graph input once and writes each output once"
            + (" (and each input written in place)" if self.graph.mutations else "")
        )
        if self.recomputed:
            lines.append("  recomputed in each reader instead of stored (its inputs cost no more bytes than "
                         "a write and reads back):")
            lines.extend(f"    {n.name}: {n.origin}" for n in self.recomputed)
        if self.absorbed:
            lines.append("  computed only inside those: " + ", ".join(n.name for n in self.absorbed))
        if self.costly:
            lines.append("  stored, not recomputed in each reader (the instructions it would add):")
            lines.extend(f"    {name}: {why}" for name, why in self.costly)
        if self.compared:
            lines.append(f"  costly values {'kept stored' if self.costly else 'recomputed'}: {self.compared}")
        if self.decisions:
            lines.append("  fusions taken:")
            lines.extend(f"    {d}" for d in self.decisions)
        if self.refusals:
            lines.append("  fusions refused:")
            lines.extend(f"    {r}" for r in self.refusals)
        return "\n".join(lines)


def _stored_name(buf: ir.Buffer, graph: ir.IRGraph) -> str:
    into = graph.mutations.get(buf.name)
    return buf.name if into is None else f"{buf.name} (into input {into})"


def format_bytes(n: int) -> str:
    """Bytes in the unit a report reads best: 1.50 MiB, 512 B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


@dataclasses.dataclass
class _Fused:
    """Fusion and recomputing run to their end: the graph rewritten, its groups and what was
    decided on the way."""

    graph: ir.IRGraph
    model: TrafficModel
    groups: Groups
    decisions: list[Decision]
    refusals: list[Refusal]
    recomputed: tuple[ir.Pointwise, ...] = ()
    absorbed: tuple[ir.Pointwise, ...] = ()
    costly: dict[str, Costly] = dataclasses.field(default_factory=dict)

    def kernel_bytes(self) -> int:
        """Bytes the kernels move, by the cost model (extern calls left out)."""
        total = 0
        for g in self.groups.topological():
            members = self.groups.members[g]
            if not (len(members) == 1 and isinstance(self.groups.nodes[members[0]], ir.Extern)):
                total += sum(self.model.traffic(members))
        return total


_FirstFusion = tuple[TrafficModel, Groups, list[Decision], list[Refusal]]


def _fuse_and_recompute(graph: ir.IRGraph, weigh: bool, first: _FirstFusion | None = None,
                        memo: Expanded | None = None) -> _Fused:
    # Fuse; then recompute, in their readers, the pointwise results that fusion left stored and
    # that are cheaper to compute again (recompute.py), and fuse again, until none is left.
    # ``weigh``: weigh the instructions recomputing adds (false: recompute costly values too);
    # ``first``: the fusion of ``graph`` itself, where it was made already (either way's start);
    # ``memo``: the expansions of nodes that no round rewrites, made once (``recompute._expand``).
    recomputed: tuple[ir.Pointwise, ...] = ()
    absorbed: tuple[ir.Pointwise, ...] = ()
    memo = {} if memo is None else memo
    while True:
        if first is not None:
            (model, groups, decisions, refusals), first = first, None
        else:
            model = TrafficModel(graph)
            groups, decisions, refusals = fuse(graph, model)
        if not config.fusion:
            return _Fused(graph, model, groups, decisions, refusals)
        stored = {b.name for g in groups.topological() for b in model.stored(groups.members[g])}
        kernel_of = {name: g for g in groups.topological() for name in groups.members[g]}
        rewritten, more, chains, refused = inline_cheap(graph, stored, kernel_of, weigh, memo)
        if not more:
            return _Fused(graph, model, groups, decisions, refusals, recomputed, absorbed, refused)
        graph, recomputed, absorbed = rewritten, recomputed + more, absorbed + chains


def schedule(graph: ir.IRGraph) -> Schedule:
    # Recomputing moves a node's reads into its readers: the graph inputs read stay the same, so
    # the floor of the rewritten graph is the floor of the original. With fusion off every node
    # is a kernel of its own. Where values were kept stored for the instructions recomputing
    # them would add, the graph is fused again recomputing them too, and the way that moves
    # fewer bytes, counting those instructions as bytes (cost_model.OPS_PER_BYTE_SAVED), is
    # taken: storing a value changes what fusion groups after it. ConvNeXt V2's training step
    # (bf16, b16, by the cost model, 2026-12-01): its forward moved 1.48 GiB with the GELU stored
    # against 1.23 recomputed, its backward 3.72 against 2.44, fusion storing other values beside
    # the GELU there.
    graph = _without_unread(graph)
    model = TrafficModel(graph)
    first = (model, *fuse(graph, model))
    memo: Expanded = {}
    fused = _fuse_and_recompute(graph, True, first, memo)
    compared = ""
    if fused.costly:
        every = _fuse_and_recompute(graph, False, first, memo)
        stored, recomputed_bytes = fused.kernel_bytes(), every.kernel_bytes()
        as_bytes = sum(c.instructions for c in fused.costly.values()) // OPS_PER_BYTE_SAVED
        compared = (f"stored, the kernels move {format_bytes(stored)}; recomputed, {format_bytes(recomputed_bytes)} "
                    f"and {as_bytes * OPS_PER_BYTE_SAVED / 1e6:.1f}M instructions more (as {format_bytes(as_bytes)})")
        if recomputed_bytes + as_bytes < stored:
            fused = every
    graph, model, groups = fused.graph, fused.model, fused.groups
    recomputed, absorbed = fused.recomputed, fused.absorbed
    costly = tuple((name, c.why) for name, c in fused.costly.items())
    steps: list[Step] = []
    # what kernel_sources looks through: the nodes recomputing removed, as they were, and the rest
    producers = {n.name: n for n in (*recomputed, *absorbed, *graph.nodes)}
    for g in memory_order(groups, model) if config.fusion else groups.topological():
        members = groups.members[g]
        nodes = tuple(groups.nodes[n] for n in members)
        if len(nodes) == 1 and isinstance(nodes[0], ir.Extern):
            read, written = model.traffic(members)
            steps.append(ExternCall(nodes[0], read, written))
            continue
        read, written = model.traffic(members)
        stored = tuple(sorted(model.stored(members), key=lambda b: groups.order[model.written_by[b.name]]))
        space = plan_space(nodes, {b.name for b in stored})
        sources, unsourced = kernel_sources(nodes, graph.sources, producers)
        steps.append(KernelPlan(nodes, stored, read, written, space, sources, unsourced))
    floor = graph_floor(graph, model.readers)
    return Schedule(graph, tuple(steps), tuple(fused.decisions), tuple(fused.refusals), floor, recomputed, absorbed,
                    costly, compared)


def _without_unread(graph: ir.IRGraph) -> ir.IRGraph:
    """The graph without the nodes whose results nothing needs: a tensor whose only reader is a
    factory that takes its shape alone (``zeros_like(x * 2)``, ``rand_like``, ``bernoulli`` of a
    clone). Alone in a kernel, such a node would store nothing."""
    needed = graph.results()
    kept: list[ir.Node] = []
    for node in reversed(graph.nodes):
        if isinstance(node, (ir.Pointwise, ir.Reduction)) and node.name not in needed:
            continue
        needed |= {v.buffer.name for v in node.reads()}
        kept.append(node)
    if len(kept) == len(graph.nodes):
        return graph
    return dataclasses.replace(graph, nodes=kept[::-1])


__all__ = ["schedule", "Schedule", "KernelPlan", "ExternCall"]
