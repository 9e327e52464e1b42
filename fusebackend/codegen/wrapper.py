"""The wrapper: plain Python source that runs one compiled graph.

It unpacks the inputs, allocates every stored buffer with eager's layout (a buffer written into
an input in place is that input, a scatter's result the memory it scattered into), launches the kernels, calls the externs, frees each buffer
after its last use and returns the outputs. Generated kernels are bound into the wrapper
module's namespace by name; values that have no literal spelling are bound as ``const<N>``. A
dump of this source shows exactly what runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fusebackend import ir
from fusebackend.codegen.body import KernelSource
from fusebackend.codegen.writer import LineWriter
from fusebackend.scheduler import ExternCall, KernelPlan, Schedule


class WrapperSource:
    def __init__(self, source: str, constants: dict[str, Any]) -> None:
        self.source = source
        self.constants = constants


def _render(value: Any, constants: dict[str, Any]) -> str:
    if isinstance(value, ir.View):
        return view_expr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_render(v, constants) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    name = f"const{len(constants)}"
    constants[name] = value
    return name


def view_expr(v: ir.View) -> str:
    if v.is_whole():
        return v.buffer.name
    return f"view({v.buffer.name}, {v.sizes}, {v.strides}, {v.offset})"


def _step_reads(step: KernelPlan | ExternCall, kernel: KernelSource | None) -> list[str]:
    if isinstance(step, ExternCall):
        return [v.buffer.name for v in step.node.reads()]
    assert kernel is not None
    # a scatter's target is its output's memory: alive until the scatter has it
    return list(kernel.args) + [n.target.name for n in step.nodes if isinstance(n, ir.Scatter)]


def generate_wrapper(
    schedule: Schedule, kernels: list[KernelSource], moved_inputs: list[int]
) -> WrapperSource:
    graph = schedule.graph
    constants: dict[str, Any] = {}
    plan_kernel = {id(k.plan): k for k in kernels}
    steps = list(schedule.steps)
    returned = {o.buffer.name for o in graph.outputs if isinstance(o, ir.View)}
    scattered = {n.buffer.name: n.target.name for n in graph.nodes if isinstance(n, ir.Scatter)}
    last_use: dict[str, int] = {}
    for k, step in enumerate(steps):
        for name in _step_reads(step, plan_kernel.get(id(step))):
            last_use[name] = k

    w = LineWriter()
    w.line(f"# fusebackend wrapper for graph {graph.name}")
    w.line("import torch")
    w.line("from fusebackend.kernels.runtime import allocators, expect_layout, on_device, view")
    w.line("")
    w.line(f"device = torch.device({str(graph.device)!r})")
    w.line("empty_fast, empty_any = allocators(device)  # (size, stride, dtype) -> tensor")
    w.line("")
    w.line("")
    w.line("def call(args):")
    with w.indent():
        if any(not isinstance(step, ExternCall) and step.stored for step in steps):
            if graph.device.type == "cuda":
                fast = f"empty_fast is not None and on_device({graph.device.index})"
                w.line(f"empty = empty_fast if {fast} else empty_any")
            else:
                w.line("empty = empty_any")
        names = [b.name if isinstance(b, ir.Buffer) else f"arg{k}" for k, b in enumerate(graph.inputs)]
        if names:
            w.line(f"{', '.join(names)}{',' if len(names) == 1 else ''} = args")
        w.line("args.clear()")
        for k in moved_inputs:
            w.line(f"{names[k]} = {names[k]}.to(device)")
        for k, step in enumerate(steps):
            if isinstance(step, ExternCall):
                _extern(w, step.node, constants)
            else:
                _launch(w, plan_kernel[id(step)], graph.mutations, scattered)
            dead = sorted(n for n, last in last_use.items() if last == k and n not in returned)
            if dead:
                w.line(f"del {', '.join(dead)}")
        outs = [_render(o, constants) for o in graph.outputs]
        w.line(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    return WrapperSource(w.source(), constants)


def _extern(w: LineWriter, node: ir.Extern, constants: dict[str, Any]) -> None:
    args = [_render(a, constants) for a in node.args]
    args += [f"{k}={_render(v, constants)}" for k, v in node.kwargs]
    call = f"torch.ops.{node.op}({', '.join(args)})"
    if len(node.outputs) == 1 and node.outputs[0][0] == () and not node.mutates:
        buf = node.outputs[0][1]
        w.line(f"{buf.name} = expect_layout({call}, {buf.sizes}, {buf.strides})")
        return
    w.line(f"{node.name} = {call}")
    for path, buf in node.outputs:
        if path == ():
            continue
        ref = node.name + "".join(f"[{p}]" for p in path)
        if node.mutates:
            w.line(f"{buf.name} = {ref}")
        else:
            w.line(f"{buf.name} = expect_layout({ref}, {buf.sizes}, {buf.strides})")


def _launch(w: LineWriter, kernel: KernelSource, mutations: dict[str, str], scattered: dict[str, str]) -> None:
    for buf in kernel.plan.stored:
        if buf.name in mutations:
            w.line(f"{buf.name} = {mutations[buf.name]}  # aten.copy_ into the input, in place")
        elif buf.name in scattered:
            w.line(f"{buf.name} = {scattered[buf.name]}  # scattered into, in place")
        else:
            w.line(f"{buf.name} = empty({buf.sizes}, {buf.strides}, {buf.dtype})")
    if kernel.grid == 0:
        return  # nothing to compute: an empty output
    sizes = ", ".join(map(str, kernel.sizes))
    options = ", ".join(f"{k}={v}" for k, v in kernel.launch.items())
    w.line(f"{kernel.name}({', '.join(kernel.args)}, {sizes})  # grid ({kernel.grid},), {options}")
