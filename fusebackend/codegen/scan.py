"""Scan kernels: a block of rows ``xindex`` by positions ``rindex`` along the scanned dim.

The block is [XBLOCK, RBLOCK] when the scan's output is contiguous along the scanned dim and
[RBLOCK, XBLOCK] (rows on axis 1) when it is strided there, as for reductions
(``reduction.Layout``): the contiguous dim is the block's last axis either way. Each scan of the
kernel is one ``tl.associative_scan`` of the block along the positions with a combine function
from ``triton_helpers``.

Rows that fit one block are scanned in one go. Longer rows loop over blocks from the first
position on, each block's scan combined with the running total of the blocks before it
(``carry``, one value per row), which then becomes the block's last lane. The lanes past the
row's end (the last block's) come after every valid lane, so a prefix scan never mixes them in,
and the carry is taken from full blocks only.

Prologue nodes are evaluated at each element the scan reads (inlined, or stored in the same
pass when they must be in memory), epilogue nodes where the scan's value is: a load of a scan's
result inside the kernel is that scan's value at the element being computed, which
``scheduler/scan_scatter_space.py`` proves of every such load.
"""

from __future__ import annotations

import math

import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.codegen.body import KernelBody, KernelSource
from fusebackend.codegen.kernel_header import GRID_WAIT, describe, header, kernel_name, sizes_in
from fusebackend.codegen.reduction import FULL, ROW, Layout
from fusebackend.codegen.triton_ops import TRITON_DTYPE, render_literal
from fusebackend.codegen.writer import LineWriter
from fusebackend.kernels import runtime
from fusebackend.scheduler import KernelPlan
from fusebackend.sizevars import ceil_div, size_hint

# What tl.associative_scan combines lanes with; sums and products are Triton's own in the
# interpreter (see th.reduce_sum), which must never be called as functions.
_SCAN = {
    "sum": "th.reduce_sum", "prod": "th.scan_prod", "max": "th.combine_max", "min": "th.combine_min",
    "logsumexp": "th.combine_logsumexp", "argmax": "th.combine_cummax", "argmin": "th.combine_cummin",
}
# What combines the carry with a block's scan, elementwise.
_COMBINE = {**_SCAN, "sum": "th.combine_sum", "prod": "th.combine_prod"}


def _identity(scan_type: str, dtype: torch.dtype) -> str:
    """The running total before the first position: combined with any value, gives that value."""
    if scan_type in ("sum", "prod"):  # eager's running sum starts at 0.0 too (sign of a zero)
        return render_literal(0 if scan_type == "sum" else 1, dtype)
    low = scan_type in ("max", "argmax", "logsumexp")
    if dtype.is_floating_point:
        return render_literal(-math.inf if low else math.inf, dtype)
    info = torch.iinfo(dtype)
    return str(info.min if low else info.max)


class _ScanBody(KernelBody):
    """A kernel body whose loads of an in-kernel scan give that scan's value at the element
    being computed."""

    def inlined(self, producer: ir.Node, view: ir.View, idx: list[sympy.Expr]) -> ir.Expr:
        if isinstance(producer, ir.Scan):
            return self.row_values[producer.name]
        return super().inlined(producer, view, idx)


def generate_scan(plan: KernelPlan, index: int, pdl: bool = False,
                  launch: dict[str, int] | None = None) -> KernelSource:
    """A scan kernel, in the heuristic's blocks (``runtime.scan_config``) or in ``launch``'s (an
    autotuning candidate): a row longer than RBLOCK is scanned in a loop."""
    space = plan.space
    anchor = space.anchor
    assert isinstance(anchor, ir.Scan)
    xnumel, rnumel = space.xnumel, space.rnumel
    row_contiguous = rnumel == 1 or anchor.buffer.strides[anchor.dim] == 1
    launch = launch or runtime.scan_config(size_hint(xnumel), size_hint(rnumel), row_contiguous)
    persistent = not sizes_in(rnumel) and launch["RBLOCK"] >= rnumel  # a symbolic row: looped, any length
    lay = Layout(column=not row_contiguous)
    exact = frozenset(d for d, n, block in (("x", xnumel, launch["XBLOCK"]), ("r", rnumel, launch["RBLOCK"]))
                      if n % block == 0)
    body = _ScanBody(plan, space, exact)
    stored = {b.name for b in plan.stored}
    outputs: dict[str, str] = {}

    def store(node: ir.Node, value: str) -> None:
        buf = node.buffer
        mapping = space.mapping[node.name]
        nvars = indexing.loop_vars("i", len(buf.sizes))
        offset = body.index(indexing.ravel([mapping[v] for v in nvars], buf.strides))
        value = body.broadcast(value, buf.dtype, lay.full, FULL)
        mask = body.mask(FULL)
        ptr = outputs.setdefault(buf.name, f"out_ptr{len(outputs)}")
        body.emit_raw(f"tl.store({ptr} + ({body.offset_text(offset, FULL)}), {value}" + (f", {mask})" if mask else ")"))

    scans = [n for n in plan.nodes if isinstance(n, ir.Scan)]
    carries = {} if persistent else {s.name: _init_carry(body, s, lay) for s in scans}
    if not persistent:
        body.push()
    body.emit_raw("rindex = rbase" if persistent else "rindex = roffset + rbase")
    if body.mask(frozenset("r")):
        body.emit_raw("rmask = rindex < rnumel")
    for node in plan.nodes:  # in graph order: what a node reads is computed before it
        if isinstance(node, ir.Scan):
            _scan(body, node, lay, carries.get(node.name))
        if node.name in stored:
            value = body.row_values[node.name] if isinstance(node, ir.Scan) else node.body
            store(node, body.value(value, {} if isinstance(node, ir.Scan) else space.mapping[node.name]))
    if not persistent:
        loop = body.pop()
        body.emit_raw("for roffset in range(0, rnumel, RBLOCK):")
        for line in loop:
            body.emit_raw("    " + line)

    name = kernel_name(plan, index)
    int64 = body.uses_int64(xnumel * rnumel)
    symbols = body.size_params()
    w = LineWriter()
    w.lines(header({"xnumel": xnumel, "rnumel": rnumel, **{str(s): s for s in symbols}}))
    params = list(body.inputs.values()) + list(outputs.values())
    params += ["xnumel", "rnumel", *map(str, symbols), "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"]
    w.line(f"def {name}({', '.join(params)}):")
    with w.indent():
        w.lines(describe(plan))
        shape = "each row scanned in one block" if persistent else "looped over each row, carrying its running total"
        w.line("# " + shape
               + (", rows on the block's last axis (scan along a strided dim)" if lay.column else ""))
        if pdl:
            w.line(GRID_WAIT)
        pid = "tl.program_id(0).to(tl.int64)" if int64 else "tl.program_id(0)"
        arange = (lambda n: f"tl.arange(0, {n}).to(tl.int64)") if int64 else (lambda n: f"tl.arange(0, {n})")
        w.line(f"xoffset = {pid} * XBLOCK")
        w.line(f"xindex = xoffset + {arange('XBLOCK')}{lay.x_suffix}")
        if body.mask(ROW):
            w.line("xmask = xindex < xnumel")
        w.line(f"rbase = {arange('RBLOCK')}{lay.r_suffix}")
        w.lines(body.lines)
    grid = ceil_div(xnumel, launch["XBLOCK"])  # over symbolic sizes: computed at each call
    args = tuple(body.inputs) + tuple(outputs)
    return KernelSource(name, w.source(), args, (xnumel, rnumel, *symbols), grid, launch, plan, body.asserts)


def _init_carry(body: KernelBody, scan: ir.Scan, lay: Layout) -> tuple[str, ...]:
    dtype = scan.body.dtype
    value = body.new_temp(ROW)
    body.emit_raw(f"{value} = tl.full({lay.row}, {_identity(scan.scan_type, dtype)}, {TRITON_DTYPE[dtype]})")
    if scan.scan_type not in ("argmax", "argmin"):
        return (value,)
    position = body.new_temp(ROW)
    body.emit_raw(f"{position} = tl.full({lay.row}, 0, tl.int64)")
    return value, position


def _scan(body: KernelBody, scan: ir.Scan, lay: Layout, carry: tuple[str, ...] | None) -> None:
    """Scan the block (combined with the carry when looping); the scan's value for its consumers."""
    dtype = scan.body.dtype
    value = body.broadcast(body.value(scan.body, body.space.mapping[scan.name]), dtype, lay.full, FULL)
    scan_fn, combine = _SCAN[scan.scan_type], _COMBINE[scan.scan_type]
    if scan.scan_type in ("argmax", "argmin"):
        position = body._emit(f"tl.broadcast_to(rindex, {lay.full}).to(tl.int64)", FULL)
        parts = (body.new_temp(FULL), body.new_temp(FULL))
        body.emit_raw(f"{', '.join(parts)} = tl.associative_scan(({value}, {position}), {lay.axis}, {scan_fn})")
        if carry is not None:
            running = (body.new_temp(FULL), body.new_temp(FULL))
            body.emit_raw(f"{', '.join(running)} = {combine}({', '.join(carry)}, {', '.join(parts)})")
            parts = running
            _carry_from_last_lane(body, carry, parts, (dtype, torch.int64), lay)
        body.row_values[scan.name] = ir.cast(ir.Rendered(parts[1], torch.int64), scan.buffer.dtype)
        return
    result = body._emit(f"tl.associative_scan({value}, {lay.axis}, {scan_fn})", FULL)
    if carry is not None:
        result = body._emit(f"{combine}({carry[0]}, {result})", FULL)
        _carry_from_last_lane(body, carry, (result,), (dtype,), lay)
    body.row_values[scan.name] = ir.cast(ir.Rendered(result, dtype), scan.buffer.dtype)


def _carry_from_last_lane(body: KernelBody, carry: tuple[str, ...], values: tuple[str, ...],
                          dtypes: tuple[torch.dtype, ...], lay: Layout) -> None:
    """carry = each row's value at the block's last lane: a sum along the row that selects it
    (every other lane adds -0.0 or 0, which changes no value, a -0.0 included)."""
    for name, value, dtype in zip(carry, values, dtypes):
        zero = "-0.0" if dtype.is_floating_point else "0"
        body.emit_raw(f"{name} = tl.reduce(tl.where(rbase == RBLOCK - 1, {value}, {zero}), {lay.axis}, "
                      "th.reduce_sum, keep_dims=True)")
