"""``compile_graph``: the whole path from an ATen FX graph to a runnable function, one stage a line."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch

from fusebackend import checking, codegen, dump, ir, lowering, metrics, scheduler
from fusebackend.config import config, use_interpreter
from fusebackend.kernels import runtime


@dataclasses.dataclass
class CompiledGraph:
    call: Callable[[list[Any]], Any]
    artifacts: dump.CompiledArtifacts


def compile_graph(gm: torch.fx.GraphModule, args: Sequence[Any], name: str,
                  user_outputs: int | None = None) -> CompiledGraph:
    """Compile ``gm`` for the concrete metadata of ``args`` (tensors and ints); the first
    ``user_outputs`` outputs (all where None) are the user's, in eager's layouts."""
    seconds: dict[str, float] = {}
    with metrics.timed("lower", seconds):  # ATen ops -> IR nodes; views -> index expressions
        graph, moved = lowering.lower(gm, args, name, user_outputs)
    _check_device(graph.device)
    with metrics.timed("verify", seconds):  # the IR's invariants
        ir.verify(graph)
    with metrics.timed("schedule", seconds):  # fusion groups by bytes saved, in execution order
        sched = scheduler.schedule(graph)
    with metrics.timed("codegen", seconds):  # Triton source per group, Python wrapper per graph
        kernels = codegen.generate_all(sched, runtime.use_pdl(graph.device))
        wrapper = codegen.generate_wrapper(sched, kernels, moved, observe=config.check_kernels)
    with metrics.timed("load", seconds):  # import kernels and wrapper from the cache folder
        call = _load(wrapper, kernels, name)
    if config.check_kernels:  # each step's buffers compared with eager's (checking.py)
        call.__globals__["observe"] = checking.Observer(gm, name, graph.fx_values)
    metrics.graphs_compiled += 1
    metrics.kernels_generated += len(kernels)
    artifacts = dump.CompiledArtifacts(
        name=name,
        aten_graph=gm.code,
        ir=str(graph),
        fused_ir=_fused_ir(sched, kernels),
        schedule=sched.report(),
        kernels={k.name: k.source for k in kernels},
        wrapper=wrapper.source,
        stage_seconds=seconds,
    )
    dump.record(artifacts)
    return CompiledGraph(call, artifacts)


def _check_device(device: torch.device) -> None:
    interpret = use_interpreter()
    if (device.type == "cuda" and not interpret) or (device.type == "cpu" and interpret):
        return
    raise lowering.Unsupported(
        f"this graph's tensors are on {device}, and kernels run "
        + ("in Triton's interpreter on CPU tensors" if interpret else "on CUDA tensors")
        + " (FUSE_INTERPRET chooses)"
    )


def _load(wrapper: codegen.WrapperSource, kernels: list[codegen.KernelSource], name: str) -> Callable:
    module = runtime.load_module(wrapper.source, f"wrapper_{name}", shared=False)
    for k in kernels:
        kernel = runtime.load_kernel(k.name, k.source)
        setattr(module, k.name, runtime.Launcher(kernel, k.grid, k.launch, vars(module), k.name))
    for cname, value in wrapper.constants.items():
        setattr(module, cname, value)
    return module.call


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
