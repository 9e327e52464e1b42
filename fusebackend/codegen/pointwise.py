"""Pointwise kernels: one flat index ``xindex`` over the plan's common number of elements.

Each stored node gets its loop variables by unravelling ``xindex`` in its buffer's memory order,
so stores are contiguous; loads of other layouts index accordingly.
"""

from __future__ import annotations

from fusebackend import indexing
from fusebackend.codegen.body import HEADER, KernelBody, KernelSource, describe, kernel_name
from fusebackend.codegen.writer import LineWriter
from fusebackend.kernels import runtime
from fusebackend.scheduler import KernelPlan

XDIMS = frozenset("x")


def generate_pointwise(plan: KernelPlan, index: int) -> KernelSource:
    space = plan.space
    numel = space.xnumel
    launch = runtime.pointwise_config(numel)
    body = KernelBody(plan, space, XDIMS if numel % launch["XBLOCK"] == 0 else frozenset())
    stores: list[tuple[str, str, str]] = []
    outputs: dict[str, str] = {}
    for node in plan.nodes:
        if node.buffer not in plan.stored:
            continue
        buf = node.buffer
        subst = space.mapping[node.name]
        value = body.broadcast(body.value(node.body, subst), buf.dtype, "[XBLOCK]", XDIMS)
        nvars = indexing.loop_vars("i", len(buf.sizes))
        offset = body.index(indexing.ravel([subst[v] for v in nvars], buf.strides))
        ptr = f"out_ptr{len(outputs)}"
        outputs[buf.name] = ptr
        stores.append((ptr, body.offset_text(offset, XDIMS), value))
    name = kernel_name(plan, index)
    w = LineWriter()
    w.lines(HEADER)
    params = list(body.inputs.values()) + list(outputs.values()) + ["xnumel", "XBLOCK: tl.constexpr"]
    w.line(f"def {name}({', '.join(params)}):")
    with w.indent():
        w.lines(describe(plan))
        if body.uses_int64(numel):
            w.line("xoffset = tl.program_id(0).to(tl.int64) * XBLOCK")
            w.line("xindex = xoffset + tl.arange(0, XBLOCK).to(tl.int64)")
        else:
            w.line("xoffset = tl.program_id(0) * XBLOCK")
            w.line("xindex = xoffset + tl.arange(0, XBLOCK)")
        mask = body.mask(XDIMS)
        if mask is not None:
            w.line("xmask = xindex < xnumel")
        w.lines(body.lines)
        for ptr, offset, value in stores:
            w.line(f"tl.store({ptr} + ({offset}), {value}" + (f", {mask})" if mask else ")"))
    grid = runtime.cdiv(numel, launch["XBLOCK"])
    return KernelSource(name, w.source(), tuple(body.inputs) + tuple(outputs), (numel,), grid, launch, plan)
