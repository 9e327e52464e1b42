"""Scatter kernels: a flat ``xindex`` over the values a ``Scatter`` writes.

Each lane computes its value and its position in the output (inlining the pointwise producers
of both), then stores the value there, or combines it with what is there by ``tl.atomic_add``,
``tl.atomic_max`` or ``tl.atomic_min`` (relaxed: nothing is ordered by these writes; the
kernels that read the result start after this one ends). The output pointer is the target's
memory, which the wrapper hands over (``Scatter``'s docstring).

A position computed from data is checked: ``tl.device_assert`` that it lies in its dim (active
where Triton runs with debugging on), and the write is masked to the positions that do, so an
out-of-bounds index never writes outside the tensor.
"""

from __future__ import annotations

import sympy
import torch

from fusebackend import ir
from fusebackend.codegen.body import KernelBody, KernelSource
from fusebackend.codegen.kernel_header import GRID_WAIT, HEADER, describe, kernel_name
from fusebackend.codegen.writer import LineWriter
from fusebackend.kernels import runtime
from fusebackend.scheduler import KernelPlan

XDIMS = frozenset("x")
_ATOMIC = {"sum": "tl.atomic_add", "max": "tl.atomic_max", "min": "tl.atomic_min"}


def generate_scatter(plan: KernelPlan, index: int, pdl: bool = False,
                     launch: dict[str, int] | None = None) -> KernelSource:
    space = plan.space
    (scatter,) = [n for n in plan.nodes if isinstance(n, ir.Scatter)]
    numel = space.xnumel
    buf = scatter.buffer
    launch = launch or runtime.pointwise_config(numel, max(buf.dtype.itemsize, 8))  # positions are int64
    body = KernelBody(plan, space, XDIMS if numel % launch["XBLOCK"] == 0 else frozenset())
    mapping = space.mapping[scatter.name]
    value = body.broadcast(body.value(scatter.value, mapping), buf.dtype, "[XBLOCK]", XDIMS)
    affine: sympy.Expr = sympy.Integer(0)
    computed: list[tuple[str, int]] = []  # (position, stride) of the dims whose position is data
    checks: list[str] = []
    for position, size, stride in zip(scatter.position, buf.sizes, buf.strides):
        if isinstance(position, ir.IndexValue):  # an iterated dim: in bounds by construction
            affine += stride * sympy.sympify(position.index).xreplace(mapping)
            continue
        p = body.value(position, mapping)
        computed.append((p, stride))
        check = f"({p} >= 0) & ({p} < {size})"
        checks.append(check if body.dims_of(p) else f"th.as_bool({check})")  # see th.as_bool
    offset = body.offset_text(body.index(affine), XDIMS) + "".join(f" + {p} * {stride}" for p, stride in computed)
    mask = body.mask(XDIMS)
    if checks:
        inside = body.broadcast(body._emit(" & ".join(checks), frozenset().union(*(body.dims_of(p) for p, _ in computed))),
                                torch.bool, "[XBLOCK]", XDIMS)
        body.emit_raw(f'tl.device_assert({inside}{f" | ({mask} == 0)" if mask else ""}, "scatter index out of bounds")')
        body.asserts = True  # compiled for debugging, where Triton keeps the assert (as a checked gather's)
        mask = inside if mask is None else f"{mask} & {inside}"
    masked = f", {mask}" if mask else ""
    if scatter.mode == "store":
        body.emit_raw(f"tl.store(out_ptr0 + ({offset}), {value}{masked})")
    else:
        masked = f", mask={mask}" if mask else ""
        body.emit_raw(f'{_ATOMIC[scatter.mode]}(out_ptr0 + ({offset}), {value}{masked}, sem="relaxed")')

    name = kernel_name(plan, index)
    w = LineWriter()
    w.lines(HEADER)
    params = list(body.inputs.values()) + ["out_ptr0", "xnumel", "XBLOCK: tl.constexpr"]
    w.line(f"def {name}({', '.join(params)}):")
    with w.indent():
        w.lines(describe(plan))
        w.line(f"# {scatter.mode} into {scatter.target.name}'s memory (the wrapper passes it as {buf.name})")
        if pdl:
            w.line(GRID_WAIT)
        if body.uses_int64(numel):
            w.line("xoffset = tl.program_id(0).to(tl.int64) * XBLOCK")
            w.line("xindex = xoffset + tl.arange(0, XBLOCK).to(tl.int64)")
        else:
            w.line("xoffset = tl.program_id(0) * XBLOCK")
            w.line("xindex = xoffset + tl.arange(0, XBLOCK)")
        if body.mask(XDIMS) is not None:
            w.line("xmask = xindex < xnumel")
        w.lines(body.lines)
    grid = runtime.cdiv(numel, launch["XBLOCK"])
    return KernelSource(name, w.source(), tuple(body.inputs) + (buf.name,), (numel,), grid, launch, plan,
                        body.asserts)
