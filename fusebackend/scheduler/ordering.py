"""The order the fused groups run in: the graph's, unless another lowers the peak of memory.

Groups run in an order that respects their dependencies and stays close to the graph's
(``Groups.topological``). Where independent steps could run in either order, the graph's order
can hold more memory at once than needed. GPT-2's training step shows it: the backward of its
language-model head pads the logits' gradient and the embedding for aligned products
(``lowering/matmuls.py``), then computes the embedding's gradient (a new 74 MiB result) while the
padded embedding (74 MiB) waits for the product that reads it last. Run that product first and
the padded embedding is freed before the gradient is allocated: in the graph's order fuse's step
peaked 68 MiB above Inductor's, which orders its steps for memory too; reordered, the head's
backward plans 472 MiB instead of 546 and the step peaks at 2598.8 MiB against Inductor's
2601.7 (H100, bf16, b8 s512, 2026-11-25).

``memory_order`` also builds two greedy orders (``_greedy``): among the groups whose inputs are
ready, the one that adds the fewest bytes (its stored outputs, less the intermediates it reads
last) runs next, counting with the reader it lets run where that pair adds fewer (a padding,
then the product that reads the padded matrix last); anchored, the graph's next group runs
unless such a choice also frees memory. It estimates the peak of each order (``_live``: each
buffer freed after its last reader, the graph's results kept, and a kernel's output of the bytes
of an intermediate it reads last written over it, as the wrapper's memory plan does), and takes the lowest only where it is below
the graph order's by ``MIN_GAIN`` of that peak and at least ``MIN_GAIN_BYTES``: any other
reordering only moves kernels away from their producers for nothing. The graph's inputs are
left out of the estimate (a forward's are held by the caller).
"""

from __future__ import annotations

import dataclasses

from fusebackend import ir
from fusebackend.scheduler.cost_model import TrafficModel
from fusebackend.scheduler.groups import Groups
from fusebackend.sizevars import size_hint

MIN_GAIN = 0.02  # the least share of the peak a reordering must save
MIN_GAIN_BYTES = 1 << 20


@dataclasses.dataclass
class Footprints:
    """What each group allocates and reads, for estimating the memory an order holds."""

    made: dict[str, dict[str, int]]  # group -> its new buffers (name -> bytes)
    reads: dict[str, set[str]]  # group -> the intermediates it reads (made by another group)
    externs: set[str]  # groups that are one ATen call (never written over an input)
    keep: set[str]  # buffers never freed (the graph's results)
    readers: dict[str, int] = dataclasses.field(default_factory=dict)  # buffer -> groups reading it
    size: dict[str, int] = dataclasses.field(default_factory=dict)  # buffer -> bytes

    def __post_init__(self) -> None:
        for names in self.reads.values():
            for name in names:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.size = {name: n for bufs in self.made.values() for name, n in bufs.items()}


def memory_order(groups: Groups, model: TrafficModel) -> list[str]:
    """The groups in the order to run them: ``groups.topological()``, or a greedy order where it
    lowers the estimated peak (see the module's docstring)."""
    graph_order = groups.topological()
    if len(graph_order) < 3:
        return graph_order
    fp = footprints(groups, model, graph_order)
    before = max(_live(graph_order, fp))
    best, lowest = graph_order, before
    for anchored in (True, False):
        order = _greedy(groups, graph_order, fp, anchored)
        peak = max(_live(order, fp))
        if peak < lowest:
            best, lowest = order, peak
    if before - lowest >= max(MIN_GAIN * before, MIN_GAIN_BYTES):
        return best
    return graph_order


def storage_bytes(buf: ir.Buffer) -> int:
    """The bytes a buffer's memory takes (over symbolic sizes: at the hints)."""
    return size_hint(ir.storage_numel(buf) * buf.dtype.itemsize)


def footprints(groups: Groups, model: TrafficModel, order: list[str]) -> Footprints:
    made: dict[str, dict[str, int]] = {}
    externs: set[str] = set()
    for g in order:
        members = groups.members[g]
        nodes = [groups.nodes[n] for n in members]
        if len(nodes) == 1 and isinstance(nodes[0], ir.Extern):
            externs.add(g)
            out = [] if ir.may_alias_arguments(nodes[0]) else [b for _, b in nodes[0].outputs]
        else:
            out = model.stored(members)
        made[g] = {b.name: storage_bytes(b) for b in out}
    owner = {name: g for g, bufs in made.items() for name in bufs}
    reads: dict[str, set[str]] = {}
    for g in order:
        names = {v.buffer.name for n in groups.members[g] for v in groups.nodes[n].reads()}
        reads[g] = {name for name in names if owner.get(name, g) != g}
    return Footprints(made, reads, externs, set(model.graph_outputs))


def _live(order: list[str], fp: Footprints) -> list[int]:
    """Bytes of intermediates live during each group of ``order``.

    A kernel's output of the same bytes as an intermediate it reads for the last time counts as
    written over it, as the wrapper's memory plan writes most such outputs
    (``codegen/memory.py``): without that, the estimate's widest point can be one the plan does
    not have (GPT-2's backward writes 25 outputs over their inputs)."""
    left = dict(fp.readers)
    live, out = 0, []
    for g in order:
        dying = sorted(fp.size.get(name, 0) for name in fp.reads[g] if left[name] == 1 and name not in fp.keep)
        reused = 0
        for n in fp.made[g].values() if g not in fp.externs else ():
            if n in dying:
                dying.remove(n)
                reused += n
        live += sum(fp.made[g].values()) - reused
        out.append(live)
        for name in fp.reads[g]:
            left[name] -= 1
        live -= sum(dying)
        live -= sum(n for name, n in fp.made[g].items() if name not in fp.readers and name not in fp.keep)
    return out or [0]


def live_profile(groups: Groups, model: TrafficModel) -> tuple[dict[str, int], list[int], dict[str, int]]:
    """For the graph's order: each group's position, the bytes live during each position (as
    ``memory_order`` estimates them) and each group's new bytes."""
    order = groups.topological()
    fp = footprints(groups, model, order)
    return {g: k for k, g in enumerate(order)}, _live(order, fp), {g: sum(b.values()) for g, b in fp.made.items()}


def _greedy(groups: Groups, graph_order: list[str], fp: Footprints, anchored: bool = False) -> list[str]:
    """Ready groups, the one adding the fewest bytes first, looking one step ahead: a group that
    lets a reader run which frees what both hold (a padded matrix, then the product that reads
    it last) counts the pair. The graph's order breaks ties.

    ``anchored``: run the graph's next ready group unless another adds fewer bytes and frees
    some, alone or with the reader it lets run. Unanchored, a group that reads inputs alone and
    adds a little (a recomputed activation in a backward graph) runs at once and holds its
    output until its reader: over a whole backward graph that can hold more than it saves."""
    position = {g: k for k, g in enumerate(graph_order)}
    left = dict(fp.readers)
    waiting = {g: len(groups.group_pred(g)) for g in graph_order}
    ready = {g for g in graph_order if waiting[g] == 0}

    def step(g: str, done: str | None = None) -> tuple[int, int]:
        """(bytes added, bytes freed) by ``g``, run after ``done``."""
        freed = sum(fp.size.get(name, 0) for name in fp.reads[g]
                    if left[name] - (done is not None and name in fp.reads[done]) == 1 and name not in fp.keep)
        return sum(fp.made[g].values()) - freed, freed

    def score(g: str) -> tuple[int, int]:
        """(bytes added, bytes freed) by ``g``, or by ``g`` and the reader it lets run."""
        alone = best = step(g)
        for s in groups.group_succ(g):
            if waiting[s] == 1:
                added, freed = step(s, g)
                if alone[0] + added < best[0]:
                    best = (alone[0] + added, alone[1] + freed)
        return best

    out: list[str] = []
    while ready:
        if anchored:
            g = min(ready, key=position.__getitem__)
            mine = score(g)[0]
            for c in sorted(ready, key=position.__getitem__):
                added, freed = score(c)
                if freed > 0 and added < mine:
                    g, mine = c, added
        else:
            g = min(ready, key=lambda c: (score(c)[0], position[c]))
        ready.discard(g)
        out.append(g)
        for name in fp.reads[g]:
            left[name] -= 1
        for s in groups.group_succ(g):
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.add(s)
    assert len(out) == len(graph_order), "groups with a cycle"
    return out
