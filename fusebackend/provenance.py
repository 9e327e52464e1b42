"""Which lines of the model a generated kernel computes: each kernel's *source nodes*.

Dynamo hands a backend one FX graph per captured frame, its nodes named after the model's
variables and modules (``gelu``, ``l__self___linear``, ``y_1``). AOTAutograd retraces it into
ATen graphs and records, on each ATen node, the Dynamo node it came from
(``node.meta["from_node"]``: a list of ``torch.fx.traceback.NodeSource``, each with its own
``from_node`` chain). ``source_name`` takes ``from_node[0].name``, the name Inductor writes above
each of its kernels (``# Topologically Sorted Source Nodes: [y_1, layer_norm]``, from
``torch._inductor.utils.get_kernel_metadata``). In the graphs AOTAutograd hands fuse that first
link is the Dynamo graph's node, the root of the chain (torch 2.13, checked by
``tests/test_audit_sources.py`` against Inductor's names for the same model); taking the link
Inductor takes keeps the two compilers' names comparable should a version add links.

Nodes AOTAutograd made for the backward pass have no ``from_node``. Inductor names those by their
own node names (``mul_12``), which are numbered in each compiler's own joint graph (their
decompositions differ) and so do not compare between compilers: such nodes have no source
here. A backward kernel names only the forward nodes it recomputes.

``GraphLowering`` records each IR node's source (``IRGraph.sources``: IR node name -> source
name); ``kernel_sources`` gathers a kernel's, with those of the nodes the scheduler recomputed
inside it; ``KernelPlan.sources`` carries them to the schedule report and to
``CompiledArtifacts.sources``. They are not in kernel sources: a kernel's text decides which
kernels share a function (``kernels/runtime.kernel_identity``), and the same block of every
layer should share one.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch.fx

from fusebackend import ir


# where a graph loaded from AOTAutograd's cache keeps its nodes' source names: fuse pickles
# those alone, not the ``from_node`` chains (``aot_cache._pickle_graph``)
SOURCE = "fuse_source_name"


def source_name(node: torch.fx.Node) -> str | None:
    """The Dynamo graph's node an ATen node comes from, by name, as Inductor names it; None
    where AOTAutograd recorded none (a backward node, a node a pass added)."""
    origins = node.meta.get("from_node")
    if not origins:
        return node.meta.get(SOURCE)
    return getattr(origins[0], "name", None)


def kernel_sources(nodes: Iterable[ir.Node], sources: Mapping[str, str],
                   producers: Mapping[str, ir.Node]) -> tuple[tuple[str, ...], int]:
    """The source names of what a kernel computes, each once, in its nodes' order, and how many
    of its nodes have none.

    A kernel node that recomputes others (``recomputes``: the scheduler substituted their
    expansions into its body, ``scheduler/recompute.py``) computes them too, and every pointwise
    node their expansions went through: all that lies between a recomputed node and the
    buffers the kernel node still loads. ``producers``: the graph's nodes by name, with those
    the scheduler folded into their readers as they were before."""
    names: dict[str, None] = {}
    missing = 0
    seen: set[str] = set()

    def add(node: ir.Node) -> None:
        source = sources.get(node.name)
        if source is not None:
            names.setdefault(source)

    def expand(name: str, leaves: set[str]) -> None:
        node = producers.get(name)
        if name in seen or not isinstance(node, ir.Pointwise):
            return
        seen.add(name)
        for read in node.reads():
            if read.buffer.name not in leaves:
                expand(read.buffer.name, leaves)
        for entry in node.recomputes:
            expand(entry.split(" ", 1)[0], leaves)
        add(node)

    for node in nodes:
        seen.add(node.name)
        leaves = {read.buffer.name for read in node.reads()}
        for entry in getattr(node, "recomputes", ()):  # "buf4 (aten.mul.Tensor)"
            expand(entry.split(" ", 1)[0], leaves)
        add(node)
        missing += node.name not in sources
    return tuple(names), missing
