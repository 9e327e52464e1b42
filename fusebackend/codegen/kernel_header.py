"""The lines that open a generated kernel's module: imports and the ``triton.jit`` decorator,
with the size arguments Triton must not specialize (kernels over symbolic sizes); the kernel's
name, the comments naming what it computes, and the wait a kernel launched early starts with."""

from __future__ import annotations

import re
from typing import Any, Mapping

import sympy

from fusebackend import ir
from fusebackend.indexing_symbolic import quotient
from fusebackend.scheduler import KernelPlan

HEADER = [
    "import triton",
    "import triton.language as tl",
    "from fusebackend.kernels import triton_helpers as th",
    "",
    "",
    "@triton.jit",
]


def header(int_params: Mapping[str, Any]) -> list[str]:
    """``HEADER``, where a kernel takes extents that change from call to call (symbolic sizes,
    ``int_params``: name -> value): Triton would compile a binary per value class of each int
    (1, a multiple of 16, other), and a launch of the first binary for other values would read
    the wrong memory. An int whose class never changes stays specialized: a static one, or an
    expression in sizes proven a multiple of 16 (``64*s0``), whose divisibility Triton then
    knows (a mask ``xindex < xnumel`` constant over 16 lanes: vectorized loads and stores)."""
    varying = [name for name, value in int_params.items()
               if sizes_in(value) and quotient(sympy.sympify(value), sympy.Integer(16)) is None]
    if not varying:
        return HEADER
    return HEADER[:-1] + [f"@triton.jit(do_not_specialize={varying!r})"]


def sizes_in(expr: Any) -> set[sympy.Symbol]:
    """The size symbols (Dynamo's, positive) in an index or extent; loop variables are not."""
    if isinstance(expr, int):
        return set()
    return {s for s in sympy.sympify(expr).free_symbols if s.is_positive is True}


_ORIGIN = re.compile(r"(?:aten|prims)\.(\w+?)(?:\.|$| )")


def kernel_name(plan: KernelPlan, index: int) -> str:
    ops: list[str] = []
    for node in plan.nodes:
        m = _ORIGIN.search(getattr(node, "origin", ""))
        name = m.group(1).strip("_") if m else type(node).__name__.lower()
        if name not in ops:
            ops.append(name)
    kind = ("scatter" if any(isinstance(n, ir.Scatter) for n in plan.nodes) else "scan"
            if isinstance(plan.space.anchor, ir.Scan) else "red" if plan.space.anchor is not None else "pw")
    shown = "_".join(ops[:4]) + ("_etc" if len(ops) > 4 else "")
    return f"fused_{kind}{index}_{shown}"


def describe(plan: KernelPlan) -> list[str]:
    """Comment lines naming the nodes a kernel computes and the bytes it moves."""
    stored = {b.name for b in plan.stored}
    lines = []
    for node in plan.nodes:
        tag = "stored" if node.name in stored else "in registers"
        what = node.described() if isinstance(node, (ir.Pointwise, ir.Reduction)) else getattr(node, "origin", "")
        lines.append(f"# {node.name} ({tag}): {what}")
    lines.append(f"# reads {plan.bytes_read} B, writes {plan.bytes_written} B")
    return lines


# The first statement of a kernel launched with programmatic dependent launch: nothing in it may
# read or write memory before the kernel ahead of it in the stream has finished.
GRID_WAIT = "tl.extra.cuda.gdc_wait()  # launched early (PDL): wait for the kernel before this one"
