"""Index helpers for ops whose every output element reads a small, static set of input positions.

Pooling windows and upsampling neighbours (``pooling.py``, ``upsampling.py``) are unrolled into a
pointwise body. A position that can fall outside the tensor (a window in the padding, a backward
window past the last output) is read at its index ``Clamp``-ed into range, so every load stays a
plain index that in-kernel producers inline into, and a mask (``where``) discards what it read.
Conditions the loop ranges decide are decided here, at lowering time: the common layers carry no
masks and no clamps.
"""

from __future__ import annotations

import math
from typing import Sequence

import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.indexing import Clamp, FloorDiv, ModIdx
from fusebackend.ir import Constant, Expr, cast, op
from fusebackend.lowering.graph import LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported

Cond = Expr | bool  # a mask: True (always), False (never) or a bool expression

# The most loads one output element's body unrolls; a larger window stays an ATen call (or, for
# an average over windows that tile the input, is a reduction: pooling.py).
MAX_UNROLLED = 256


def check_unrolled(count: int, what: str) -> None:
    if count > MAX_UNROLLED:
        raise Unsupported(f"{what} of {count} positions: too many to unroll")


def ranges_of(ctx: LoweringContext) -> dict[sympy.Symbol, int]:
    return {v: max(int(n), 1) for v, n in zip(ctx.vars, ctx.sizes)}


def index_value(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> ir.IndexValue:
    """A non-negative index expression as an int32 (int64 where it could overflow) value."""
    expr = indexing.simplify(sympy.sympify(expr), ranges)
    lo, hi = indexing.bounds(expr, ranges)
    assert lo >= 0, f"negative index value {expr}"
    return ir.IndexValue(expr, torch.int32 if hi < 2**31 else torch.int64)


def in_range(expr: sympy.Expr, lo: int, hi: int, ranges: dict[sympy.Symbol, int]) -> Cond:
    """Whether ``lo <= expr < hi``; decided here where the index ranges decide it."""
    expr = indexing.simplify(sympy.sympify(expr), ranges)
    a, b = indexing.bounds(expr, ranges)
    if a >= lo and b < hi:
        return True
    if b < lo or a >= hi:
        return False
    shift = max(0, -a)  # compared shifted: an index value is never negative
    value = index_value(expr + shift, ranges)
    parts: list[Cond] = []
    if a < lo:
        parts.append(op("ge", value, Constant(lo + shift, value.dtype), dtype=torch.bool))
    if b >= hi:
        parts.append(op("lt", value, Constant(hi + shift, value.dtype), dtype=torch.bool))
    return conj(*parts)


def conj(*conds: Cond) -> Cond:
    out: Cond = True
    for c in conds:
        if c is False or out is False:
            return False
        if c is True:
            continue
        out = c if out is True else op("logical_and", out, c, dtype=torch.bool)
    return out


def clamped(expr: sympy.Expr, size: int, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """``expr`` held inside [0, size): where it is out of range, a mask discards what it reads."""
    return settled(Clamp(sympy.sympify(expr), 0, size - 1), ranges)


def settled(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """``expr`` simplified for the index ranges, checked to divide no negative value."""
    out = indexing.simplify(sympy.sympify(expr), ranges)
    _check_divisions(out, ranges)
    return out


def _check_divisions(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> None:
    """Generated code divides with ``//`` and ``%``, which round toward zero on a GPU: every
    dividend must be non-negative."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, (FloorDiv, ModIdx)) and indexing.bounds(node.args[0], ranges)[0] < 0:
            raise Unsupported(f"an index divides a possibly negative value: {node}")


def masked(cond: Cond, value: Expr, other: float) -> Expr:
    if cond is True:
        return value
    assert cond is not False
    return op("where", cond, value, Constant(other, value.dtype))


def spatial_load(x: TensorArg, lead: Sequence[sympy.Expr], spatial: Sequence[sympy.Expr], dtype: torch.dtype) -> Expr:
    return cast(ir.Load(x.view, tuple(lead) + tuple(spatial)), dtype)


def total(values: Sequence[Expr], dtype: torch.dtype) -> Expr:
    if not values:
        return Constant(0.0, dtype)
    out = values[0]
    for v in values[1:]:
        out = op("add", out, v)
    return out


def product(factors: Sequence[Expr | int], acc: torch.dtype) -> Expr:
    """The product of window sizes (constants multiplied here), as a value of ``acc``."""
    const = math.prod(f for f in factors if isinstance(f, int))
    out: Expr | None = None if const == 1 else Constant(float(const), acc)
    for f in factors:
        if not isinstance(f, int):
            out = cast(f, acc) if out is None else op("mul", out, cast(f, acc))
    return out if out is not None else Constant(1.0, acc)
