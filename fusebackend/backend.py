"""The Dynamo backend ``fuse``: AOTAutograd in front, ``compile_graph`` behind.

``torch.compile(model, backend="fuse")`` calls ``fuse(gm, example_inputs)``. AOTAutograd traces
forward and backward graphs (functionalized, decomposed with ``decompositions.py``) and hands each
to a ``FusedGraph``. A FusedGraph compiles lazily, on the first call with each input signature
(shapes, strides, dtypes, devices, and the values of int arguments), so dynamic shapes become a
set of static specializations; ``metrics.specialized`` counts them.

If compiling a graph fails, or its first run raises before anything was written, one warning
names the error and the graph runs eagerly from then on: never a wrong answer, and no slower than
eager. A forward or inference graph hands the call back (``RunDynamoGraph``) to the function
``fuse`` returned, which then runs the graph Dynamo gave us, with the original, undecomposed ops:
exactly what eager runs. A backward graph has no such graph to return to and runs AOTAutograd's
decomposed backward graph op by op.
But where eager raises too on a first run's inputs (an index out of range, which a generated
kernel asserts against as eager checks it), eager's error propagates and the graph stays compiled.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition

from fusebackend import aot_cache, attention_masks, cache, cudagraphs, metrics, sizevars, symbolic
from fusebackend.config import config
from fusebackend.decompositions import decomposition_table, whole_ops
from fusebackend.modes import Mode
from fusebackend.pipeline import compile_graph
from fusebackend.signature import SignatureCheck, input_key
from fusebackend.splitting import split_at_failure

class RunDynamoGraph(Exception):
    """A forward or inference graph cannot run compiled: run Dynamo's graph eagerly instead."""


class _Entry:
    def __init__(self, call: Callable[[list[Any]], Any], proven: bool) -> None:
        self.call = call
        self.proven = proven
        self.check: SignatureCheck | None = None  # its signature's fast check, once made
        self.checked = False  # whether that was tried (it may be impossible: None)

    def fast_check(self, args: list[Any]) -> SignatureCheck | None:
        """The fast check of this entry's signature, made from ``args`` the first time."""
        if not self.checked:
            self.check, self.checked = SignatureCheck.make(args), True
        return self.check


class FusedGraph:
    """A graph from AOTAutograd, compiled per input signature; called with a list of inputs."""

    def __init__(self, gm: torch.fx.GraphModule | Callable[[], torch.fx.GraphModule], name: str,
                 to_dynamo_graph: bool = False, user_outputs: int | None = None,
                 digest: str | None = None, mutates: bool | None = None, autotune: bool = False) -> None:
        """``gm`` may be a function that makes the graph, given with its ``cache.module_digest``
        and whether it mutates its inputs (a graph loaded from AOTAutograd's cache): it is then
        made only where it is lowered or run eagerly, not where fuse's cache has it compiled.
        ``autotune``: its kernels time launch configurations (``mode="max-autotune"``)."""
        # Called with one list of inputs that it may clear (AOTAutograd's boxed convention); an
        # instance attribute, so that wrappers made with functools.wraps carry it too.
        self._boxed_call = True
        self._gm = gm if isinstance(gm, torch.fx.GraphModule) else None
        self._make_gm = None if self._gm is not None else gm
        self.digest = digest
        self.name = name
        # On failure: hand the call back to Dynamo's graph (forward and inference graphs), or
        # run this graph's own ATen ops one by one (backward graphs)
        self.to_dynamo_graph = to_dynamo_graph
        # how many first outputs the user sees (a forward graph's others are saved for backward)
        self.user_outputs = user_outputs
        self.cache: dict[tuple, _Entry] = {}
        # the last signature that ran, checked without building its key (signature.py)
        self.fast: tuple[SignatureCheck, _Entry] | None = None
        self.mutates = mutates if mutates is not None else graph_mutates(self.gm)
        self.autotune = autotune
        self.symbolic_tried = False  # one compile for all sizes was attempted (config.symbolic)
        self.symbolic_call: Callable[[list[Any]], Any] | None = None  # and made: it serves each signature that fits

    @property
    def gm(self) -> torch.fx.GraphModule:
        if self._gm is None:
            self._gm = self._make_gm()
        return self._gm

    def graph_digest(self) -> str | None:
        """The graph's ``cache.module_digest``, made once, before the first lowering rewrites the
        graph in place (``lowering.lower``'s passes): every compile's key, one per signature and
        the symbolic one, names the graph as AOTAutograd's cache saved it, so that a warm
        process, handed that digest, finds each of them. None where fuse's cache is off."""
        if self.digest is None and config.graph_cache:
            self.digest = cache.module_digest(self.gm)
        return self.digest

    def _eager(self, args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()
        return self.gm(*inputs)

    def _fall_back(self, key: tuple, what: str, exc: BaseException) -> _Entry:
        how = "Dynamo's graph" if self.to_dynamo_graph else "this graph's ATen ops"
        warnings.warn(
            f"fusebackend: {what} graph {self.name} failed ({type(exc).__name__}: {exc}); "
            f"running {how} eagerly",
            stacklevel=3,
        )
        metrics.eager_graphs += 1
        if self.to_dynamo_graph:
            raise RunDynamoGraph(self.name) from exc
        entry = _Entry(self._eager, True)
        self.cache[key] = entry
        return entry

    def _specialized(self) -> None:
        """Count this graph's compiles for more than one input signature; warn once at
        ``config.specialization_warning`` of them (a server whose sizes change with every
        request would otherwise compile without end, silently)."""
        count = len({id(entry.call) for entry in self.cache.values()})  # a compile for all sizes counts once
        names = symbolic.symbols(self.gm)  # the graph's traced values keep their symbols (lowering adds no guard)
        metrics.specialized[self.name] = (count, names)
        if count == config.specialization_warning:
            symbols = f" (its sizes {', '.join(names)} are symbolic in Dynamo's graph)" if names else ""
            warnings.warn(f"fusebackend: graph {self.name} has been compiled for {count} input shapes{symbols}; "
                          "fuse compiles a graph once per shape (metrics.specialized counts them)", stacklevel=4)

    def _compile_symbolic(self, args: list[Any]) -> None:
        """Try one compile for every size of a graph whose sizes Dynamo made symbolic
        (``config.symbolic`` not "off"), once: it then serves every call whose inputs have the traced
        sizes, strides and dtypes at some value of the symbols (``symbolic.fits``). Where it
        cannot be made, ``metrics.not_symbolic`` says why and the graph is compiled per shape."""
        self.symbolic_tried = True
        if not symbolic.symbols(self.gm):
            return
        try:
            compiled = compile_graph(lambda: self.gm, args, self.name, self.user_outputs, self.graph_digest(),
                                     self.autotune,
                                     symbolic_sizes=True)
            self.symbolic_call = compiled.call
        except sizevars.NotSymbolic as exc:
            metrics.not_symbolic[self.name] = str(exc)
        except Exception as exc:  # a fault of the symbolic track: said, and the graph compiled per shape
            metrics.not_symbolic[self.name] = f"failed: {type(exc).__name__}: {exc}"
            warnings.warn(f"fusebackend: the symbolic compile of graph {self.name} failed ({type(exc).__name__}: "
                          f"{exc}); it is compiled per shape", stacklevel=3)

    def __call__(self, *call_args: Any) -> Any:
        # AOTAutograd calls boxed (one list it lets us clear) or, through some wrappers, unboxed.
        args = call_args[0] if len(call_args) == 1 and isinstance(call_args[0], list) else list(call_args)
        fast = self.fast
        if fast is not None and fast[0].matches(args):
            return fast[1].call(args)
        key = input_key(args)
        entry = self.cache.get(key)
        if entry is None:
            if config.symbolic != "off" and not self.symbolic_tried:
                self._compile_symbolic(args)
        if entry is None and self.symbolic_call is not None and symbolic.fits(self.gm, args):
            # the compile for every size serves this signature; an entry of its own holds the
            # signature's fast check (a check made at another size would fail every call)
            entry = self.cache[key] = _Entry(self.symbolic_call, False)
        if entry is None:
            try:
                suffix = f"_{len(self.cache)}" if self.cache else ""
                compiled = compile_graph(lambda: self.gm, args, self.name + suffix, self.user_outputs,
                                         self.graph_digest(), self.autotune)
                entry = _Entry(compiled.call, False)
                self.cache[key] = entry
                if len(self.cache) > 1:  # another shape (or layout) of this graph: a specialization
                    self._specialized()
            except Exception as exc:  # any compile failure: the graph still runs, eagerly
                entry = self._fall_back(key, "compiling", exc)
        check = entry.fast_check(args)  # before the call, which may clear args
        if entry.proven:
            self.fast = (check, entry) if check is not None else None
            return entry.call(args)
        saved = list(args)
        try:
            out = entry.call(args)
        except Exception as exc:
            if self.mutates:
                raise  # inputs may already be changed: a rerun could be wrong
            # Eager raises too (an index out of range, say): the inputs are at fault, not the
            # compiled graph, which stays compiled, unproven; eager's error reaches the caller.
            out = self._eager(saved)
            self._fall_back(key, "running", exc)
            return out
        entry.proven = True
        self.fast = (check, entry) if check is not None else None
        return out


def graph_mutates(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph writes to any of its inputs (a mutable ATen op)."""
    return any(
        isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


class _Captures:
    """The CUDA graph plans (``cudagraphs.plan``) of one Dynamo graph's forward and backward: a
    backward is captured only where its forward is."""

    def __init__(self, mode: Mode, dynamo_inputs: int) -> None:
        self.mode = mode
        self.dynamo_inputs = dynamo_inputs
        self.forward: cudagraphs.Capture | None = None

    def plan(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> cudagraphs.Capture | None:
        if not self.mode.cudagraphs:
            return None
        capture = cudagraphs.plan(gm, example_inputs, kind, self.dynamo_inputs,
                                  self.forward if kind == "backward" else None)
        if kind == "forward":
            self.forward = capture
        return capture


def _compiler(kind: str, captures: _Captures) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Any]:
    def compile_fn(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> aot_cache.FuseGraphCode:
        user_outputs = _forward_returns() if kind == "forward" else None
        graph = FusedGraph(gm, aot_cache.graph_name(kind), to_dynamo_graph=kind != "backward",
                           user_outputs=user_outputs, autotune=captures.mode.autotune)
        return aot_cache.FuseGraphCode(graph, kind, captures.mode, captures.plan(gm, example_inputs, kind),
                                       load=FusedGraph)

    # AOTAutograd's cache keeps the graph (aot_cache.py); a FusedGraph compiles when first called
    return aot_cache.serializable(compile_fn)


def _forward_returns() -> int | None:
    """How many of the forward graph being compiled's first outputs the user sees (mutated
    inputs, the model's outputs, their bases); the rest are saved for the backward graph. From
    AOTAutograd's metadata for the graph; None where it is not there (all are the user's)."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    returns = getattr(meta, "num_forward_returns", None)
    return returns if isinstance(returns, int) else None


class _DynamoGraphOnFailure:
    """What ``fuse`` returns: AOTAutograd's compiled function, or Dynamo's graph once one of its
    forward or inference graphs could not run compiled (``RunDynamoGraph``)."""

    def __init__(self, gm: torch.fx.GraphModule, compiled: Callable[..., Any]) -> None:
        self.gm = gm
        self.compiled: Callable[..., Any] | None = compiled

    def __call__(self, *args: Any) -> Any:
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except RunDynamoGraph:
                self.compiled = None  # the warning named the error; eager from now on
        return self.gm(*args)


def _dynamo_breaks_at(exc: Exception) -> bool:
    """Whether Dynamo, handed ``exc`` from the backend, breaks its graph and compiles the parts:
    an op whose output's shape or value the data decides (``nonzero`` in the backward of a
    boolean-mask assignment, ``x[mask] = v``), which AOTAutograd cannot trace ahead of the values
    and which no single node of Dynamo's graph names (so ``split_at_failure`` cannot cut
    there). Dynamo takes these (``exceptions_allowed_to_be_fallback``) as a graph break, as for
    Inductor, except in a frame with a user's ``allow_in_graph`` function, where it would raise
    to the user instead: there the graph runs eagerly."""
    allowed = getattr(torch._dynamo.exc, "exceptions_allowed_to_be_fallback", ())
    if not isinstance(exc, allowed):
        return False
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
    except Exception:  # not inside Dynamo's frame compile: nothing to break
        return False
    return tx is not None and not getattr(tx.output, "has_user_defined_allowed_in_graph", True)


def _eager_after_warning(gm: torch.fx.GraphModule, exc: Exception) -> Callable[..., Any]:
    warnings.warn(
        f"fusebackend: tracing the graph with AOTAutograd failed ({type(exc).__name__}: {exc}); "
        "running Dynamo's graph eagerly",
        stacklevel=2,
    )
    metrics.eager_graphs += 1
    return gm


def fuse(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
         options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The ``torch.compile`` backend: ``torch.compile(model, backend="fuse")``, with ``mode`` and
    ``options`` as ``torch.compile`` passes them (``modes.py``)."""
    parsed = Mode.parse(mode, options)  # an unknown mode or option raises here
    attention_masks.drop_constant_masks(gm)  # before tracing picks each attention's kernel
    try:
        # upsampling reaches the graphs as ops (decompositions.py); AOTAutograd's result may
        # come from its cache (aot_cache.py)
        with whole_ops(), _tokens_in_graph(), aot_cache.enabled(parsed), metrics.timed("aot"):
            compiled = _aot_backend(_Captures(parsed, len(example_inputs)))(gm, example_inputs)
    except torch._dynamo.exc.TorchDynamoException:
        raise  # Dynamo's own control flow (restarting an analysis)
    except Exception as exc:  # AOTAutograd could not trace it
        # the op that failed runs alone, eagerly; the graph around it is still compiled
        split = split_at_failure(gm, exc, functools.partial(fuse, mode=mode, options=options))
        if split is not None:
            return split
        if _dynamo_breaks_at(exc):
            raise  # Dynamo breaks the graph where the values decide shapes and compiles the rest
        return _eager_after_warning(gm, exc)
    # not traced by Dynamo when called from the code it generated (as AOTAutograd's result isn't)
    return torch._dynamo.disable(_DynamoGraphOnFailure(gm, compiled))


def _tokens_in_graph() -> Any:
    """AOTAutograd's effect tokens (which order effectful calls, such as a linalg op's error
    check) made and consumed inside each graph, as Inductor has them, not passed in and returned.
    AOTAutograd's cache assumes this: a graph loaded from it is called without the tokens that a
    graph compiled in the process is called with, so a graph that took them as inputs would
    fail its first warm call and run eagerly."""
    return torch._functorch.config.patch(unlift_effect_tokens=True)


def _aot_backend(captures: _Captures) -> Callable[..., Any]:
    return aot_autograd(
        fw_compiler=_compiler("forward", captures),
        bw_compiler=_compiler("backward", captures),
        inference_compiler=_compiler("inference", captures),
        decompositions=decomposition_table(),
        partition_fn=_partition,
        # copy_ into inputs that need no gradient (batch norm's running statistics) stays in the
        # graph, where the kernel that computes the new value writes it in place
        keep_inference_input_mutations=True,
    )


def _partition(joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """AOTAutograd's min-cut partitioner, on the joint graph without its no-op nodes (Inductor's
    ``remove_noop_ops``, which Inductor runs on its joint graphs too: aliases, clones and
    conversions to the same layout and dtype, where that makes no output an input's alias).

    A no-op node is the tensor it reads under another name, and the partitioner saw two tensors
    where there is one: in Llama's blocks it saved both the attention output's alias (for the
    attention backward) and the copy that a transpose and reshape of it made, 8 MiB more per
    block at b4 s512 than Inductor's blocks (FSDP2 over two H100s, 2026-11-25); in DeBERTa's
    attention both the probabilities and a clone of them for the product with the values."""
    from torch._inductor.fx_passes.post_grad import remove_noop_ops

    remove_noop_ops(joint.graph)
    joint.recompile()
    return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
