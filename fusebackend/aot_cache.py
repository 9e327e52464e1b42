"""AOTAutograd's half of a warm start: PyTorch's AOTAutograd cache, holding fuse's graphs.

A second process that compiles a model Dynamo has traced before need not have AOTAutograd trace,
functionalize, decompose and partition it again. PyTorch's AOTAutograd cache
(``torch._functorch._aot_autograd.autograd_cache``) keeps what AOTAutograd made of a Dynamo graph
(its runtime metadata and wrappers, and the compiled forward and backward) under a key of the
Dynamo graph, its inputs and the compile configuration. Inductor's graphs go into an entry by
reference to Inductor's own cache; another backend's go in "bundled": the compiled object, an
``OutputCode``, is pickled into the entry. fuse's is ``FuseGraphCode``: the ATen graph
AOTAutograd handed to fuse, with each node's traced value (``torch.fx._graph_pickler``) and
source name (``provenance.py``), and how it is to be compiled. Loaded, it is a
``backend.FusedGraph`` again (made by the ``GraphLoader`` the backend handed the
``FuseGraphCode``), whose first call finds its kernels in fuse's own cache (``cache.py``) by the
graph's digest, without unpickling the graph, or unpickles and compiles it.

AOTAutograd's entries are in Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``, its
``aotautograd`` folder), not in fuse's. fuse's versions and options are added to AOTAutograd's key
through ``torch.compiler.config.cache_key_tag``: an entry of Inductor's is never taken for
fuse's, nor one written by another fusebackend. ``FUSE_GRAPH_CACHE=0`` turns this cache off with
fuse's own; so do PyTorch's switches for its caches (``TORCHINDUCTOR_AUTOGRAD_CACHE=0``,
``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``). A graph AOTAutograd will not cache (its key cannot be
made) is traced as without the cache.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import pickle
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
import torch.fx
from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
from torch._inductor.output_code import OutputCode

from fusebackend import cache, cudagraphs, metrics, provenance
from fusebackend.config import config
from fusebackend.modes import Mode

_graph_ids = itertools.count()


def graph_name(kind: str) -> str:
    """A new graph's name: its kind and a number unique in this process."""
    return f"{kind}_{next(_graph_ids)}"


class GraphLoader(Protocol):
    """What makes a graph again after a cache hit (``backend.FusedGraph``): given a function that
    makes the ATen graph, with its digest and whether it mutates an input, it returns the object
    AOTAutograd calls with a list of inputs. The backend hands it to ``FuseGraphCode``, so that
    this module need not import the backend; it travels in a cache entry by reference, so it is
    a module-level name (a class or function)."""

    def __call__(self, gm: Callable[[], torch.fx.GraphModule], name: str, *, to_dynamo_graph: bool,
                 user_outputs: int | None, digest: str | None, mutates: bool | None, autotune: bool) -> Any: ...


class FuseGraphCode(OutputCode):
    """What AOTAutograd gets from fuse for one of its graphs: a ``FusedGraph`` (it calls this
    object with a list of inputs), its CUDA graph plan in reduce-overhead mode, and what an
    AOTAutograd cache entry keeps of them. ``load`` makes the graph again from a serialized copy."""

    def __init__(self, graph: Any, kind: str, mode: Mode, capture: cudagraphs.Capture | None,
                 load: GraphLoader) -> None:
        self.graph = graph  # backend.FusedGraph; None in a serialized copy
        self.load = load  # backend.FusedGraph: what post_compile makes the graph with
        self.kind = kind  # forward, backward or inference
        self.mode = mode  # torch.compile's mode and options (modes.py)
        self.capture = capture  # how its calls are recorded (cudagraphs.py); None: never
        self.user_outputs: int | None = graph.user_outputs
        # in a serialized copy: the ATen graph as bytes, its share of fuse's cache key, and
        # whether it mutates an input (what FusedGraph needs before it has the graph)
        self.pickled_gm: bytes | None = None
        self.digest: str | None = None
        self.mutates: bool | None = None
        self._boxed_call = True  # called with one list of inputs (AOTAutograd's boxed convention)
        self._call: Callable[[list[Any]], Any] | None = None
        self._arm()

    def _arm(self) -> None:
        """What a call runs: the graph, or its CUDA graph replays (``cudagraphs.wrap``)."""
        self._call = self.graph if self.capture is None else cudagraphs.wrap(self.graph, self.capture, self.graph.name)

    def __call__(self, inputs: list[Any]) -> Any:
        return self._call(inputs)

    def prepare_for_serialization(self) -> None:
        """Called on a copy before AOTAutograd pickles it: the graph as bytes, with each node's
        traced value (``FusedGraph`` lowers from it and ``cache.module_digest`` hashes it)."""
        gm = self.graph.gm
        # called while AOTAutograd's fake mode is on: the graph's constants are real tensors
        with torch.utils._python_dispatch._disable_current_modes():
            self.pickled_gm = _pickle_graph(gm)
            # the graph's digest, made once for this copy and the graph it copies (whose first
            # compile would make it again)
            self.digest = self.graph.graph_digest() or cache.module_digest(gm)
        self.mutates = self.graph.mutates
        self.graph = None
        self._call = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        """Called after a cache hit: a ``FusedGraph`` again. It unpickles the graph only where
        it needs it: where fuse's cache has it compiled, its first call loads the kernels by the
        digest alone."""
        if self.graph is not None:
            return
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()
        pickled, self.pickled_gm = self.pickled_gm, None

        def make_gm() -> torch.fx.GraphModule:
            from torch.fx._graph_pickler import GraphPickler

            graph, constants, sources = pickle.loads(pickled)
            gm = GraphPickler.loads(graph, fake_mode)
            assert isinstance(gm, torch.fx.GraphModule)
            for target, (value, device) in constants.items():
                _set_attribute(gm, target, value.to(device))
            for node in gm.graph.nodes:
                if node.name in sources:
                    node.meta[provenance.SOURCE] = sources[node.name]
            gm.recompile()  # GraphPickler's module has no forward: run eagerly (a fallback), it needs one
            return gm

        self.graph = self.load(make_gm, graph_name(self.kind), to_dynamo_graph=self.kind != "backward",
                               user_outputs=self.user_outputs, digest=self.digest, mutates=self.mutates,
                               autotune=self.mode.autotune)
        self._arm()
        metrics.aot_cache_hits += self.kind != "backward"  # one per Dynamo graph

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass  # the kernels' binaries are in Triton's own cache


# ATen's ops, the prims fuse's decompositions use, and the functional collectives a graph under
# torch.distributed holds (named by their process group, as Inductor's generated code names them)
_PICKLED_OPS = ("torch.ops.aten", "torch.ops.prims", "torch.ops._c10d_functional")


def _pickle_graph(gm: torch.fx.GraphModule) -> bytes:
    """The graph with its nodes' traced values (``torch.fx._graph_pickler``), its constant
    tensors beside it (GraphPickler keeps a tensor's description, not its values: it is made for
    graphs of fake tensors), and each node's source name (``provenance.py``), where its
    ``from_node`` chain, which would take more room than the rest, is not kept."""
    from torch.fx._graph_pickler import GraphPickler, Options

    constants = _constant_tensors(gm)
    saved = {target: (value.detach().cpu(), str(value.device)) for target, value in constants.items()}
    for target in constants:
        _set_attribute(gm, target, None)
    shared = _share_values(gm)
    try:
        # (the prims include a max pool's window offsets, registered by
        # ``torch._inductor.inductor_prims``, which fuse imports before loading)
        graph = GraphPickler.dumps(gm, Options(node_metadata_key_filter=lambda key: key == "val",
                                               ops_filter=lambda name: name.startswith(_PICKLED_OPS)))
    finally:
        for target, value in constants.items():
            _set_attribute(gm, target, value)
        for node, value in shared.items():
            node.meta["val"] = value
    sources = {n.name: name for n in gm.graph.nodes if (name := provenance.source_name(n)) is not None}
    return pickle.dumps((graph, saved, sources))


def _share_values(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, Any]:
    """Gives each node whose traced value is another node's under another name that node's value
    object, for the pickling; returns the values it replaced, to put back.

    An item of a list result (``getitem``) and an input's ``copy_`` are traced as tensors of their
    own, with the same sizes, strides and storage as the list's item and the input. GraphPickler
    describes each tensor object it meets, and pickles an object it has met as a reference: an
    optimizer step over 1000 tensors has 19000 items and 4000 copies, half the tensors of its
    graph (the pickling was 9 s of a 58 s first call on the CPU)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    def same(a: Any, b: Any) -> bool:
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a is not b
                and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
                and a.device == b.device and a.storage_offset() == b.storage_offset()
                and a.requires_grad == b.requires_grad
                and StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage()))

    replaced: dict[torch.fx.Node, Any] = {}
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            items = node.args[0].meta.get("val")
            other = items[node.args[1]] if isinstance(items, (list, tuple)) and type(node.args[1]) is int \
                and 0 <= node.args[1] < len(items) else None
        elif node.target is torch.ops.aten.copy_.default and isinstance(node.args[0], torch.fx.Node):
            other = node.args[0].meta.get("val")
        else:
            continue
        if same(value, other):
            replaced[node] = value
            node.meta["val"] = other
    return replaced


def _constant_tensors(gm: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    """The tensors the graph reads with get_attr, by target."""
    found = {str(node.target): cache.attribute(gm, str(node.target)) for node in gm.graph.nodes if node.op == "get_attr"}
    return {target: value for target, value in found.items() if isinstance(value, torch.Tensor)}


def _set_attribute(gm: torch.nn.Module, target: str, value: Any) -> None:
    *path, name = target.split(".")
    owner: Any = gm
    for part in path:
        owner = getattr(owner, part)
    if isinstance(value, torch.Tensor) and name in owner._buffers:
        owner._buffers[name] = value
    else:
        setattr(owner, name, value)


def serializable(compile_fn: Callable[[torch.fx.GraphModule, Sequence[Any]], FuseGraphCode]) -> Callable[..., Any]:
    """``compile_fn`` (which makes a ``FuseGraphCode``) as AOTAutograd's cache takes a compiler."""
    return SerializableAOTDispatchCompiler(FuseGraphCode, compile_fn)


@contextlib.contextmanager
def enabled(mode: Mode) -> Iterator[None]:
    """Around AOTAutograd's call: its cache on (unless fuse's is off), in bundled form, under a key
    with fuse's versions, options and ``mode``."""
    if not config.graph_cache:
        yield
        return
    tag = torch.compiler.config.cache_key_tag
    fuse_tag = f"fusebackend {cache.options_digest()} {mode.tag()}".rstrip()
    with torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
            torch.compiler.config.patch(cache_key_tag=f"{tag} {fuse_tag}" if tag else fuse_tag):
        yield
