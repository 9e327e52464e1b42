"""The wrapper: plain Python source that runs one compiled graph.

It unpacks the inputs, allocates every stored buffer with eager's layout (a buffer written into
an input in place is that input, a scatter's result the memory it scattered into, and where the
memory plan says so, a dead buffer's memory: ``memory.py``), launches the kernels, calls the
externs, frees each buffer after its last use and returns the outputs. Generated kernels are bound into the wrapper
module's namespace by name; values that have no literal spelling are bound as ``const<N>``. A
dump of this source shows exactly what runs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch

from fusebackend import indexing, ir, sizevars
from fusebackend.codegen import memory
from fusebackend.codegen.body import KernelSource
from fusebackend.config import config
from fusebackend.codegen.writer import LineWriter
from fusebackend.scheduler import ExternCall, KernelPlan, Schedule


class WrapperSource:
    def __init__(self, source: str, constants: dict[str, Any], memory: str = "") -> None:
        self.source = source
        self.constants = constants
        self.memory = memory  # the memory plan in one line (memory.MemoryPlan.summary)


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
    if isinstance(value, sympy.Expr) and value.is_integer:  # a size over symbolic sizes
        return indexing.pexpr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_render(v, constants) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    name = f"const{len(constants)}"
    constants[name] = value
    return name


def view_expr(v: ir.View) -> str:
    if v.is_whole():
        return v.buffer.name
    return f"view({v.buffer.name}, {_ints(v.sizes)}, {_ints(v.strides)}, {indexing.pexpr(sympy.sympify(v.offset))})"


def _ints(values: Sequence[Any]) -> str:
    """A tuple of sizes as Python: ints, or expressions in the size symbols the wrapper binds."""
    texts = [indexing.pexpr(sympy.sympify(v)) for v in values]
    return f"({', '.join(texts)}{',' if len(texts) == 1 else ''})"


def _bindings(graph: ir.IRGraph, names: list[str], kernels: list[KernelSource], layouts: dict[str, ir.Buffer]
              ) -> list[str]:
    """Lines binding each size symbol of a graph with symbolic sizes to the call's
    value: an input's size or stride where the symbol is one, or an int input. ``NotSymbolic``
    where a symbol the wrapper uses has none."""
    lines: list[str] = []
    bound: set[sympy.Symbol] = set()
    for name, value in zip(names, graph.inputs):
        if isinstance(value, sympy.Symbol) and value not in bound:
            lines.append(f"{value} = {name}")
            bound.add(value)
        if not isinstance(value, ir.Buffer):
            continue
        for what, exprs in (("size", value.sizes), ("stride", value.strides)):
            for d, e in enumerate(exprs):
                if isinstance(e, sympy.Symbol) and e not in bound:
                    lines.append(f"{e} = {name}.{what}({d})")
                    bound.add(e)
    used: set[sympy.Symbol] = set()
    for value in [*(v for k in kernels for v in (*k.sizes, k.grid)), *graph.outputs,
                  *(x for b in layouts.values() for x in (*b.sizes, *b.strides))]:
        if isinstance(value, ir.View):
            value = (value.offset, *value.sizes, *value.strides)
        for v in value if isinstance(value, tuple) else (value,):
            used |= getattr(v, "free_symbols", set())
    if used - bound:
        raise sizevars.NotSymbolic(f"sizes {sorted(map(str, used - bound))}: no input gives them")
    return lines


def _step_reads(step: KernelPlan | ExternCall, kernel: KernelSource | None, mutations: dict[str, str]) -> list[str]:
    """The names a step uses: what it reads, and the inputs it writes in place."""
    if isinstance(step, ExternCall):
        return [v.buffer.name for v in step.node.reads()]
    assert kernel is not None
    # an input written in place, and a scatter's target (its output's memory), stay alive until then
    return (list(kernel.args) + [mutations[b.name] for b in step.stored if b.name in mutations]
            + [n.target.name for n in step.nodes if isinstance(n, ir.Scatter)])


def generate_wrapper(
    schedule: Schedule, kernels: list[KernelSource], moved_inputs: list[int], observe: bool = False
) -> WrapperSource:
    """The wrapper's source. With ``observe`` (``config.check_kernels``) it also hands the inputs
    to ``observe.start`` and, after each step, the buffers it stored that hold an ATen node's
    value to ``observe`` (``fusebackend.checking``), which the loader binds."""
    graph = schedule.graph
    constants: dict[str, Any] = {}
    plan_kernel = {id(k.plan): k for k in kernels}
    steps = list(schedule.steps)
    returned = {o.buffer.name for o in graph.outputs if isinstance(o, ir.View)}
    scattered = {n.buffer.name: n.target.name for n in graph.nodes if isinstance(n, ir.Scatter)}
    last_use: dict[str, int] = {}
    for k, step in enumerate(steps):
        for name in _step_reads(step, plan_kernel.get(id(step)), graph.mutations):
            last_use[name] = k
    for buf, value in graph.constants:  # module globals, never deleted
        constants[buf.name] = value
        last_use.pop(buf.name, None)
    used = set(last_use) | returned
    allocated = {k: [b for b in step.stored if b.name not in graph.mutations and b.name not in scattered]
                 for k, step in enumerate(steps) if isinstance(step, KernelPlan)}
    in_place = {k: plan_kernel[id(step)].in_place for k, step in enumerate(steps) if isinstance(step, KernelPlan)}
    plan = memory.plan(steps, allocated, last_use, returned, set(scattered.values()), reuse=config.reuse_buffers,
                       in_place=in_place)
    layouts = {b.name: b for bufs in allocated.values() for b in bufs}
    layouts.update((b.name, b) for s in steps if isinstance(s, ExternCall) for _, b in s.node.outputs)
    taken_over = set(plan.reuse.values())  # freed when an output takes their memory, not where they die

    w = LineWriter()
    w.line(f"# fusebackend wrapper for graph {graph.name}")
    w.line(f"# {plan.summary()}")
    w.line("import torch")
    w.line("from fusebackend.kernels.runtime import current_stream")
    w.line("from fusebackend.kernels.wrapper_calls import allocators, aten_call, expect_layout, on_device, view")
    w.line("")
    w.line(f"device = torch.device({str(graph.device)!r})")
    w.line("empty_fast, empty_any = allocators(device)  # (size, stride, dtype) -> tensor")
    ops = sorted({str(step.node.op) for step in steps if isinstance(step, ExternCall)})
    if ops:
        w.line("# the ATen calls: Python bindings where they take the schema's arguments (wrapper_calls.aten_call)")
    for op in ops:
        w.line(f"{_op_alias(op)} = aten_call(torch.ops.{op})")
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
        if observe:
            w.line("observe.start(args)")
        if names:
            w.line(f"{', '.join(names)}{',' if len(names) == 1 else ''} = args")
        w.line("args.clear()")
        w.lines(_bindings(graph, names, kernels, layouts))
        if any(k.grid for k in kernels):  # read once: every launch of the call goes to it
            w.line("stream = current_stream()" if graph.device.type == "cuda" else "stream = None")
        kernel_reads = {name for kernel in kernels for name in kernel.args}
        for k in moved_inputs:  # a CPU scalar tensor beside CUDA ones: kernels read device memory
            if names[k] in kernel_reads:  # ATen calls alone take it where it is, as eager does
                w.line(f"{names[k]} = {names[k]}.to(device)")
        for k, step in enumerate(steps):
            if isinstance(step, ExternCall):
                _extern(w, step.node, constants, used)
                for _, buf in step.node.outputs:  # kernels read device memory (ir.IRGraph.foreign)
                    if buf.name in graph.foreign and buf.name in kernel_reads and buf.name not in returned:
                        w.line(f"{buf.name} = {buf.name}.to(device)")
            else:
                _launch(w, plan_kernel[id(step)], graph.mutations, scattered, plan, layouts)
            if observe:
                _observe(w, k, step, plan_kernel.get(id(step)), graph.fx_values, used)
            dead = sorted(n for n, last in last_use.items() if last == k and n not in returned and n not in taken_over)
            if dead:
                w.line(f"del {', '.join(dead)}")
        outs = [_render(o, constants) for o in graph.outputs]
        w.line(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    return WrapperSource(w.source(), constants, plan.summary())


def _observe(w: LineWriter, k: int, step: KernelPlan | ExternCall, kernel: KernelSource | None,
             fx_values: dict[str, str], used: set[str]) -> None:
    if isinstance(step, ExternCall):
        label, written = f"extern {step.node.op}", [b for _, b in step.node.outputs if b.name in used]
    else:
        assert kernel is not None
        label, written = kernel.name, list(step.stored)
    held = [b.name for b in written if b.name in fx_values]
    if held:
        w.line(f"observe({k}, {label!r}, {{{', '.join(f'{n!r}: {n}' for n in held)}}})")


def _extern(w: LineWriter, node: ir.Extern, constants: dict[str, Any], used: set[str]) -> None:
    """The ATen call, and each of its results that something uses, in the layout promised.

    A result nothing uses is not touched: ATen may return None there where its meta function
    promised a tensor (the log-sum-exp of an attention kernel asked for no gradient).
    """
    args = [_render(a, constants) for a in node.args]
    args += [f"{k}={_render(v, constants)}" for k, v in node.kwargs]
    call = f"{_op_alias(str(node.op))}({', '.join(args)})"
    if len(node.outputs) == 1 and node.outputs[0][0] == () and not node.mutates:
        buf = node.outputs[0][1]
        w.line(f"{buf.name} = {call}")
        _expect_layout(w, buf)
        return
    w.line(f"{node.name} = {call}")
    for path, buf in node.outputs:
        if path == () or buf.name not in used:
            continue
        ref = node.name + "".join(f"[{p}]" for p in path)
        w.line(f"{buf.name} = {ref}")
        if not node.mutates:
            _expect_layout(w, buf)
    if all(path != () for path, _ in node.outputs):
        w.line(f"del {node.name}")  # the results it holds are freed after their own last use


def _expect_layout(w: LineWriter, buf: ir.Buffer) -> None:
    """An ATen result in the layout its meta function promised: the strides compared here (a
    tuple comparison, the common case), ``wrapper_calls.expect_layout`` only where they differ."""
    w.line(f"if {buf.name}.stride() != {_ints(buf.strides)}:")
    with w.indent():
        w.line(f"{buf.name} = expect_layout({buf.name}, {_ints(buf.sizes)}, {_ints(buf.strides)})")


def _same_memory(old: ir.Buffer, new: ir.Buffer) -> str:
    """``new`` on ``old``'s memory: the same tensor, or a view of it in ``new``'s layout."""
    if (old.sizes, old.strides) == (new.sizes, new.strides):
        return old.name
    return f"view({old.name}, {_ints(new.sizes)}, {_ints(new.strides)}, 0)"


def _op_alias(op: str) -> str:
    """The wrapper module's name for an ATen op: ``aten.convolution.default`` -> ``aten_convolution``."""
    return op.removesuffix(".default").replace(".", "_")


def _launch(w: LineWriter, kernel: KernelSource, mutations: dict[str, str], scattered: dict[str, str],
            plan: memory.MemoryPlan, layouts: dict[str, ir.Buffer]) -> None:
    for buf in kernel.plan.stored:
        if buf.name in mutations:
            w.line(f"{buf.name} = {mutations[buf.name]}  # aten.copy_ into the input, in place")
        elif buf.name in scattered:
            w.line(f"{buf.name} = {scattered[buf.name]}  # scattered into, in place")
        elif buf.name in plan.reuse:  # a dead buffer's memory (memory.py)
            old = layouts[plan.reuse[buf.name]]
            w.line(f"{buf.name} = {_same_memory(old, buf)}; del {old.name}  # its memory: {old.name} is dead")
        elif buf.name in plan.in_place:  # written over an input read here for the last time (memory.py)
            old = layouts[plan.in_place[buf.name]]
            w.line(f"{buf.name} = {_same_memory(old, buf)}  # over {old.name}, element by element: its last use")
        else:
            w.line(f"{buf.name} = empty({_ints(buf.sizes)}, {_ints(buf.strides)}, {buf.dtype})")
    if kernel.grid == 0:
        return  # nothing to compute: an empty output
    sizes = ", ".join(indexing.pexpr(sympy.sympify(n)) for n in kernel.sizes)
    options = ", ".join(f"{k}={v}" for k, v in kernel.launch.items())
    if isinstance(kernel.grid, int):
        w.line(f"{kernel.name}(stream, {', '.join(kernel.args)}, {sizes})  # grid ({kernel.grid},), {options}")
    else:  # over symbolic sizes: the grid of this call, first
        grid = indexing.pexpr(kernel.grid)
        call = f"(stream, {grid}, {', '.join(kernel.args)}, {sizes})"
        if kernel.short_rows is None:
            w.line(f"{kernel.name}{call}  # {options}")
            return
        rnumel = indexing.pexpr(sympy.sympify(kernel.plan.space.rnumel))
        w.line(f"if {rnumel} <= {kernel.short_rows}:  # rows that fit one block: each in one program")
        w.line(f"    {kernel.name}_persistent{call}  # {options}")
        w.line("else:  # longer rows: looped over each row")
        w.line(f"    {kernel.name}{call}")
