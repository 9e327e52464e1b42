"""Triton source for one kernel plan.

A kernel iterates over a flat index ``xindex``. Each node the plan must store gets its loop
variables by unravelling ``xindex`` in its buffer's memory order, so stores are contiguous.
Bodies are rendered bottom-up into numbered temporaries with common-subexpression elimination.
A load of a buffer produced inside the same kernel is replaced by the producer's body evaluated
at the loaded index (inlining): that is how fused intermediates stay in registers.

Half-precision inputs are loaded and widened to fp32 by the IR casts the lowering inserted; the
value is narrowed only where it is stored.
"""

from __future__ import annotations

import dataclasses
import math
import re

import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.codegen.triton_ops import TRITON_DTYPE, render_literal, render_op
from fusebackend.codegen.writer import LineWriter
from fusebackend.scheduler import KernelPlan

INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A generated kernel: its function name, source, and how the wrapper launches it."""

    name: str
    source: str
    args: tuple[str, ...]  # buffer names, one pointer argument each, in order
    numel: int
    plan: KernelPlan


class KernelBody:
    """Renders expressions of one kernel with CSE, inlining loads of in-kernel buffers."""

    def __init__(self, plan: KernelPlan, kernel_vars: dict[sympy.Symbol, int], mask: str) -> None:
        self.plan = plan
        self.ranges = kernel_vars
        self.mask = mask
        self.lines: list[str] = []
        self.cse: dict[str, str] = {}
        self.block: set[str] = set()  # temporaries that are blocks (not scalars)
        self.inputs: dict[str, str] = {}  # buffer name -> pointer argument
        self.producers = {
            b.name: n for n in plan.nodes for b in ir.written_buffers(n)
        }
        self.max_offset = 0

    # ---------------------------------------------------------------------------- temps
    def _emit(self, text: str, is_block: bool) -> str:
        if text in self.cse:
            return self.cse[text]
        name = f"tmp{len(self.cse)}"
        self.cse[text] = name
        self.lines.append(f"{name} = {text}")
        if is_block:
            self.block.add(name)
        return name

    def is_block(self, value: str) -> bool:
        return value in self.block

    def pointer(self, buffer: ir.Buffer) -> str:
        if buffer.name not in self.inputs:
            self.inputs[buffer.name] = f"in_ptr{len(self.inputs)}"
        return self.inputs[buffer.name]

    def index(self, expr: sympy.Expr) -> sympy.Expr:
        expr = indexing.simplify(expr, self.ranges)
        lo, hi = indexing.bounds(expr, self.ranges)
        if lo < 0:
            raise ValueError(f"negative index {expr}")
        self.max_offset = max(self.max_offset, hi)
        return expr

    def _depends_on_block(self, expr: sympy.Expr) -> bool:
        return bool(sympy.sympify(expr).free_symbols & set(self.ranges))

    # ----------------------------------------------------------------------- expressions
    def value(self, expr: ir.Expr, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
        """Render ``expr`` with loop variables replaced by ``subst``; returns a temp or literal."""
        if isinstance(expr, ir.Constant):
            return render_literal(expr.value, expr.dtype)
        if isinstance(expr, ir.IndexValue):
            idx = self.index(sympy.sympify(expr.index).xreplace(subst))
            text = f"({indexing.pexpr(idx)}).to({TRITON_DTYPE[expr.dtype]})"
            if not self._depends_on_block(idx):
                text = f"tl.full([], {indexing.pexpr(idx)}, {TRITON_DTYPE[expr.dtype]})"
            return self._emit(text, self._depends_on_block(idx))
        if isinstance(expr, ir.Load):
            return self.load(expr, subst)
        if expr.name == "to" and isinstance(expr.args[0], ir.Load):
            inlined = self.resolve(expr.args[0], subst)
            if inlined is not None:  # fold casts across the fusion boundary (fp32 stays fp32)
                return self.value(ir.cast(inlined, expr.dtype), {})
        args = [self.value(a, subst) for a in expr.args]
        if not any(self.is_block(a) or a.startswith("tmp") for a in args):
            # all literals: give them a dtype so tl functions accept them
            args = [f"tl.full([], {a}, {TRITON_DTYPE[x.dtype]})" for a, x in zip(args, expr.args)]
        text = render_op(expr.name, args, expr.dtype, [a.dtype for a in expr.args])
        return self._emit(text, any(self.is_block(a) for a in args))

    def load(self, expr: ir.Load, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
        view = expr.view
        idx = [sympy.sympify(i).xreplace(subst) for i in expr.index]
        producer = self.producers.get(view.buffer.name)
        if producer is not None:
            return self.inline(producer, view, idx)
        offset = self.index(indexing.ravel(idx, view.strides, view.offset))
        ptr = self.pointer(view.buffer)
        if self._depends_on_block(offset):
            other = ", other=0" if view.dtype != torch.bool else ""
            return self._emit(f"tl.load({ptr} + ({indexing.pexpr(offset)}), {self.mask}{other})", True)
        return self._emit(f"tl.load({ptr} + {indexing.pexpr(offset)})", False)

    def _producer_subst(self, producer: ir.Node, view: ir.View, idx: list[sympy.Expr]) -> dict:
        buf = producer.buffer
        if view.is_whole():
            pidx = idx
        else:
            flat = indexing.ravel(idx, view.strides, view.offset)
            pidx = indexing.unravel(flat, buf.sizes, buf.strides)
        pvars = indexing.loop_vars("i", len(buf.sizes))
        return {v: indexing.simplify(e, self.ranges) for v, e in zip(pvars, pidx)}

    def inline(self, producer: ir.Node, view: ir.View, idx: list[sympy.Expr]) -> str:
        """The producer's value at the element ``view[idx]`` of the buffer it writes."""
        assert isinstance(producer, ir.Pointwise), "only pointwise producers are inlined"
        return self.value(producer.body, self._producer_subst(producer, view, idx))

    def resolve(self, load: ir.Load, subst: dict[sympy.Symbol, sympy.Expr]) -> ir.Expr | None:
        """The IR expression a load of an in-kernel buffer stands for (indices substituted)."""
        producer = self.producers.get(load.view.buffer.name)
        if not isinstance(producer, ir.Pointwise):
            return None
        idx = [sympy.sympify(i).xreplace(subst) for i in load.index]
        return ir.substitute_index(producer.body, self._producer_subst(producer, load.view, idx))

    def store_value(self, value: str, dtype: torch.dtype, block_shape: str) -> str:
        """A value in block shape, so that a scalar body can be stored to every element."""
        if self.is_block(value):
            return value
        if value.startswith("tmp"):
            return self._emit(f"tl.broadcast_to({value}, {block_shape})", True)
        return self._emit(f"tl.full({block_shape}, {value}, {TRITON_DTYPE[dtype]})", True)


_ORIGIN = re.compile(r"(?:aten|prims)\.(\w+?)(?:\.|$| )")


def kernel_name(plan: KernelPlan, index: int) -> str:
    ops: list[str] = []
    for node in plan.nodes:
        m = _ORIGIN.search(getattr(node, "origin", ""))
        name = m.group(1).strip("_") if m else type(node).__name__.lower()
        if name not in ops:
            ops.append(name)
    kind = "red" if any(isinstance(n, ir.Reduction) for n in plan.nodes) else "pw"
    shown = "_".join(ops[:4]) + ("_etc" if len(ops) > 4 else "")
    return f"fused_{kind}{index}_{shown}"


def generate_pointwise(plan: KernelPlan, index: int) -> KernelSource:
    """One flat 1-D kernel: ``xindex`` runs over the plan's common number of elements."""
    numel = plan.nodes[0].buffer.numel
    assert all(isinstance(n, ir.Pointwise) and n.buffer.numel == numel for n in plan.nodes)
    x = indexing.var("xindex")
    body = KernelBody(plan, {x: numel}, "xmask")
    stores: list[tuple[str, str, str]] = []
    outputs: dict[str, str] = {}
    stored_nodes = [n for n in plan.nodes if n.buffer in plan.stored]
    for node in stored_nodes:
        buf = node.buffer
        nvars = indexing.loop_vars("i", len(buf.sizes))
        own = indexing.unravel(x, buf.sizes, buf.strides)
        subst = {v: indexing.simplify(e, body.ranges) for v, e in zip(nvars, own)}
        value = body.value(node.body, subst)
        value = body.store_value(value, buf.dtype, "[XBLOCK]")
        offset = body.index(indexing.ravel([subst[v] for v in nvars], buf.strides))
        ptr = f"out_ptr{len(outputs)}"
        outputs[buf.name] = ptr
        stores.append((ptr, indexing.pexpr(offset), value))
    use_int64 = max(body.max_offset, numel) > INT32_MAX
    name = kernel_name(plan, index)
    w = LineWriter()
    w.line("import triton")
    w.line("import triton.language as tl")
    w.line("from fusebackend.kernels import triton_helpers as th")
    w.line("")
    w.line("")
    w.line("@triton.jit")
    params = list(body.inputs.values()) + list(outputs.values()) + ["xnumel", "XBLOCK: tl.constexpr"]
    w.line(f"def {name}({', '.join(params)}):")
    with w.indent():
        _describe(w, plan)
        if use_int64:
            w.line("xoffset = tl.program_id(0).to(tl.int64) * XBLOCK")
            w.line("xindex = xoffset + tl.arange(0, XBLOCK).to(tl.int64)")
        else:
            w.line("xoffset = tl.program_id(0) * XBLOCK")
            w.line("xindex = xoffset + tl.arange(0, XBLOCK)")
        w.line("xmask = xindex < xnumel")
        w.lines(body.lines)
        for ptr, offset, value in stores:
            w.line(f"tl.store({ptr} + ({offset}), {value}, xmask)")
    args = tuple(body.inputs) + tuple(outputs)
    return KernelSource(name, w.source(), args, numel, plan)


def _describe(w: LineWriter, plan: KernelPlan) -> None:
    """A comment block naming the nodes a kernel computes and the bytes it moves."""
    for node in plan.nodes:
        w.line(f"# {node.name}: {getattr(node, 'origin', '')}")
    w.line(f"# reads {plan.bytes_read} B, writes {plan.bytes_written} B")


def generate(plan: KernelPlan, index: int) -> KernelSource:
    if any(isinstance(n, ir.Reduction) for n in plan.nodes):
        raise NotImplementedError("reduction kernels")
    return generate_pointwise(plan, index)


def numel_of(plan: KernelPlan) -> int:
    return math.prod(plan.nodes[0].buffer.sizes)
