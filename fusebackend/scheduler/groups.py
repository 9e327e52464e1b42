"""The fused groups of a graph's nodes and the dependency edges between them (``Groups``).

Fusion (``fusion.py``) merges groups; ordering (``ordering.py``) runs them in an order that
respects the edges. Both import ``Groups`` from here (``fusion`` re-exports it), so that
``ordering`` need not import ``fusion``, which imports ``ordering``.
"""

from __future__ import annotations

import bisect
import heapq

from fusebackend import ir


class Groups:
    """Union of nodes into groups, with the dependency edges between groups.

    The edges between groups are kept up to date on each merge (``_gsucc``, ``_gpred``) rather
    than gathered from the members' edges whenever they are asked for: reachability checks walk
    them for every candidate fusion, and a group's members grow with each merge.
    """

    def __init__(self, graph: ir.IRGraph) -> None:
        self.order = {n.name: k for k, n in enumerate(graph.nodes)}
        self.nodes = ir.nodes_by_name(graph.nodes)
        self.members: dict[str, list[str]] = {n.name: [n.name] for n in graph.nodes}
        self.group_of: dict[str, str] = {n.name: n.name for n in graph.nodes}
        producers = {b.name: n.name for n in graph.nodes for b in ir.written_buffers(n)}
        self.succ: dict[str, set[str]] = {n.name: set() for n in graph.nodes}
        self.pred: dict[str, set[str]] = {n.name: set() for n in graph.nodes}
        barrier: str | None = None
        collective: str | None = None
        since: list[str] = []  # the nodes after the last mutation, and that mutation
        for node in graph.nodes:
            deps = {producers[v.buffer.name] for v in node.reads() if v.buffer.name in producers}
            if barrier is not None:
                deps.add(barrier)
            if isinstance(node, ir.Extern) and node.mutates:
                # a mutation waits for every earlier node, and blocks later ones; the nodes before
                # the last mutation it waits for through that one (an edge to each would make
                # an optimizer step's copies into its step counters, one per parameter, square
                # in the parameters)
                deps.update(since)
                barrier = node.name
                since = []
            if ir.is_collective(node):
                # collectives (and their waits) keep the graph's order among themselves: every
                # process issues them in the same order, whatever order the rest takes
                if collective is not None:
                    deps.add(collective)
                collective = node.name
            for d in deps:
                self.succ[d].add(node.name)
                self.pred[node.name].add(d)
            since.append(node.name)
        # an input written in place (graph.mutations) is written after every node that reads it:
        # a kernel that read it later would see the new value
        written_by = {target: name for name, target in graph.mutations.items()}
        for node in graph.nodes:
            for target in {v.buffer.name for v in node.reads()} & written_by.keys():
                writer = written_by[target]
                if writer != node.name:
                    self.succ[node.name].add(writer)
                    self.pred[writer].add(node.name)
        self._gsucc = {n: set(s) - {n} for n, s in self.succ.items()}
        self._gpred = {n: set(p) - {n} for n, p in self.pred.items()}
        # the earliest graph position among the members of the groups a group reaches (itself
        # included): ``_path`` stops where it is past its target's first member. A group's
        # own first member bounds nothing once groups merge: one entered by a late member can
        # feed another through an early one.
        self._reach_first = {n: self.order[n] for n in self.members}
        for g in reversed(self.topological()):
            for s in self._gsucc[g]:
                self._reach_first[g] = min(self._reach_first[g], self._reach_first[s])
        self._witness: dict[tuple[str, str], tuple[str, ...]] = {}  # ``cycle``'s paths found
        self._buffers_read: dict[str, list[str]] = {}
        # buffer -> the groups that read it, in graph order, kept on merges: horizontal
        # candidates pair a group with its nearest fellow readers, and a buffer that every
        # layer reads (a shared weight, a mask) would otherwise be sorted again at each merge
        self._owners: dict[str, list[str]] = {}
        for node in graph.nodes:
            for buf in dict.fromkeys(self.buffers_read(node.name)):
                self._owners.setdefault(buf, []).append(node.name)

    def group_succ(self, g: str) -> set[str]:
        return set(self._gsucc[g])

    def group_pred(self, g: str) -> set[str]:
        return set(self._gpred[g])

    def first(self, g: str) -> int:
        """The graph position of the group's first node (members are kept in graph order)."""
        return self.order[self.members[g][0]]

    def buffers_read(self, name: str) -> list[str]:
        """The names of the buffers node ``name`` reads, in the order its body loads them."""
        out = self._buffers_read.get(name)
        if out is None:
            out = self._buffers_read[name] = [v.buffer.name for v in self.nodes[name].reads()]
        return out

    def owners(self, buf: str) -> list[str]:
        """The groups that read ``buf``, in graph order (of each group's name, its first node)."""
        return self._owners.get(buf, [])

    def owner_index(self, owners: list[str], g: str) -> int:
        """Where group ``g`` stands in ``owners`` (a list from ``owners``), by bisection."""
        at = bisect.bisect_left(owners, self.order[g], key=self.order.__getitem__)
        assert owners[at] == g, f"group {g} missing from its buffer's readers"
        return at

    def _path(self, src: str, dst: str, skip_direct: bool) -> list[str] | None:
        """The groups between src and dst on a path from one to the other (through another
        group when ``skip_direct``), in order; None where there is none."""
        limit = self.first(dst)
        succ, reach_first = self._gsucc, self._reach_first
        came: dict[str, str] = {s: src for s in succ[src] if not (skip_direct and s == dst)}
        stack = list(came)
        while stack:
            g = stack.pop()
            if g == dst:
                path = []
                while (g := came[g]) != src:
                    path.append(g)
                return path[::-1]
            if reach_first[g] > limit:  # nothing g reaches is as early as dst
                continue
            for s in succ[g]:
                if s not in came:
                    came[s] = g
                    stack.append(s)
        return None

    def known_cycle(self, a: str, b: str) -> bool:
        """Whether a path ``cycle`` found between ``a`` and ``b`` still holds (no search)."""
        kept = self._witness.get((a, b))
        return kept is not None and all(self.group_of[n] not in (a, b) for n in kept)

    def cycle(self, a: str, b: str) -> bool:
        """Would merging ``a`` and ``b`` make a cycle: does a path lead from one to the other
        through another group?

        A path found is kept, by a node of each group on it: merges elsewhere only join groups
        and their edges, so it holds while none of its nodes has joined ``a`` or ``b``, and a
        pair refused again (each time one of the two has grown) is checked along it. Mamba's
        residual adds of consecutive layers, each group grown node by node through a loop traced
        over its positions, were refused 51 times each."""
        if self.known_cycle(a, b):
            return True
        path = self._path(a, b, skip_direct=True)
        if path is None:
            path = self._path(b, a, skip_direct=True)
        if path is None:
            self._witness.pop((a, b), None)
            return False
        self._witness[(a, b)] = tuple(path)
        return True

    def merge(self, a: str, b: str) -> str:
        keep, gone = (a, b) if self.order[a] <= self.order[b] else (b, a)
        moved = self.members.pop(gone)
        self.members[keep] = sorted(self.members[keep] + moved, key=self.order.get)
        for n in self.members[keep]:
            self.group_of[n] = keep
        for buf in {name for n in moved for name in self.buffers_read(n)}:  # gone's place goes to keep
            owners = self._owners[buf]
            del owners[self.owner_index(owners, gone)]
            at = bisect.bisect_left(owners, self.order[keep], key=self.order.__getitem__)
            if at == len(owners) or owners[at] != keep:
                owners.insert(at, keep)
        succ, pred = self._gsucc.pop(gone), self._gpred.pop(gone)
        for s in succ:
            self._gpred[s].discard(gone)
            if s != keep:
                self._gpred[s].add(keep)
        for p in pred:
            self._gsucc[p].discard(gone)
            if p != keep:
                self._gsucc[p].add(keep)
        self._gsucc[keep] = (self._gsucc[keep] | succ) - {keep, gone}
        self._gpred[keep] = (self._gpred[keep] | pred) - {keep, gone}
        self._lower_reach(keep, min(self._reach_first[keep], self._reach_first.pop(gone)))
        return keep

    def _lower_reach(self, g: str, first: int) -> None:
        """``first`` is reachable from ``g``: so it is from every group that reaches ``g``. The
        walk up stops at groups already as low (and so, then, is everything above them)."""
        stack = [g]
        self._reach_first[g] = min(self._reach_first[g], first)
        while stack:
            for p in self._gpred[stack.pop()]:
                if self._reach_first[p] > first:
                    self._reach_first[p] = first
                    stack.append(p)

    def topological(self) -> list[str]:
        """Groups in an order that respects dependencies, staying close to the graph's order."""
        indeg = {g: len(self._gpred[g]) for g in self.members}
        ready = [(self.first(g), g) for g, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            _, g = heapq.heappop(ready)
            out.append(g)
            for s in self._gsucc[g]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, (self.first(s), s))
        assert len(out) == len(self.members), "fusion created a cycle"
        return out
