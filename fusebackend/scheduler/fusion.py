"""Fusion: group IR nodes into kernels, greedily by the bytes each fusion saves.

Every Pointwise, Reduction, Scan or Scatter node starts as its own group; externs stay alone (a
scatter takes in only the pointwise producers of its positions and values, see
``scan_scatter_space.py``, and merges with no sibling). Candidates are
pairs of groups where one reads what the other writes (vertical) or both read one buffer
(horizontal). Each candidate is checked for legality (``why_not``), scored by
``cost_model.TrafficModel.bytes_saved`` and the best legal one is merged, until no candidate
saves bytes. Every refusal is kept with its reason for the report. Last, small sibling groups
(both reading outputs of one group, or both only graph inputs, each moving at most
``SMALL_KERNEL_BYTES``) merge where legal: no bytes saved, one launch fewer (``_merge_siblings``).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from typing import Iterable, Sequence

import sympy

from fusebackend import indexing, ir
from fusebackend.config import config
from fusebackend.inlining import substitute
from fusebackend.scheduler.cost_model import SMALL_KERNEL_BYTES, TrafficModel, window_recompute
from fusebackend.scheduler.groups import Groups
from fusebackend.scheduler.ordering import live_profile, storage_bytes
from fusebackend.scheduler.space import R, SpaceError, plan_space, row_contiguous_reduction, step_along
from fusebackend.scheduler.space_types import KernelSpace
from fusebackend.sizevars import size_hint


@dataclasses.dataclass(frozen=True)
class Refusal:
    first: tuple[str, ...]
    second: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        return f"{'+'.join(self.first)} x {'+'.join(self.second)}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Decision:
    first: tuple[str, ...]
    second: tuple[str, ...]
    kind: str
    bytes_saved: int

    def __str__(self) -> str:
        if self.kind == "siblings":
            return f"siblings: {'+'.join(self.first)} with {'+'.join(self.second)}: no bytes saved, one launch fewer"
        return f"{self.kind}: {'+'.join(self.first)} <- {'+'.join(self.second)} saves {self.bytes_saved} B"


def never_merge(groups: Groups, a: str, b: str) -> str | None:
    """The reason groups a and b can never become one kernel, whatever merges come after: one of
    them is an extern call (externs stay alone, a group of one named as its node) or together they
    are past ``max_fusion_size`` (groups only grow); None otherwise."""
    if isinstance(groups.nodes.get(a), ir.Extern) or isinstance(groups.nodes.get(b), ir.Extern):
        return "extern call"
    if len(groups.members[a]) + len(groups.members[b]) > config.max_fusion_size:
        return f"group would exceed {config.max_fusion_size} nodes"
    return None


def why_not(groups: Groups, model: TrafficModel, a: str, b: str) -> str | None:
    """None when groups a and b may become one kernel, otherwise the reason they may not."""
    never = never_merge(groups, a, b)
    if never is not None:
        return never
    names = groups.members[a] + groups.members[b]
    nodes = sorted((groups.nodes[n] for n in names), key=lambda n: groups.order[n.name])
    if groups.cycle(a, b):
        return CYCLE
    recompute = window_recompute(nodes, model.positions_read, lambda: sum(model.traffic(names)))
    if recompute is not None:
        return recompute
    stored = model.stored(names)
    product = _product_refusal(nodes, stored)
    if product is not None:
        return product
    orders = _stored_orders(nodes, stored)
    if orders is not None:
        return orders
    try:
        space = plan_space(nodes, {buf.name for buf in stored})
    except SpaceError as exc:
        return str(exc)
    return _stores_across_rows(nodes, stored, space)


def _product_refusal(nodes: Sequence[ir.Node], stored: Iterable[ir.Buffer]) -> str | None:
    """Why a matrix product's kernel (``codegen/product.py``) may not hold these nodes: it
    computes one product, what feeds it (inside its loop over K, never stored) and what is
    computed from it on its output's tiles; None where it may (or holds no product)."""
    products = [n for n in nodes if isinstance(n, ir.Reduction) and n.product]
    if not products:
        return None
    if len(products) > 1 or any(isinstance(n, (ir.Reduction, ir.Scan, ir.Scatter)) and n is not products[0]
                                for n in nodes):
        return "a product's kernel computes no other reduction, scan or scatter"
    after = {products[0].name}  # the product and what the group computes from it
    for node in nodes:  # (in execution order)
        if any(v.buffer.name in after for v in node.reads()):
            after.add(node.name)
    if any(buf.name not in after or buf.numel != products[0].buffer.numel for buf in stored):
        return "a product's kernel stores only the product and values of its shape computed from it"
    return None


def _memory_dims(buf: ir.Buffer) -> tuple[int, ...] | None:
    """A dense buffer's dims of more than one element in memory order (fastest last), at the
    sizes being compiled; None where it is not dense."""
    sizes, strides = [size_hint(n) for n in buf.sizes], [size_hint(n) for n in buf.strides]
    if not indexing.is_dense(sizes, strides):
        return None
    return tuple(sizes[d] for d in indexing.dense_order(sizes, strides) if sizes[d] > 1)


def _stored_orders(nodes: list[ir.Node], stored: list[ir.Buffer]) -> str | None:
    """Why a pointwise kernel may not store these buffers together: two of them lay out their
    elements in different dim orders (a tensor and a transposed copy of another, such as an
    attention's query [b, h, s, d] beside its key expanded as [b, h, d, s]).

    A pointwise kernel stores each output along its own memory order from one flat index, so
    what one output reads along its rows the other reads across them: one element per 32-byte
    sector. Apart, the transposing kernel is tiled (``codegen/pointwise.tile``) and both read
    along their rows; together no tile serves both. Such a fusion saves at most a shared read
    (Falcon-7B, b4 s512, bf16, H100, 2026-11-27: the query's rotary embedding, the key's rotary
    embedding expanded over 71 heads and transposed for a batched product, and the value's
    expansion made one kernel of 175 us a layer, at 25% of its bytes' floor). Small kernels,
    bound by their launch, may mix orders."""
    if any(not isinstance(n, ir.Pointwise) for n in nodes):
        return None
    if sum(size_hint(b.numel) * b.dtype.itemsize for b in stored) < SMALL_KERNEL_BYTES:
        return None
    seen: dict[int, dict[tuple[int, ...], str]] = {}  # by element count (others never share a kernel)
    for buf in stored:
        dims = _memory_dims(buf)
        if dims is not None:
            seen.setdefault(math.prod(dims), {}).setdefault(dims, buf.name)
    for orders in seen.values():
        if len(orders) > 1:
            (a, first), (b, second) = list(orders.items())[:2]
            return (f"outputs laid out in different dim orders ({first} {list(a)}, {second} {list(b)}): "
                    "one flat index would read one of them across its rows")
    return None


def _stores_across_rows(nodes: list[ir.Node], stored: list[ir.Buffer], space: KernelSpace) -> str | None:
    """Why a reduction kernel may not store these buffers: one of them, of an element per (row,
    position), lies across the rows where the kernel reads them along (its largest input is
    contiguous along the reduced positions): consecutive positions of a row are a stride apart
    in it, so each store writes one element per 32-byte sector.

    A convolution's bias gradient is a sum of the output's gradient over every dim but the
    channels; where that gradient arrives NCHW (a graph's incoming gradient), the sum reads each
    channel's row along its H*W run, and the gradient's channels-last copy for the convolution
    would be stored C elements apart along it (``lowering/graph.py``,
    ``_convolution_backward_inputs``). Apart, the copy is a tiled transpose and the sum reads its
    rows along. A kernel that reads its rows across too (a layer norm over the channels of an
    NCHW tensor) takes several rows a block (``runtime.reduction_config``'s ``across_rows``),
    whose stores then coalesce; it may store across."""
    anchor = space.anchor
    if not isinstance(anchor, ir.Reduction) or size_hint(space.rnumel) <= 1:
        return None
    full = size_hint(space.xnumel) * size_hint(space.rnumel)
    big = {b.name for b in stored if size_hint(b.numel) == full and full * b.dtype.itemsize >= SMALL_KERNEL_BYTES}
    for node in nodes:
        subst = space.mapping.get(node.name)
        if node.buffer.name not in big or subst is None:
            continue
        buf = node.buffer
        ivars = indexing.loop_vars("i", len(buf.sizes))
        step = step_along(sympy.sympify(indexing.ravel([subst[v] for v in ivars], buf.strides)), R)
        if step not in (0, 1) and row_contiguous_reduction(anchor, _read_through(anchor, nodes)):
            return (f"{buf.name} would be stored across the rows the reduction reads along (its positions "
                    f"{step} elements apart): one element per sector")
    return None


def _read_through(red: ir.Reduction, nodes: list[ir.Node]) -> ir.Expr:
    """``red``'s body with the kernel's pointwise nodes inlined where it loads them, to the
    tensors the kernel reads from memory (a layer norm's contiguous copy of its input is the
    input itself, read across)."""
    members = {n.buffer.name: n for n in nodes if isinstance(n, ir.Pointwise)}
    node = red
    for _ in range(len(members)):
        if not any(load.view.buffer.name in members for load in node.body_loads):
            break
        node = dataclasses.replace(node, body=substitute(node, members))
    return node.body


def fuse(graph: ir.IRGraph, model: TrafficModel) -> tuple[Groups, list[Decision], list[Refusal]]:
    """Greedy fusion: the legal candidate that saves the most bytes first, until none saves any.

    Candidates wait in a heap by bytes saved (ties: vertical before horizontal, then graph
    order). A candidate's score and legality depend only on its two groups' members, except
    that a merge elsewhere may create a path between them (reachability only grows), so a
    candidate is checked when it is popped, and dropped when either group has changed since it
    was scored: a merge pushes the merged group's new candidates.

    A pair that can never merge, because one of the two is an extern call or together they
    exceed ``max_fusion_size`` (groups only grow, and externs stay alone), is neither scored
    nor pushed: it is set aside and reported at the end, between the groups it then joins,
    where it would save bytes (``_lasting_refusals``). Scored and pushed again after each
    merge, such pairs were most of the work in graphs of long traced loops: Mamba's 24 layers
    over 32 positions (3201 nodes, many read at every position) gave 44k legality checks, of
    which 20.6k refused an extern call and 5.8k a group past 64 nodes.
    """
    groups = Groups(graph)
    decisions: list[Decision] = []
    refusals: dict[tuple[str, str], Refusal] = {}
    if not config.fusion:
        return groups, decisions, []
    stamps = itertools.count()
    version = {g: next(stamps) for g in groups.members}
    holding = Holding(groups, model)
    heap: list[tuple[int, int, int, int, str, str, str, int, int]] = []
    lasting: set[tuple[str, str]] = set()  # pairs that can never merge, by a node of each

    def push(a: str, b: str, kind: str) -> None:
        if never_merge(groups, a, b) is not None:
            lasting.add((a, b))
            return
        if groups.known_cycle(a, b):  # refused before, and still: a merge of either checks again
            refusals[(a, b)] = Refusal(tuple(groups.members[a]), tuple(groups.members[b]), CYCLE)
            return
        saved = model.bytes_saved(groups.members[a], groups.members[b])
        if saved > 0:
            entry = (-saved, _KIND_RANK[kind], groups.order[a], groups.order[b], a, b, kind, version[a], version[b])
            heapq.heappush(heap, entry)

    for a, b, kind in _candidates(groups, model):
        push(a, b, kind)
    while heap:
        neg_saved, _, _, _, a, b, kind, va, vb = heapq.heappop(heap)
        if version.get(a) != va or version.get(b) != vb:
            continue  # scored before one of the two changed
        reason = why_not(groups, model, a, b)
        if reason is None:
            reason = holding.refusal(a, b)
        if reason is not None:
            refusals[(a, b)] = Refusal(tuple(groups.members[a]), tuple(groups.members[b]), reason)
            continue
        decisions.append(Decision(tuple(groups.members[a]), tuple(groups.members[b]), kind, -neg_saved))
        keep = holding.merge(a, b)
        del version[b if keep == a else a]
        version[keep] = next(stamps)
        for x, y, k in _candidates_of(groups, model, keep):
            push(x, y, k)
    _merge_siblings(groups, model, decisions)
    # Keep only refusals between groups that survived (earlier ones were superseded by merges).
    final = _lasting_refusals(groups, model, lasting)
    final.update(((groups.group_of[r.first[0]], groups.group_of[r.second[0]]), r) for r in refusals.values())
    kept = [r for (a, b), r in final.items() if a != b]
    return groups, decisions, kept


def _lasting_refusals(groups: Groups, model: TrafficModel,
                      pairs: set[tuple[str, str]]) -> dict[tuple[str, str], Refusal]:
    """The refusals of pairs that could never merge (``fuse``'s ``lasting``), between the groups
    their nodes end in, where merging those would save bytes; by (first group, second group)."""
    out: dict[tuple[str, str], Refusal] = {}
    order = groups.order.__getitem__
    for a, b in sorted({(groups.group_of[x], groups.group_of[y]) for x, y in pairs}, key=lambda p: (order(p[0]), order(p[1]))):
        if a == b or (a, b) in out:
            continue
        first, second = groups.members[a], groups.members[b]
        if model.bytes_saved(first, second) <= 0:
            continue
        reason = never_merge(groups, a, b)  # a pair that could never merge still cannot
        assert reason is not None, (a, b)
        out[(a, b)] = Refusal(tuple(first), tuple(second), reason)
    return out


def _merge_siblings(groups: Groups, model: TrafficModel, decisions: list[Decision]) -> None:
    """Merge small groups that read outputs of the same group (or graph inputs only), in graph
    order, where legal."""

    def small(g: str) -> bool:
        members = groups.members[g]
        return not any(isinstance(groups.nodes[n], (ir.Extern, ir.Scatter)) for n in members) and (
            sum(model.traffic(members)) <= SMALL_KERNEL_BYTES)

    holding = Holding(groups, model)

    merged = True
    while merged:  # a merge can give a group new siblings
        merged = False
        roots = [g for g in groups.members if not groups.group_pred(g)]  # they read graph inputs only
        for parent in [None] + sorted(groups.members, key=groups.order.get):
            if parent is not None and parent not in groups.members:
                continue  # merged into another in this pass
            children = roots if parent is None else groups.group_succ(parent)
            pending = sorted((c for c in children if c in groups.members and small(c)), key=groups.order.get)
            while pending:
                a, rest = pending[0], []
                for b in pending[1:]:
                    if not _may_share_space(_space_key(groups, a), _space_key(groups, b)):
                        rest.append(b)  # cannot share a kernel; spares the legality check
                    elif holding.refusal(a, b) is not None:
                        rest.append(b)
                    elif why_not(groups, model, a, b) is None and _no_more_bytes(model, groups, a, b):
                        decisions.append(Decision(tuple(groups.members[a]), tuple(groups.members[b]), "siblings", 0))
                        a = holding.merge(a, b)
                        merged = True
                    else:
                        rest.append(b)
                pending = rest


class Holding:
    """The memory a merge holds: outputs made before their time.

    One kernel runs both groups before the first reader of the earlier group's outputs, so the
    later group's outputs are made there and wait for their own place, less what the merge
    spares (the earlier group's outputs that only the later one read): the merged group's stored
    bytes less the earlier group's. A merge is refused where that wait crosses the graph's
    widest point: where the bytes live over the places waited over, as the graph's order holds
    them (``ordering.live_profile``, taken once and updated by each merge taken), plus the held
    outputs exceed the peak by more than a slack (``SLACK_BYTES`` or ``SLACK_SHARE`` of the peak,
    the lesser, for all merges together). A chain whose earlier link only the later one reads
    holds nothing.

    What it stops: groups that read graph inputs alone (a convolution's weight made
    channels-last) all made at the first one's place: ResNet-50's first stage made three such
    weights at once, 0.1 MiB above Inductor's peak at b64 (H100, 2026-11-25). And every layer's
    work on one shared value made at once: BEiT's twelve layers each gather their relative
    position bias through one index computed from ``arange`` and expand it over the batch for
    cuDNN's attention (plus a mask made from ``arange``); fused as readers of that mask, all
    twelve biases (56.8 MiB each at b64) were made by the graph's third kernel, and a step peaked
    at 995 MiB against Inductor's 388 (H100, bf16, 2026-11-27). The merge's own place is no guide
    where the later group's producers can move: each layer's position table, made from
    parameters alone, was merged with the others and made first.
    """

    def __init__(self, groups: Groups, model: TrafficModel) -> None:
        self.groups, self.model = groups, model
        position, self.live, self.made = live_profile(groups, model)
        self.first = dict(position)  # each group's first member's place in the graph's order
        self.node_at = {k: g for g, k in position.items()}  # a group is named by one of its nodes
        self.peak = max(self.live, default=0)
        # what merges may add to the peak in all: a launch saved is worth a little memory (twelve
        # layers' 17 KiB position tables made by one kernel), not a layer's activations
        self.slack = min(SLACK_BYTES, int(SLACK_SHARE * self.peak))

    def _stored(self, names: list[str]) -> int:
        return sum(storage_bytes(buf) for buf in self.model.stored(names))

    def _span(self, a: str, b: str) -> tuple[list[int], int]:
        """The places the later group's outputs would wait over, and the bytes they add.

        The merged kernel runs before the first reader of the earlier group's outputs, so the
        later group's outputs wait from there to the later group's own place: over every place
        between that is not the pair's. An earlier group read by no one else (a chain: a
        reduction and the division reading its row) pins nothing, and holds nothing."""
        f, g = sorted((a, b), key=self.first.__getitem__)
        members, group_of = self.groups.members, self.groups.group_of
        extra = self._stored(members[a] + members[b]) - self.made[f]
        read = [self.first[group_of[r]] for buf in self.model.stored(members[f])
                for r in self.model.readers.get(buf.name, ()) if group_of[r] not in (f, g)]
        if not read or extra <= 0:
            return [], extra
        return [k for k in range(min(read), self.first[g]) if group_of[self.node_at[k]] not in (f, g)], extra

    def refusal(self, a: str, b: str) -> str | None:
        """Why ``a`` and ``b`` may not run as one kernel for memory, or None."""
        span, extra = self._span(a, b)
        if not span or max(self.live[k] for k in span) + extra <= self.peak + self.slack:
            return None
        return (f"would make {extra / 2**20:.2f} MiB {len(span)} steps before its readers, "
                f"above the graph's widest point ({self.peak / 2**20:.2f} MiB)")

    def merge(self, a: str, b: str) -> str:
        """Merge ``a`` and ``b`` in ``groups``, accounting for what the merged group holds; the
        merged group's name."""
        span, extra = self._span(a, b)
        if extra > 0:
            for k in span:
                self.live[k] += extra
        keep = self.groups.merge(a, b)
        self.first[keep] = min(self.first[a], self.first[b])
        self.made[keep] = self._stored(self.groups.members[keep])
        return keep


def _space_key(groups: Groups, g: str) -> tuple[int, ...]:
    """(rows, positions per row) of the group's first reduction, or (elements,) of its largest
    pointwise node."""
    nodes = [groups.nodes[n] for n in groups.members[g]]
    for node in nodes:
        if isinstance(node, ir.Reduction):
            return (node.buffer.numel, node.reduction_numel)
        if isinstance(node, ir.Scan):  # rows and positions, like a reduction's
            positions = node.buffer.sizes[node.dim]
            return (node.buffer.numel // max(positions, 1), positions)
    return (max((n.buffer.numel for n in nodes if isinstance(n, ir.Pointwise)), key=size_hint),)


def _may_share_space(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """A cheap necessary condition for ``plan_space`` to accept two groups together."""
    if len(a) == len(b):
        return a == b
    (rows, positions), (numel,) = (a, b) if len(a) == 2 else (b, a)
    return numel in (rows, rows * positions)  # a pointwise group of row or full nodes


def _no_more_bytes(model: TrafficModel, groups: Groups, a: str, b: str) -> bool:
    """The merged group moves no more than its parts did."""
    return sum(model.traffic(groups.members[a] + groups.members[b])) <= (
        sum(model.traffic(groups.members[a])) + sum(model.traffic(groups.members[b])))


_KIND_RANK = {"vertical": 0, "horizontal": 1}
CYCLE = "a node outside both depends on one and feeds the other (cycle)"
SLACK_BYTES, SLACK_SHARE = 1 << 20, 0.02  # Holding: merges may raise the peak by the lesser
HORIZONTAL_REACH = 8  # a buffer read by many groups pairs each with its nearest readers only


def _candidates_of(groups: Groups, model: TrafficModel, g: str) -> Iterable[tuple[str, str, str]]:
    """The candidates that involve group ``g``, in graph order."""
    order = groups.order.get
    for s in sorted(groups.group_succ(g), key=order):
        yield g, s, "vertical"
    for p in sorted(groups.group_pred(g), key=order):
        yield p, g, "vertical"
    buffers = sorted({b for n in groups.members[g] for b in groups.buffers_read(n)})
    partners: set[str] = set()
    for buf in buffers:
        owners = groups.owners(buf)
        at = groups.owner_index(owners, g)
        partners.update(owners[max(0, at - HORIZONTAL_REACH): at] + owners[at + 1: at + 1 + HORIZONTAL_REACH])
    for other in sorted(partners, key=order):
        yield (g, other, "horizontal") if order(g) < order(other) else (other, g, "horizontal")


def _candidates(groups: Groups, model: TrafficModel) -> Iterable[tuple[str, str, str]]:
    seen: set[tuple[str, str]] = set()
    for g in list(groups.members):
        # in graph order, not set order: ties in bytes saved go to the first candidate, so the
        # order decides which fusion is taken, and the report's order (the same in every process)
        for s in sorted(groups.group_succ(g), key=groups.order.get):
            if (g, s) not in seen:
                seen.add((g, s))
                yield g, s, "vertical"
    for readers in model.readers.values():
        owners = sorted({groups.group_of[r] for r in readers}, key=groups.order.get)
        for i, a in enumerate(owners):
            for b in owners[i + 1 : i + HORIZONTAL_REACH]:  # bounded: a buffer read by many nodes
                if (a, b) not in seen and (b, a) not in seen:
                    seen.add((a, b))
                    yield a, b, "horizontal"
