"""Index helpers for ops whose every output element reads a small, static set of input positions.

Pooling windows and upsampling neighbours (``pooling.py``, ``upsampling.py``) are unrolled into a
pointwise body. A position that can fall outside the tensor (a window in the padding, a backward
window past the last output) is read at its index ``Clamp``-ed into range, so every load stays a
plain index that in-kernel producers inline into, and a mask (``where``) discards what it read.
Conditions the loop ranges decide are decided here, at lowering time: the common layers carry no
masks and no clamps.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Sequence

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


# ------------------------------------------------------------------------- sliding windows


def expand(value: Any, nd: int, name: str) -> tuple[int, ...]:
    """An int or a list of 1 or ``nd`` ints, as ``nd`` ints."""
    items = [value] if isinstance(value, int) else list(value)
    if len(items) == 1:
        items = items * nd
    if len(items) != nd or not all(isinstance(v, int) for v in items):
        raise Unsupported(f"{name}={value!r}")
    return tuple(items)


@dataclasses.dataclass(frozen=True)
class Window:
    """One spatial dim of a pool or a convolution: output ``i`` reads ``i*stride - padding +
    k*dilation`` for each window position ``k``."""

    kernel: int
    stride: int
    padding: int
    dilation: int
    in_size: int
    out_size: int

    def start(self, i: sympy.Expr) -> sympy.Expr:
        return i * self.stride - self.padding

    @property
    def reach(self) -> int:
        """The window positions that can hold an input element: position ``k`` of the first
        window reads ``k*dilation - padding``, and later windows read further on, so positions
        from ``(in_size - 1 + padding) // dilation + 1`` on never do. A kernel larger than the
        input (transformers' EfficientNet pools 7x7 with a 1280x1280 kernel, in ``ceil_mode``)
        unrolls what the input holds."""
        return min(self.kernel, (self.in_size - 1 + self.padding) // self.dilation + 1)

    def covering(self) -> int:
        """How many windows can cover one input element."""
        return (self.kernel - 1) * self.dilation // self.stride + 1


def windows_of(x: TensorArg, out_sizes: Sequence[int], nd: int, kernel_size: Any, stride: Any, padding: Any,
               dilation: Any = 1) -> tuple[Window, ...]:
    """The windows of an ``nd``-d pool or convolution of ``x`` (its last ``nd`` dims); a stride
    of ``()`` or None is the kernel's size, as pooling's default."""
    if len(x.sizes) not in (nd + 1, nd + 2):
        raise Unsupported(f"a {nd}d window over a {len(x.sizes)}-dim tensor")
    k = expand(kernel_size, nd, "kernel_size")
    s = expand(stride, nd, "stride") if stride not in (None, [], ()) else k
    p = expand(padding, nd, "padding")
    d = expand(dilation, nd, "dilation")
    ins, outs = x.sizes[-nd:], tuple(out_sizes)[-nd:]
    if min(k + s + d) < 1 or min(p) < 0 or 0 in ins or 0 in outs:
        raise Unsupported("an empty window")
    return tuple(Window(*w) for w in zip(k, s, p, d, ins, outs))


def taps(windows: Sequence[Window], out_vars: Sequence[sympy.Expr], ranges: dict[sympy.Symbol, int]
         ) -> list[tuple[tuple[int, ...], tuple[sympy.Expr, ...], Cond]]:
    """Every window position that can hold an input element: (its position in the window, its
    index held inside the input, whether it is inside), in row-major window order."""
    out = []
    for offsets in itertools.product(*(range(w.reach) for w in windows)):
        index = [w.start(v) + o * w.dilation for w, v, o in zip(windows, out_vars, offsets)]
        valid = conj(*(in_range(e, 0, w.in_size, ranges) for e, w in zip(index, windows)))
        if valid is not False:
            out.append((offsets, tuple(clamped(e, w.in_size, ranges) for e, w in zip(index, windows)), valid))
    return out
