"""Product kernels: a matrix product's reduction (``ir.Reduction.product``) and its epilogue.

Each program computes one ``[YBLOCK, XBLOCK]`` tile of the [M, N] output (of one of a bmm's
[B, M, N] matrices, ``x_outer``): a loop over K in steps
of ``KBLOCK`` loads a ``[YBLOCK, KBLOCK]`` tile of the first factor and a ``[KBLOCK, XBLOCK]`` tile
of the second and accumulates ``tl.dot`` of them in fp32; then every node of the plan that reads
the product (its epilogue: a bias, an activation, a residual, a cast) is computed on the
accumulator's tile, and the plan's stored values are written once.

The tile's indices are those of a tiled pointwise kernel (``codegen/pointwise.py``): ``y_index``
along the output's rows, ``x_inner`` along its columns, so the epilogue's loads and stores are
rendered by ``KernelBody`` as any kernel's, and the factors' loads too, at ``(y_index, k_row)``
and ``(k_col, x_inner)``: a pointwise producer of a factor that the plan holds (a cast) is
computed inside the loop. A dim its block does not divide has its last block shifted back to end
at the extent's end, as the tiled pointwise kernels do: both blocks write the same values there,
so nothing is masked. K is a multiple of ``KBLOCK`` (``lowering/product_templates.py``).

Half-precision factors go to ``tl.dot`` as they are (fp32 accumulation, as the library's
kernels); fp32 ones with ``input_precision="ieee"`` (no TF32, as eager's default). In Triton's
interpreter half-precision factors are widened first: its ``tl.dot`` of bf16 tiles returns
garbage (Triton 3.9), and fp32 sums of the same exact products are what a GPU's computes.
"""

from __future__ import annotations

import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.codegen.body import KernelSource
from fusebackend.codegen.kernel_header import GRID_WAIT, HEADER, describe, kernel_name
from fusebackend.codegen.pointwise import X_INNER, X_OUTER, XDIMS, Y_INDEX, kernel_stores, tile_axis, tile_body
from fusebackend.codegen.writer import LineWriter
from fusebackend.config import use_interpreter
from fusebackend.scheduler import KernelPlan
from fusebackend.scheduler.space import X
from fusebackend.sizevars import ceil_div

GROUP_ROWS = 8  # tile rows a group of programs covers (see the kernel's comment)
K_ROW, K_COL = indexing.var("k_row"), indexing.var("k_col")  # K positions of the two factors' tiles
HALF = (torch.float16, torch.bfloat16)


def product_of(plan: KernelPlan) -> ir.Reduction | None:
    """The plan's product reduction, where its anchor is one."""
    anchor = plan.space.anchor
    return anchor if isinstance(anchor, ir.Reduction) and anchor.product else None


def product_config(m: int, n: int, k: int) -> dict[str, int]:
    """Blocks for a product's tiles: at most 128 x 128 of the output on a GPU (64 x 64 in the
    interpreter), each within its extent, and KBLOCK the largest of 64, 32, 16 dividing K."""
    most = 64 if use_interpreter() else 128
    launch = {"XBLOCK": _within(n, most), "YBLOCK": _within(m, most), "KBLOCK": next(b for b in (64, 32, 16) if k % b == 0)}
    if not use_interpreter():
        launch |= {"num_warps": 8 if launch["XBLOCK"] * launch["YBLOCK"] >= 128 * 128 else 4, "num_stages": 3}
    return launch


def _within(extent: int, most: int) -> int:
    block = 16
    while block * 2 <= min(extent, most):
        block *= 2
    return block


def generate_product(plan: KernelPlan, index: int, pdl: bool = False,
                     launch: dict[str, int] | None = None) -> KernelSource | None:
    """The product's kernel; None for a candidate's blocks that do not fit its extents."""
    red = product_of(plan)
    assert red is not None
    *lead, m, n = (int(d) for d in red.buffer.sizes)
    batch = lead[0] if lead else 1  # a bmm's batch: one program's tile lies in one matrix
    (k,) = (int(d) for d in red.reduction_ranges)
    # a candidate's blocks over the heuristic's: the constexprs stay first, in the parameters' order
    launch = {**product_config(m, n, k), **(launch or {})}
    if not all(16 <= launch[b] <= e for b, e in (("XBLOCK", n), ("YBLOCK", m))) or k % launch["KBLOCK"]:
        return None
    fa, fb = _factors(red)
    # no masks: blocks within the extents (the last shifted back), K tiled exactly
    body = tile_body(plan, {X_OUTER: batch, Y_INDEX: m, X_INNER: n, K_ROW: k, K_COL: k})
    tiled = {X: (X_OUTER * (m * n) if lead else 0) + Y_INDEX * n + X_INNER}
    subst_of = {name: {v: e.xreplace(tiled) for v, e in mapping.items()} for name, mapping in plan.space.mapping.items()}
    *ib, im, i_n = indexing.loop_vars("i", len(red.buffer.sizes))
    (r0,) = indexing.loop_vars("r", 1)
    outer = {ib[0]: X_OUTER} if ib else {}
    body.push()  # the loop's scope: nothing loaded in it is reused after it
    # both factors in one half dtype go to tl.dot as they are; in the interpreter, widened
    # (its tl.dot of bf16 tiles returns garbage: Triton 3.9), which sums the same products
    half = _half(fa) is not None and _half(fa) == _half(fb) and not use_interpreter()
    a = body.value(fa.args[0] if half else fa, {**outer, im: Y_INDEX, r0: K_ROW})
    b = body.value(fb.args[0] if half else fb, {**outer, r0: K_COL, i_n: X_INNER})
    loop = body.pop()
    precision = "" if half else ', input_precision="ieee"'
    acc = body.new_temp(XDIMS)
    body.row_values[red.name] = ir.cast(ir.Rendered(acc, red.body.dtype), red.buffer.dtype)
    stores, outputs, _ = kernel_stores(plan, body, subst_of, "[YBLOCK, XBLOCK]", {red.name: body.row_values[red.name]})
    name = kernel_name(plan, index).replace("fused_red", "fused_mm", 1)
    w = LineWriter()
    w.lines(HEADER)
    params = [*body.inputs.values(), *outputs.values(), "xnumel", "XBLOCK: tl.constexpr", "YBLOCK: tl.constexpr",
              "KBLOCK: tl.constexpr"]
    w.line(f"def {name}({', '.join(params)}):")
    with w.indent():
        w.lines(describe(plan))
        w.line(f"# a product of [{m}, {k}] by [{k}, {n}]" + (f", {batch} of them," if lead else "")
               + " in tiles of [YBLOCK, XBLOCK], K in steps of KBLOCK (tl.dot, fp32 sums); what reads it computed on the tile")
        if pdl:
            w.line(GRID_WAIT)
        x_tiles, y_tiles = ceil_div(n, launch["XBLOCK"]), ceil_div(m, launch["YBLOCK"])
        if lead:
            w.line(f"x_outer = tl.program_id(0) // {x_tiles * y_tiles}")
            w.line(f"pid = tl.program_id(0) % {x_tiles * y_tiles}")
        else:
            w.line("pid = tl.program_id(0)")
        # programs in groups of GROUP_ROWS tile rows, column by column: the group's programs in
        # flight share their rows of the first factor and their columns of the second in L2
        w.line(f"group = pid // {GROUP_ROWS * x_tiles}")
        w.line(f"group_rows = tl.minimum({y_tiles} - group * {GROUP_ROWS}, {GROUP_ROWS})")
        w.line(f"in_group = pid % {GROUP_ROWS * x_tiles}")
        x_ragged = None if n % launch["XBLOCK"] == 0 else (n, launch["XBLOCK"])
        y_ragged = None if m % launch["YBLOCK"] == 0 else (m, launch["YBLOCK"])
        tile_axis(w, "x_inner", "(in_group // group_rows) * XBLOCK", "[None, :]", "XBLOCK", "", "", False, x_ragged)
        tile_axis(w, "y_index", f"(group * {GROUP_ROWS} + in_group % group_rows) * YBLOCK", "[:, None]", "YBLOCK", "", "",
                  False, y_ragged)
        # (tl.zeros is a @jit function of Triton's library: see runtime._decorating)
        w.line(f"{acc} = tl.full([YBLOCK, XBLOCK], 0.0, tl.float32)")
        w.line(f"for k in range(0, {k}, KBLOCK):")
        with w.indent():
            w.line("k_row = k + tl.arange(0, KBLOCK)[None, :]")
            w.line("k_col = k + tl.arange(0, KBLOCK)[:, None]")
            w.lines(loop)
            w.line(f"{acc} = tl.dot({a}, {b}, {acc}{precision})")
        w.lines(body.lines)
        for ptr, offset, value in stores:
            w.line(f"tl.store({ptr} + ({offset}), {value})")
    grid = batch * ceil_div(n, launch["XBLOCK"]) * ceil_div(m, launch["YBLOCK"])
    return KernelSource(name, w.source(), tuple(body.inputs) + tuple(outputs), (batch * m * n,), grid, launch, plan,
                        body.asserts)


def _factors(red: ir.Reduction) -> tuple[ir.Expr, ir.Expr]:
    """The body's two factors: over (the batch, the row, r0) and over (the batch, r0, the column)."""
    assert isinstance(red.body, ir.Op) and red.body.name == "mul", red.body
    fa, fb = red.body.args
    *_, i0, i1 = indexing.loop_vars("i", len(red.buffer.sizes))
    if _uses(fa, i1) or _uses(fb, i0):
        fa, fb = fb, fa
    assert not _uses(fa, i1) and not _uses(fb, i0), red.body
    return fa, fb


def _uses(expr: ir.Expr, var: sympy.Symbol) -> bool:
    return any(var in sympy.sympify(i).free_symbols for ld in ir.loads(expr) for i in ld.index)


def _half(factor: ir.Expr) -> torch.dtype | None:
    """The half-precision dtype the factor was widened from, where it was one."""
    if isinstance(factor, ir.Op) and factor.name == "to" and factor.args[0].dtype in HALF:
        return factor.args[0].dtype
    return None
