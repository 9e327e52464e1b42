"""The cost model: bytes of device memory a group of nodes moves, and what a fusion saves.

For a group G of nodes that becomes one kernel:

    traffic(G) = sum over buffers B read by G and written outside G:  read_bytes(B, G)
               + sum over buffers B written by G that a node outside G or the graph's output
                 reads:                                                 B.nbytes

where read_bytes(B, G) = min(B.nbytes, sum over the distinct views of B that G loads of
elements touched x itemsize); a broadcast view counts its distinct elements once, since a
broadcast read is served from cache, and a gather (indirect load) one element per evaluation of
the body that gathers (per element, and per reduced position of a reduction), at most its view's
elements. A buffer written and read only inside G costs nothing: it
is never written to memory. A scatter reads no part of the target it writes into (the copy that
precedes it, whose write counts in full) and writes one element per value it scatters.

    bytes_saved(A, B) = traffic(A) + traffic(B) - traffic(A u B)

Vertical fusion (B reads what A writes) saves the intermediate's write and read; horizontal
fusion (A and B read the same buffer) saves one read of it. The scheduler fuses greedily by
bytes_saved. Then it merges *siblings* that save no bytes but a launch: two small groups that
read the outputs of one kernel (the second phases of two split reductions, say) or graph inputs
only (batch norm's num_batches_tracked updates), each moving
at most SMALL_KERNEL_BYTES, so little that the launch costs more time than the bytes. The
floor of a graph is each graph input it reads, read once, plus each output, written once.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from fusebackend import indexing, ir
from fusebackend.scheduler.instructions import varying_instructions
from fusebackend.sizevars import size_hint


# A kernel that moves this little (1 MiB: about a quarter of a microsecond at an H200's copy
# bandwidth) takes less time than its launch and the gap before it (microseconds).
SMALL_KERNEL_BYTES = 1 << 20


class TrafficModel:
    """Who reads each buffer, so that a group's traffic can be computed from its node names.

    Fusion asks for the traffic of a new union of groups at every candidate it scores, and
    the same node's loads would be walked again for each: what a node reads (each view once,
    with the elements it touches), what it writes and who reads that, and the positions it
    reads each buffer at are taken from its body once, the first time they are asked for, and
    kept for the model's graph, whose nodes do not change. A group's traffic then adds up
    those per-node records, in time proportional to the group's nodes, and what a candidate's
    union saves comes from what the smaller of its two groups reads and stores (``_saved``):
    Mamba's recurrence traced over 256 steps (one layer, CPU, 2026-11-28) scheduled in 3.7-3.9 s
    with the union's traffic from both groups' reads and stores, against 5.8-6.6 s from the
    union's nodes; scoring it took 4.8 s of a profiled 10.0 s, and 2.5 of 9.2 from the smaller.
    """

    def __init__(self, graph: ir.IRGraph) -> None:
        self.readers: dict[str, set[str]] = {}
        self.nodes = ir.nodes_by_name(graph.nodes)
        self.position = {node.name: k for k, node in enumerate(graph.nodes)}
        self.written_by: dict[str, str] = {}
        for node in graph.nodes:
            for view in node.reads():
                self.readers.setdefault(view.buffer.name, set()).add(node.name)
            for buf in ir.written_buffers(node):
                self.written_by[buf.name] = node.name
        self.graph_outputs = graph.results()
        self._memo: dict[frozenset[str], tuple[int, int]] = {}
        self._stored: dict[frozenset[str], list[ir.Buffer]] = {}
        # per node: (view key, elements read through it) for each access (``_accesses``)
        self._access: dict[str, list[tuple[int, int]]] = {}
        self._views: dict[ir.View, int] = {}  # a small key per distinct view, hashed once
        self._view_buffer: list[ir.Buffer] = []  # view key -> its buffer
        self._buffer: dict[str, ir.Buffer] = {}  # a read buffer by name
        self._positions: dict[str, dict[str, int]] = {}
        # per group: the views it reads from outside, with the elements read through each
        self._external: dict[frozenset[str], dict[int, int]] = {}
        self._elements_read: dict[frozenset[str], dict[str, int]] = {}  # ``_elements``
        self._written: dict[str, int] = {}  # bytes each buffer's write costs

    def stored(self, names: Iterable[str]) -> list[ir.Buffer]:
        """Buffers the group writes that must reach memory."""
        group = frozenset(names)
        out = self._stored.get(group)
        if out is None:
            out = []
            for name in sorted(group, key=self.position.__getitem__):  # graph order, not the set's
                for buf in ir.written_buffers(self.nodes[name]):
                    outside = self.readers.get(buf.name, set()) - group
                    if outside or buf.name in self.graph_outputs:
                        out.append(buf)
            self._stored[group] = out
        return list(out)

    def _accesses(self, name: str) -> list[tuple[int, int]]:
        """What node ``name`` reads: (view key, elements read through the view) per access."""
        out = self._access.get(name)
        if out is not None:
            return out
        node = self.nodes[name]
        if isinstance(node, ir.Extern):
            accesses = [(v, v.distinct_elements()) for v in node.reads()]
        else:
            # a gather reads one element per evaluation of its body (of a scatter: per value)
            per = size_hint(node.numel) if isinstance(node, ir.Scatter) else _evaluations(node)
            accesses = [
                (ld.view, ld.view.distinct_elements() if isinstance(ld, ir.Load) else min(size_hint(ld.view.numel), per))
                for ld in ir.node_loads(node)
            ]
        out = []
        for view, count in accesses:
            key = self._views.get(view)
            if key is None:
                key = self._views[view] = len(self._view_buffer)
                self._view_buffer.append(view.buffer)
                self._buffer[view.buffer.name] = view.buffer
            out.append((key, count))
        self._access[name] = out
        return out

    def _external_views(self, group: frozenset[str]) -> dict[int, int]:
        """The views the group reads from outside it: view key -> elements read through it (its
        largest access)."""
        per_view = self._external.get(group)
        if per_view is not None:
            return per_view
        per_view = {}
        written_by, view_buffer = self.written_by, self._view_buffer
        for name in group:
            for key, count in self._accesses(name):
                if written_by.get(view_buffer[key].name) not in group:
                    # a view both loaded whole and gathered (a log-softmax computed at the
                    # gathered positions, next to its row maximum) is read whole, whichever
                    # node the loop meets first
                    if count > per_view.get(key, -1):
                        per_view[key] = count
        self._external[group] = per_view
        return per_view

    def reads(self, names: Iterable[str]) -> dict[str, int]:
        """External buffers the group reads, with the bytes read from each."""
        elements = self._elements(frozenset(names))
        return {name: _read_bytes_of(self._buffer[name], elements[name]) for name in sorted(elements)}

    def positions_read(self, node: ir.Node) -> dict[str, int]:
        """``positions_read(node)`` for a node of the model's graph, computed once."""
        if self.nodes.get(node.name) is not node:  # not one of the graph's nodes: nothing kept
            return positions_read(node)
        out = self._positions.get(node.name)
        if out is None:
            out = self._positions[node.name] = positions_read(node)
        return out

    def traffic(self, names: Iterable[str]) -> tuple[int, int]:
        """(bytes read, bytes written) by a group of nodes run as one kernel."""
        key = frozenset(names)
        if key not in self._memo:
            self._memo[key] = (
                sum(self.reads(key).values()),
                sum(self._written_bytes(b) for b in self.stored(key)),
            )
        return self._memo[key]

    def _written_bytes(self, buf: ir.Buffer) -> int:
        """A buffer's size; a scatter writes only the elements it scatters into its target (which
        the node that wrote the target counts in full)."""
        out = self._written.get(buf.name)
        if out is None:
            node = self.nodes[self.written_by[buf.name]]
            if isinstance(node, ir.Scatter):
                out = min(size_hint(node.numel), size_hint(buf.numel)) * buf.dtype.itemsize
            else:
                out = size_hint(buf.nbytes)
            self._written[buf.name] = out
        return out

    def bytes_saved(self, a: Iterable[str], b: Iterable[str]) -> int:
        first, second = frozenset(a), frozenset(b)
        if first & second:
            union = first | second
            return sum(self.traffic(first)) + sum(self.traffic(second)) - sum(self.traffic(union))
        return self._saved(first, second)

    def _saved(self, first: frozenset[str], second: frozenset[str]) -> int:
        """``bytes_saved`` of two disjoint groups, in time proportional to what the one that reads
        fewer views reads and stores (fusion scores a union for each candidate of a merged group:
        from the union's nodes, a group grown a node at a time costs the square of its nodes, the
        steps of a recurrence traced whole among them).

        Reads: only buffers that group reads and the other reads or writes, and buffers it
        writes that the other reads, are read differently together (module docstring's
        read_bytes, per buffer). Writes: a buffer one group stores and only the other reads is
        not stored together; the other group's such buffers are among those it reads."""
        views, other_views = self._external_views(first), self._external_views(second)
        if len(views) > len(other_views):
            first, second, views, other_views = second, first, other_views, views
        elements, other_elements = self._elements(first), self._elements(second)
        view_buffer, written_by = self._view_buffer, self.written_by
        shared: dict[str, int] = {}  # per buffer both read: the elements of the views both read
        touched: dict[str, ir.Buffer] = {}
        for key, count in views.items():
            buf = view_buffer[key]
            if buf.name in other_elements or written_by.get(buf.name) in second:
                touched[buf.name] = buf
                theirs = other_views.get(key)
                if theirs is not None:
                    shared[buf.name] = shared.get(buf.name, 0) + min(count, theirs)
        mine_stored = self.stored(first)
        for buf in mine_stored:  # written here, read there
            if buf.name in other_elements:
                touched[buf.name] = buf
        saved = 0
        for name, buf in touched.items():
            mine, theirs = elements.get(name, 0), other_elements.get(name, 0)
            saved += _read_bytes_of(buf, mine) + _read_bytes_of(buf, theirs)
            if written_by.get(name) not in first and written_by.get(name) not in second:
                saved -= _read_bytes_of(buf, mine + theirs - shared.get(name, 0))
        theirs_read = [buf for name, buf in touched.items() if written_by.get(name) in second]
        for buf in mine_stored + theirs_read:
            readers = self.readers.get(buf.name, ())
            if buf.name not in self.graph_outputs and all(r in first or r in second for r in readers):
                saved += self._written_bytes(buf)
        return saved

    def _elements(self, group: frozenset[str]) -> dict[str, int]:
        """Per buffer the group reads from outside: the elements read through its views."""
        out = self._elements_read.get(group)
        if out is None:
            out = {}
            view_buffer = self._view_buffer
            for key, count in self._external_views(group).items():
                name = view_buffer[key].name
                out[name] = out.get(name, 0) + count
            self._elements_read[group] = out
        return out


def _read_bytes_of(buf: ir.Buffer, elements: int) -> int:
    """The bytes of reading ``elements`` through a buffer's views: at most the buffer."""
    return min(elements, size_hint(buf.numel)) * buf.dtype.itemsize if elements else 0


def _evaluations(node: ir.Pointwise | ir.Reduction) -> int:
    """How many times a node evaluates its body: once per element, and per reduced position."""
    if isinstance(node, ir.Reduction):
        return size_hint(node.buffer.numel * node.reduction_numel)
    return size_hint(node.buffer.numel)


def graph_floor(graph: ir.IRGraph, readers: Mapping[str, set[str]]) -> int:
    """Each graph input that some node reads, read once, plus each graph output written once
    (and each input written in place, once)."""
    total = sum(size_hint(b.nbytes) for b in graph.input_buffers() if readers.get(b.name))
    outs = {o.buffer.name: o.buffer for o in graph.outputs if isinstance(o, ir.View)}
    outs.update((n.buffer.name, n.buffer) for n in graph.nodes
                if isinstance(n, ir.Pointwise) and n.buffer.name in graph.mutations)
    inputs = {b.name for b in graph.input_buffers()}
    return total + sum(size_hint(b.nbytes) for name, b in outs.items() if name not in inputs)


# The arithmetic a fusion may add per byte of memory traffic it saves, in instructions
# (``instructions.OP_INSTRUCTIONS``: an ``erf`` 33, an addition 1). A kernel evaluates a
# pointwise producer of its own wherever it loads it: a consumer that reads it at K positions (a
# window: a depthwise convolution, a pool, an upsampling) computes it K times per element of its
# own, all but what the positions share (a per-channel scale is the same at each of them, and
# computed once). An H100 or H200 issues about ten instructions in the time it moves a byte, so
# past this many extra instructions per byte saved the fused kernel is bound by its arithmetic
# where the two kernels apart were bound by memory (``recompute.py`` weighs a value read by
# several kernels so too). MobileNetV3's batch norm and hard-swish
# before a 3x3 depthwise convolution of stride 1, in bf16, would add 30 per byte saved (15
# operations at each of 8 more positions, against 4 bytes an element); before a 5x5 one, 90. A
# batch norm and ReLU before ResNet's 3x3 max pool of stride 2 (2.25 reads an element) add
# fewer than 8, and still fuse. Weighed in instructions rather than counted as ops, a SiLU's
# sigmoid (14) keeps more depthwise windows apart from the activation before them: GPU time a
# step on an H200 (bf16, b64, 2026-12-01), TorchVision's MobileNetV3-L 1.65 -> 1.55 ms and
# EfficientNetV2-S 4.30 -> 4.10, timm's EfficientNet-B0 2.60 -> 2.57, transformers' 2.86 -> 2.83.
OPS_PER_BYTE_SAVED = 8

# The most positions a node of a reduction's kernel may read one tensor at. A reduction kernel
# issues a window's loads element by element (their offsets clamp and divide, and carry hints
# of 1: indexing.window_arithmetic), and where its rows are a channels-last tensor's channels
# the lanes of a warp read positions C elements apart. MobileNetV3's last 5x5 depthwise
# convolution (b64, 960 channels, 7x7) fused into its squeeze-and-excitation mean took 1001 us
# on an H100 (bf16, 2026-11-24), against 44 us for the convolution alone as a tiled pointwise
# kernel. A max pool's gradient (4 covering windows of a 3x3 pool of stride 2) stays fused into
# a batch norm's gradient statistics, as measured there (ResNet-50's training step).
MAX_WINDOW_IN_REDUCTION = 8

# From this many positions a producer's own read is a window (a depthwise convolution's taps, a
# pool's), and a window that reads it at several positions does not recompute it: each of the
# outer window's positions would evaluate the inner window's, the taps multiplied (25 x 9 loads
# an element for a 5x5 convolution over a 3x3 one). timm's GhostNet-1.0 (b64, bf16, H200,
# 2026-12-02): a 5x5 depthwise convolution of stride 2 over a ghost module's concatenation,
# whose second half is the module's 3x3 depthwise convolution, evaluated that convolution at
# each of its 25 positions: 2634 us, 61% of the step's GPU time. The concatenation read the
# inner convolution through a gather, which the instruction count took for a load of memory.
NESTED_WINDOW = 4

# From this many evaluations an element a consumer reads a producer broadcast: each of them
# computes the producer's operations again (a kernel's lanes share nothing), and the kernel
# may add at most ``OPS_PER_BYTE_SAVED`` instructions a byte of its own traffic. A window's
# rule weighs the bytes a fusion saves; a broadcast's consumer is larger than its producer, and
# the question is whether its kernel stays bound by memory. Swin's shifted-window mask (nine
# slice assignments into an image of region ids, windows of it, their pairwise differences
# made 0 or -100: 83 instructions an element by ``OP_INSTRUCTIONS``, [64, 49, 49]) was
# evaluated in the attention softmax of every batch and head. torchvision's Swin-T (b64, bf16,
# H200, 2026-12-02): those softmax kernels took 740 us, 666 us with the mask apart (about 2.4e9
# instructions fewer, 80 us at the rate below).
BROADCAST_READS = 2
# Fewer extra instructions than a launch is worth are not worth a kernel of their own: 2**26
# is about 2 us at 3e13 instructions a second (ten a byte at 3.4 TB/s).
LAUNCH_INSTRUCTIONS = 1 << 26


def positions_read(node: ir.Node) -> dict[str, int]:
    """For each buffer ``node`` loads directly (not through a gather): at how many distinct
    indices it does (more than one: a window)."""
    seen: dict[str, set[tuple[ir.View, tuple]]] = {}
    for ld in ir.node_loads(node):
        if isinstance(ld, ir.Load):
            seen.setdefault(ld.view.buffer.name, set()).add((ld.view, tuple(ld.index)))
    return {name: len(indices) for name, indices in seen.items()}


def window_recompute(nodes: Iterable[ir.Node],
                     positions: Callable[[ir.Node], dict[str, int]] = positions_read,
                     kernel_bytes: Callable[[], int] | None = None) -> str | None:
    """Why one kernel of ``nodes`` would compute a producer too many times over (see
    ``OPS_PER_BYTE_SAVED``, and ``BROADCAST_READS`` for a producer a consumer reads broadcast),
    or a window in a reduction's kernel (``MAX_WINDOW_IN_REDUCTION``); None where neither.
    ``positions``: ``positions_read``, or a model's copy that remembers it per node
    (``TrafficModel.positions_read``); ``kernel_bytes``: the bytes the kernel would move (the
    broadcast rule's budget; without it, that rule is not applied)."""
    nodes = list(nodes)
    pointwise = {n.name: n for n in nodes if isinstance(n, ir.Pointwise)}
    if not pointwise:
        return None
    if any(isinstance(n, (ir.Reduction, ir.Scan)) for n in nodes):
        for node in pointwise.values():
            widest = max(positions(node).values(), default=0)
            if widest > MAX_WINDOW_IN_REDUCTION:
                return (f"{node.name} reads a tensor at {widest} positions: a window stays out of reduction kernels "
                        f"(most {MAX_WINDOW_IN_REDUCTION})")
    for node in nodes:
        if not isinstance(node, (ir.Pointwise, ir.Reduction, ir.Scan)):
            continue
        evaluations = size_hint(node.buffer.numel * (node.reduction_numel if isinstance(node, ir.Reduction) else 1))
        for name, count in positions(node).items():
            if name not in pointwise:
                continue
            if count < 2:
                reason = _broadcast_recompute(node, evaluations, pointwise[name], pointwise, kernel_bytes)
                if reason is not None:
                    return reason
                continue
            inner = _inner_window(pointwise[name], pointwise, positions)
            if inner is not None:
                return (f"{node.name} reads {name} at {count} positions, and {name} is computed from {inner}: "
                        "recomputed at each position, the windows' taps would multiply")
            producer = pointwise[name].buffer
            ops = _varying_instructions(pointwise[name], pointwise)
            extra = (count * evaluations - size_hint(producer.numel)) * ops
            saved = 2 * size_hint(producer.numel) * producer.dtype.itemsize  # its write and its read
            if extra > OPS_PER_BYTE_SAVED * saved:
                return (f"{node.name} reads {name} at {count} positions: {ops} instructions an element "
                        f"recomputed, {extra / max(saved, 1):.0f} per byte saved (most {OPS_PER_BYTE_SAVED})")
    return None


def _broadcast_recompute(node: ir.Node, evaluations: int, producer: ir.Pointwise,
                         pointwise: Mapping[str, ir.Pointwise], kernel_bytes: Callable[[], int] | None) -> str | None:
    """Why ``node`` may not evaluate ``producer`` where it reads it broadcast (see
    ``BROADCAST_READS``), or None."""
    size = size_hint(producer.buffer.numel)
    if kernel_bytes is None or evaluations < BROADCAST_READS * size or size <= _lane_extent(node):
        return None
    ops = _lane_instructions(producer, pointwise)
    extra = (evaluations - size) * ops
    moved = kernel_bytes()
    if extra <= max(OPS_PER_BYTE_SAVED * moved, LAUNCH_INSTRUCTIONS):
        return None
    return (f"{node.name} reads {producer.name} broadcast, {evaluations // size}x over its {size} elements: "
            f"{ops} instructions an element evaluated again, {extra / max(moved, 1):.0f} per byte the kernel moves "
            f"(most {OPS_PER_BYTE_SAVED})")


def _lane_extent(node: ir.Node) -> int:
    """The positions along a kernel's fastest axis for ``node``: its reduced positions, or its
    buffer's fastest dim. A producer of no more elements (a per-channel scale beside
    channels-last activations) varies along that axis alone, and a tiled kernel computes it once
    for each column of a block, not in every lane: the broadcast rule leaves it fused."""
    if isinstance(node, ir.Reduction):
        return size_hint(node.reduction_numel)
    sizes = [size_hint(n) for n in node.buffer.sizes]
    strides = [size_hint(n) for n in node.buffer.strides]
    order = indexing.dense_order(sizes, strides)
    return sizes[order[-1]] if order else 1


def _lane_instructions(producer: ir.Pointwise, pointwise: Mapping[str, ir.Pointwise]) -> int:
    """The instructions an element of ``producer``'s distinct operations, through its in-kernel
    producers, that vary across a kernel's lanes: all but those on constants and on tensors
    of one element. Each lane of a kernel that reads ``producer`` broadcast evaluates them."""

    def leaf(e: ir.Expr) -> bool | ir.Expr:
        if isinstance(e, ir.Load):
            inner = pointwise.get(e.view.buffer.name)
            return inner.body if inner is not None else e.view.distinct_elements() > 1
        if isinstance(e, ir.IndirectLoad):
            inner = pointwise.get(e.view.buffer.name)
            return inner.body if inner is not None else True
        return isinstance(e, ir.IndexValue)

    return varying_instructions(producer.body, leaf)


def _inner_window(producer: ir.Pointwise, pointwise: Mapping[str, ir.Pointwise],
                  positions: Callable[[ir.Node], dict[str, int]]) -> str | None:
    """Where ``producer``, or an in-kernel producer it is computed from (read directly or
    through a gather), reads a tensor at ``NESTED_WINDOW`` positions or more: which node reads
    how many; else None."""
    todo, seen = [producer], {producer.name}
    while todo:
        node = todo.pop()
        widest = max(positions(node).values(), default=0)
        if widest >= NESTED_WINDOW:
            return f"{node.name}, a window of {widest} positions"
        for ld in ir.node_loads(node):
            inner = pointwise.get(ld.view.buffer.name)
            if inner is not None and inner.name not in seen:
                seen.add(inner.name)
                todo.append(inner)
    return None


def _one_to_one(elements: int | sympy.Expr, size: int) -> bool:
    """Whether a tensor of ``elements`` read by a node of ``size`` elements varies with it:
    more than 1/``ONE_TO_ONE`` as many elements (its own size, a pad's or a crop's input),
    where fewer are read broadcast (a per-channel value)."""
    return size_hint(elements) * ONE_TO_ONE > size


# A tensor read by a node of N elements varies with the node's elements where it has more than
# N / this many (``_one_to_one``). A zero pad before a depthwise convolution (transformers'
# MobileNetV2 and EfficientNet pad as TensorFlow does) has a few more elements than its input:
# compared with the pad's size, its batch norm and activation counted 0 instructions an
# element, and were evaluated again at each of the convolution's 9 taps. A concatenation's part
# has an eighth to a half of its elements: at 2 the parts counted as read broadcast, and a max
# pool over GoogLeNet's inception outputs evaluated all four branches' batch norms at each of its
# 9 taps (0.55x Inductor, H100, 2026-12-07; 1.42x at 16). A per-channel or per-row value has
# fewer than 1/16 of its reader's elements at every real size.
ONE_TO_ONE = 16


def _varying_instructions(producer: ir.Pointwise, pointwise: Mapping[str, ir.Pointwise]) -> int:
    """The instructions an element of ``producer``'s distinct operations, through its in-kernel
    producers, that depend on a value that varies with its elements: those a window computes
    again at each position (``instructions.OP_INSTRUCTIONS``). A value read from a much smaller
    tensor (a per-channel one, or an in-kernel node of few elements: ``_one_to_one``) is the
    same at every position, and is computed once. A gather varies, and a gather of an
    in-kernel producer (a concatenation of two computed halves) evaluates that producer at its
    positions: its ops count."""
    size = size_hint(producer.buffer.numel)

    def leaf(e: ir.Expr) -> bool | ir.Expr:
        if isinstance(e, (ir.Load, ir.IndirectLoad)):
            inner = pointwise.get(e.view.buffer.name)
            if inner is not None:
                # a gather of an in-kernel producer (a concatenation's part) evaluates it there
                return inner.body if isinstance(e, ir.IndirectLoad) or _one_to_one(inner.buffer.numel, size) else False
            return isinstance(e, ir.IndirectLoad) or _one_to_one(e.view.distinct_elements(), size)
        return False

    return varying_instructions(producer.body, leaf)
