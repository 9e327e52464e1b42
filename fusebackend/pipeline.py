"""``compile_graph``: the whole path from an ATen FX graph to a runnable function, one stage a line."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import torch

from fusebackend import cache, checking, codegen, dump, ir, lowering, metrics, scheduler, sizevars, symbolic
from fusebackend.config import config, use_interpreter
from fusebackend.kernels import autotune, precompile, runtime
from fusebackend.lowering import foreach_lists
from fusebackend.lowering.mutations import order_hazards


@dataclasses.dataclass
class CompiledGraph:
    call: Callable[[list[Any]], Any]
    artifacts: dump.CompiledArtifacts


def compile_graph(gm: torch.fx.GraphModule | Callable[[], torch.fx.GraphModule], args: Sequence[Any], name: str,
                  user_outputs: int | None = None, digest: str | None = None, autotune: bool = False,
                  symbolic_sizes: bool = False) -> CompiledGraph:
    """Compile ``gm`` for the concrete metadata of ``args`` (tensors and ints); the first
    ``user_outputs`` outputs (all where None) are the user's, in eager's layouts. A graph compiled
    before, by this process or another, is loaded from the on-disk cache (``cache.py``).

    ``gm`` may be a function that returns the graph, and ``digest`` its ``cache.module_digest``
    (a graph from AOTAutograd's cache, ``aot_cache.py``): the graph is then only made where it
    is lowered or checked, not for a hit. ``autotune``: kernels carry other launch configurations
    and keep the fastest at their first call (``mode="max-autotune"``, ``kernels/autotune.py``).
    ``symbolic_sizes``: for every value of the graph's symbolic sizes, ``args`` giving one;
    raises ``sizevars.NotSymbolic`` where it cannot be (``lowering/symbolic_sizes.py``)."""
    if symbolic_sizes and autotune:
        raise sizevars.NotSymbolic("max-autotune times each kernel's launch configurations at one size")
    seconds: dict[str, float] = {}
    with metrics.timed("cache", seconds):  # the key, and the entry under it if there is one
        key = cache.key_or_none(digest or _module(gm), args, user_outputs, autotune,
                                symbolic_sizes) if config.graph_cache else None
        entry = cache.load(key) if key is not None else None
    if entry is not None:
        try:
            compiled = _ready(entry, gm, name, seconds, cached=True)
        except Exception as exc:  # an entry that reads but does not load: compiled again
            cache.report_corrupt(cache.entry_path(key), exc)
        else:
            metrics.cache_hits += 1
            metrics.fallbacks.update(entry.fallbacks)
            metrics.warm_stage_seconds.update(seconds)
            return compiled
    fallbacks_before = collections.Counter(metrics.fallbacks)
    # the processes that compile kernels start (importing Triton) while this graph is lowered
    precompile.start_compile_workers(next((a.device for a in args if isinstance(a, torch.Tensor)), None))
    # heuristics read symbolic sizes at this call's (sizevars.size_hint)
    with sizevars.hinted(symbolic.binding(_module(gm), args) if symbolic_sizes else {}), \
            sizevars.noting_declines(strict=symbolic_sizes and config.symbolic == "auto") as declined:
        gm = _module(gm)
        copied: frozenset[str] = frozenset()
        while True:
            with metrics.timed("lower", seconds):  # ATen ops -> IR nodes; views -> index expressions
                graph, moved = lowering.lower(gm, args, name, user_outputs, symbolic_sizes, copied, autotune)
            _check_device(graph.device)
            with metrics.timed("verify", seconds):  # the IR's invariants
                ir.verify(graph)
            with metrics.timed("schedule", seconds):  # fusion groups by bytes saved, in execution order
                sched = scheduler.schedule(graph)
            # an input written in place that a later kernel reads: lowered again, ATen copies it
            hazards = order_hazards(sched.steps, graph)
            if not hazards:
                break
            copied |= hazards
        with metrics.timed("codegen", seconds):  # Triton source per group, Python wrapper per graph
            kernels = codegen.generate_all(sched, runtime.use_pdl(graph.device), tune=autotune)
            wrapper = codegen.generate_wrapper(sched, kernels, moved, observe=config.check_kernels)
    dtypes = _buffer_dtypes(graph)
    entry = cache.Entry(
        name=name,
        device=str(graph.device),
        wrapper=wrapper.source,
        constants=wrapper.constants,
        kernels=[cache.KernelRecord(k.name, k.source, k.grid, k.launch, tuple(dtypes[a] for a in k.args), k.sizes,
                                    tuple((v.source, v.grid, v.launch) for v in k.variants), k.written(),
                                    k.short_rows)
                 for k in kernels],
        texts={"aten_graph": gm.code, "ir": str(graph), "fused_ir": _fused_ir(sched, kernels),
               "schedule": f"{sched.report()}\n{wrapper.memory}"
                           + "".join(f"\nnot made over symbolic sizes: {what}" for what in declined),
               **foreach_lists.list_kernels(sched)},
        fallbacks=dict(metrics.fallbacks - fallbacks_before),
        fx_values=dict(graph.fx_values),
        sources={k.name: k.plan.sources for k in kernels},
    )
    if key is not None:
        metrics.cache_misses += 1
        with metrics.timed("store", seconds):  # the entry written for other processes
            cache.store(key, entry)
    compiled = _ready(entry, gm, name, seconds, cached=False)
    metrics.cold_stage_seconds.update(seconds)
    return compiled


def _ready(entry: cache.Entry, gm: torch.fx.GraphModule | Callable[[], torch.fx.GraphModule], name: str,
           seconds: dict[str, float], cached: bool) -> CompiledGraph:
    """Load a compiled graph (just compiled, or from the cache: ``cached``) and record its
    artifacts."""
    artifacts = dump.CompiledArtifacts(
        name=name,
        aten_graph=entry.texts["aten_graph"],
        ir=entry.texts["ir"],
        fused_ir=entry.texts["fused_ir"],
        schedule=entry.texts["schedule"],
        kernels={k.name: k.source for k in entry.kernels}
        | {name: text for name, text in entry.texts.items() if name.startswith(foreach_lists.KERNEL_NAME)},
        wrapper=entry.wrapper,
        stage_seconds=seconds,
        sources=dict(entry.sources),
    )
    with metrics.timed("load", seconds):  # import kernels and wrapper from the cache folder
        call, launchers = _load(entry, name, artifacts)
    with metrics.timed("triton", seconds):  # kernels to binaries, several at once, before their first launches
        # a cached graph's binaries are in Triton's cache, where the process that compiled it put them
        precompile.precompile(launchers, torch.device(entry.device), in_workers=not cached)
    if config.check_kernels:  # each step's buffers compared with eager's (checking.py)
        call.__globals__["observe"] = checking.Observer(_module(gm), name, entry.fx_values)
    metrics.graphs_compiled += 1
    metrics.kernels_generated += len(entry.kernels)
    dump.record(artifacts)
    return CompiledGraph(call, artifacts)


def _module(gm: torch.fx.GraphModule | Callable[[], torch.fx.GraphModule]) -> torch.fx.GraphModule:
    return gm if isinstance(gm, torch.fx.GraphModule) else gm()


def _buffer_dtypes(graph: ir.IRGraph) -> dict[str, torch.dtype]:
    """Each buffer's dtype by name: what a kernel's pointer arguments point to."""
    dtypes = {b.name: b.dtype for b in graph.input_buffers()}
    for node in graph.nodes:
        dtypes.update((b.name, b.dtype) for b in ir.written_buffers(node))
    return dtypes


def _check_device(device: torch.device) -> None:
    interpret = use_interpreter()
    if (device.type == "cuda" and not interpret) or (device.type == "cpu" and interpret):
        return
    raise lowering.Unsupported(
        f"this graph's tensors are on {device}, and kernels run "
        + ("in Triton's interpreter on CPU tensors" if interpret else "on CUDA tensors")
        + " (FUSE_INTERPRET chooses)"
    )


def _load(entry: cache.Entry, name: str, artifacts: dump.CompiledArtifacts) -> tuple[Callable, list]:
    """The wrapper's ``call`` with its kernels bound, and what ``runtime.precompile`` takes. A
    kernel with autotuning candidates is bound to the one chosen before (on disk), or to a
    ``Tuner`` that chooses at its first call (``autotune.bind``)."""
    module = runtime.load_module(entry.wrapper, f"wrapper_{name}", shared=False)
    launchers = []
    for k in entry.kernels:
        if k.variants:
            bound, loaded = autotune.bind(k, entry.device, vars(module),
                                          lambda kernel, text: dump.note_autotune(artifacts, kernel, text))
            setattr(module, k.name, bound)
            launchers += [(launcher, k.arg_dtypes, k.sizes) for launcher in loaded]
            continue
        kernel = runtime.load_kernel(k.name, k.source)
        per_call = not isinstance(k.grid, int)  # over symbolic sizes: each call's grid (not precompiled)
        launcher = runtime.Launcher(kernel, None if per_call else k.grid, k.launch, vars(module), k.name)
        setattr(module, k.name, launcher)
        if k.short_rows is not None:  # its persistent kernel for rows that fit one block, in its module
            short = runtime.load_kernel(k.name, k.source, "_persistent")
            setattr(module, f"{k.name}_persistent",
                    runtime.Launcher(short, None, k.launch, vars(module), f"{k.name}_persistent"))
        if k.grid and not per_call:
            launchers.append((launcher, k.arg_dtypes, k.sizes))
    for cname, value in entry.constants.items():
        setattr(module, cname, value)
    return module.call, launchers


def _fused_ir(sched: scheduler.Schedule, kernels: list[codegen.KernelSource]) -> str:
    lines = []
    for kernel in kernels:
        stored = {b.name for b in kernel.plan.stored}
        lines.append(f"kernel {kernel.name}:")
        for node in kernel.plan.nodes:
            tag = "stored" if node.name in stored else "in registers"
            text = ir.format_node(node).replace("\n", "\n      ")
            lines.append(f"    [{tag}] {text}")
    for step in sched.steps:
        if isinstance(step, scheduler.ExternCall):
            lines.append(f"extern: {ir.format_node(step.node)}")
    return "\n".join(lines)
