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

from typing import Iterable, Mapping

from fusebackend import ir


# A kernel that moves this little (1 MiB: about a quarter of a microsecond at an H200's copy
# bandwidth) takes less time than its launch and the gap before it (microseconds).
SMALL_KERNEL_BYTES = 1 << 20


class TrafficModel:
    """Who reads each buffer, so that a group's traffic can be computed from its node names."""

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

    def stored(self, names: Iterable[str]) -> list[ir.Buffer]:
        """Buffers the group writes that must reach memory."""
        group = set(names)
        out = []
        for name in sorted(group, key=self.position.__getitem__):  # graph order, not the set's
            for buf in ir.written_buffers(self.nodes[name]):
                outside = self.readers.get(buf.name, set()) - group
                if outside or buf.name in self.graph_outputs:
                    out.append(buf)
        return out

    def reads(self, names: Iterable[str]) -> dict[str, int]:
        """External buffers the group reads, with the bytes read from each."""
        group = set(names)
        per_view: dict[ir.View, int] = {}  # elements read through each view: its largest access
        for name in group:
            node = self.nodes[name]
            if isinstance(node, ir.Extern):
                accesses = [(v, v.distinct_elements()) for v in node.reads()]
            else:
                # a gather reads one element per evaluation of its body (of a scatter: per value)
                per = node.numel if isinstance(node, ir.Scatter) else _evaluations(node)
                accesses = [
                    (ld.view, ld.view.distinct_elements() if isinstance(ld, ir.Load) else min(ld.view.numel, per))
                    for ld in ir.node_loads(node)
                ]
            for view, count in accesses:
                if self.written_by.get(view.buffer.name) not in group:
                    # a view both loaded whole and gathered (a log-softmax computed at the
                    # gathered positions, next to its row maximum) is read whole, whichever
                    # node the loop meets first
                    per_view[view] = max(per_view.get(view, 0), count)
        elements: dict[str, int] = {}
        buffers: dict[str, ir.Buffer] = {}
        for view, count in sorted(per_view.items(), key=lambda vc: vc[0].buffer.name):
            buffers[view.buffer.name] = view.buffer
            elements[view.buffer.name] = elements.get(view.buffer.name, 0) + count
        return {k: min(n, buffers[k].numel) * buffers[k].dtype.itemsize for k, n in elements.items()}

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
        node = self.nodes[self.written_by[buf.name]]
        if isinstance(node, ir.Scatter):
            return min(node.numel, buf.numel) * buf.dtype.itemsize
        return buf.nbytes

    def bytes_saved(self, a: Iterable[str], b: Iterable[str]) -> int:
        a, b = list(a), list(b)
        return sum(self.traffic(a)) + sum(self.traffic(b)) - sum(self.traffic(a + b))


def _evaluations(node: ir.Pointwise | ir.Reduction) -> int:
    """How many times a node evaluates its body: once per element, and per reduced position."""
    if isinstance(node, ir.Reduction):
        return node.buffer.numel * node.reduction_numel
    return node.buffer.numel


def graph_floor(graph: ir.IRGraph, readers: Mapping[str, set[str]]) -> int:
    """Each graph input that some node reads, read once, plus each graph output written once
    (and each input written in place, once)."""
    total = sum(b.nbytes for b in graph.input_buffers() if readers.get(b.name))
    outs = {o.buffer.name: o.buffer for o in graph.outputs if isinstance(o, ir.View)}
    outs.update((n.buffer.name, n.buffer) for n in graph.nodes
                if isinstance(n, ir.Pointwise) and n.buffer.name in graph.mutations)
    inputs = {b.name for b in graph.input_buffers()}
    return total + sum(b.nbytes for name, b in outs.items() if name not in inputs)
