"""What an op costs in instructions, for the choices between computing a value again and
storing it once.

A pointwise value that several kernels read (``scheduler/recompute.py``), or that one kernel
reads at several positions (a window: ``cost_model.window_recompute``), is either stored once or
evaluated again wherever it is read. Storing moves bytes; evaluating again issues instructions.
Counting every op as one made those choices by the number of ops, and the ops differ by a
hundred times: an exact GELU's ``erf`` is 33 instructions an element compiled for an H100, an
addition one. ConvNeXt V2's GELU, read by GRN's sum of squares and by its output pass, was
evaluated in both (one op among six, under the limit), and both kernels were bound by their
instructions: 910 us at 29% of the sum's floor and 1100 us at 47% of the output's in a 5.5 ms
inference step (H200, bf16, b64, 2026-11-28).

``OP_INSTRUCTIONS`` is each op's count as ``python -m benchmarks.studies.op_instructions``
measures it: the instructions an element of a kernel that loads bf16 operands, computes the op
in fp32 and stores bf16, compiled for sm_90 by Triton 3.9 and its ptxas, less the same kernel
without the op, on the path every element takes (a correctly rounded division's slow path is a
subroutine it rarely calls), 2026-12-01. An op not listed counts one: casts, comparisons,
selections, integer arithmetic.
"""

from __future__ import annotations

from typing import Callable

from fusebackend import ir

OP_INSTRUCTIONS: dict[str, int] = {
    "digamma": 215, "lgamma": 188, "cos": 126, "sin": 124, "trigamma": 104, "asinh": 89, "acosh": 79,
    "ndtri": 77, "erfc": 75, "erfcx": 75, "erfinv": 72, "atan2": 61, "expm1": 54, "i1": 52, "i1e": 50,
    "i0": 49, "i0e": 47, "log1p": 47, "atan": 39, "sinh": 39, "erf": 33, "log2": 33, "log": 31,
    "hypot": 25, "tanh": 25, "fmod": 19, "truediv": 16, "sqrt": 15, "sigmoid": 14, "exp": 7,
    "ceil": 3, "exp2": 3, "floor": 3, "rsqrt": 3,
}


def op_instructions(name: str) -> int:
    """Instructions an element of the IR op ``name`` (one where it is not measured)."""
    return OP_INSTRUCTIONS.get(name, 1)


def varying_instructions(body: ir.Expr, leaf: Callable[[ir.Expr], bool | ir.Expr]) -> int:
    """The instructions an element of the distinct ops of ``body`` that depend on a value of
    the element's own (those evaluated again wherever ``body`` is). ``leaf(e)``, for an ``e``
    that is not an ``ir.Op``: whether it is such a value (a load of a tensor of as many
    elements), or the expression it stands for (an in-kernel producer's body, whose ops count
    where they vary). An op is counted once however often it appears, as codegen computes
    equal ones once."""
    counted: set[ir.Op] = set()
    memo: dict[int, bool] = {}

    def visit(e: ir.Expr) -> bool:
        if id(e) in memo:
            return memo[id(e)]
        if isinstance(e, ir.Op):
            out = any([visit(a) for a in e.args])  # (every argument visited)
            if out:
                counted.add(e)
        else:
            verdict = leaf(e)
            out = verdict if isinstance(verdict, bool) else visit(verdict)
        memo[id(e)] = out
        return out

    visit(body)
    return sum(op_instructions(op.name) for op in counted)
