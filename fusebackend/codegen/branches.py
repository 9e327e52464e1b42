"""What a value is rendered under: a ``where``'s branch on the index alone, and a concatenation
part's guard (``KernelBody.branch``, ``KernelBody.guard``).

A select_scatter's, a slice_scatter's and a pad's value, and a padded window's taps (a
depthwise convolution's, a pool's), are ``where(c, a, b)`` with ``c`` computed from the index
alone; a concatenation's part is read where its ``valid`` holds. Each branch or part is
rendered under its condition: its memory loads are masked by it, so that blocks outside it read
nothing of it, and what the condition proves narrows its indices (``KernelBody.narrowed``: a
clamp that keeps a source index inside the tensor elsewhere is not needed there).
"""

from __future__ import annotations

import math

from typing import TYPE_CHECKING

import sympy
import torch

from fusebackend import indexing, ir
from fusebackend.codegen.kernel_header import sizes_in
from fusebackend.sizevars import size_hint

if TYPE_CHECKING:
    from fusebackend.codegen.body import KernelBody

# an index expression, the symbol standing for its offset from its least value, that value and
# its extent (``KernelBody.narrowed``)
Narrowed = tuple[sympy.Expr, sympy.Symbol, indexing.Size, indexing.Size]

# A branch's load of a tensor with at most 1/this of the kernel's elements is not masked by the
# branch where its indices stay inside the tensor (``masked_by_branch``).
UNMASKED = 8


def on_index_alone(cond: ir.Expr) -> bool:
    """Whether ``cond`` is computed from index values and constants alone (no load)."""
    return not isinstance(cond, ir.Rendered) and any(isinstance(e, ir.IndexValue) for e in ir.walk(cond)) and all(
        isinstance(e, (ir.IndexValue, ir.Constant, ir.Op)) for e in ir.walk(cond))


def where_in_branches(body: KernelBody, expr: ir.Op, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
    """``where(c, a, b)`` with ``c`` computed from the index alone: ``a``'s memory loads
    masked by ``c`` and ``b``'s by its negation (``branch``). Swin's q, k and v gradients,
    stacked by three select_scatters into a block of 288 columns and summed over its rows,
    were read all three at every element: its 12 kernels took 1370 us a training step at
    19% of their floor, now 861 us at 30% (H200, bf16, b64, 2026-12-02)."""
    cond = body.value(expr.args[0], subst)
    # not a literal (one branch taken everywhere), and not along the rows, where the
    # positions a branch leaves out are few (a split's padded chunk) or scattered (a causal
    # mask) and its loads may serve the kernel's other values, which would load them again
    if cond not in body.dims or "r" in body.dims_of(cond):
        return body.value(ir.Op("where", (ir.Rendered(cond, torch.bool),) + expr.args[1:], expr.dtype), subst)
    outer, outer_narrowed, outer_even = body.branch, body.narrowed, body.even
    branches: list[str | None] = []
    taken_by: list[str | None] = []  # each branch's condition, as its loads are masked by it
    try:
        for arg, negated in ((expr.args[1], False), (expr.args[2], True)):
            if not ir.loads(arg):
                branches.append(None)
                taken_by.append(None)
                continue
            scalar = cond in body.scalar_temps
            taken = body.bool_temp(f"{cond} == 0", body.dims_of(cond), scalar) if negated else cond
            body.branch = taken if outer is None else body.bool_temp(
                f"{outer} & {taken}", body.dims_of(outer) | body.dims_of(taken),
                scalar and outer in body.scalar_temps)
            if not negated:
                narrowed, even = branch_facts(body, expr.args[0], subst)
                body.narrowed, body.even = outer_narrowed + narrowed, outer_even + even
            else:
                body.narrowed, body.even = outer_narrowed, outer_even
            branches.append(body.value(arg, subst))
            taken_by.append(body.branch)
    finally:
        body.branch, body.narrowed, body.even = outer, outer_narrowed, outer_even
    for i, (value, other) in enumerate(((branches[0], expr.args[2]), (branches[1], expr.args[1]))):
        # where(c, x, 0) with x a load masked by c (other=0), or what keeps its 0 (zero_preserved):
        # x itself (a pad's taps: one select an element each, after loads that give 0 outside)
        if (value is not None and body.zero_outside.get(value) == taken_by[i] and _zero(other)
                and expr.args[1 + i].dtype == expr.dtype):
            return value
    args = [ir.Rendered(cond, torch.bool)] + [
        a if r is None else ir.Rendered(r, a.dtype) for a, r in zip(expr.args[1:], branches)]
    return body.value(ir.Op("where", tuple(args), expr.dtype), subst)


def _positive(expr: ir.Expr) -> bool:
    """A finite constant above 0: a product or quotient with it keeps 0 as +0 (not -0)."""
    return (isinstance(expr, ir.Constant) and expr.dtype != torch.bool and math.isfinite(expr.value)
            and expr.value > 0)


def zero_preserved(expr: ir.Op, args: list[str], zero_outside: dict[str, str]) -> str | None:
    """The branch condition outside which ``expr`` is 0, where it maps 0 to 0 and one argument
    is 0 outside it (``KernelBody.zero_outside``): a cast, a product with or a quotient by a
    positive finite constant (not a negation or a negative constant, which would give -0 where
    the where gives +0; not a product with a tensor, which may hold inf); a rounding to half
    precision kept in fp32 (``round_to``) is a cast."""
    if expr.dtype == torch.bool or not args or args[0] not in zero_outside and (
            expr.name != "mul" or args[-1] not in zero_outside):
        return None
    if expr.name in ("to", "round_to"):
        return zero_outside[args[0]]
    if expr.name == "mul":
        k = 0 if args[0] in zero_outside else 1
        return zero_outside[args[k]] if _positive(expr.args[1 - k]) else None
    if expr.name == "truediv" and args[0] in zero_outside and _positive(expr.args[1]):
        return zero_outside[args[0]]
    return None


def _zero(expr: ir.Expr) -> bool:
    """Whether ``expr`` is the constant +0 (of a number type; not -0.0, which a masked load's
    other=0 is not)."""
    return (isinstance(expr, ir.Constant) and expr.dtype != torch.bool and expr.value == 0
            and math.copysign(1.0, expr.value) > 0)


def branch_facts(body: KernelBody, cond: ir.Expr, subst: dict[sympy.Symbol, sympy.Expr]
                 ) -> tuple[tuple[Narrowed, ...], tuple[sympy.Expr, ...]]:
    """What ``cond`` proves where it holds: as ``narrowed`` entries, each index it bounds by
    comparisons with constants (``i >= lo``, ``i <= hi``, joined by ``logical_and``) lies in
    the interval they leave; and the indices it proves even (``i % 2 == 0``: ``even``). A
    slice_scatter's source index, clamped into the slice for the elements outside it, needs no
    clamp where the element is inside: EVA-02's rotary
    backward scatters into every other head dim, and its 12 kernels computed two clamps of
    the head dim for each of their 3 loads an element. The branch's loads are masked by
    ``cond`` (``load``, ``indirect_load``), so no lane forms an address outside where it
    is false. An index times a positive constant plus a constant is bounded so too: a
    padded window's tap at ``w + 2`` is taken where ``w + 2 < W + 1``, so its source
    ``w + 1`` needs no clamp at the right edge, nor ``2 * w - 2`` (a window of stride 2)
    where ``2 * w >= 2``. Comparisons of an index that is a sum of several are left out
    (``_one_index``)."""
    found: dict[sympy.Expr, list[int | sympy.Expr]] = {}
    evens: list[sympy.Expr] = []
    stack = [cond]
    while stack:
        c = stack.pop()
        if not isinstance(c, ir.Op):
            continue
        if c.name == "logical_and":
            stack.extend(c.args)
            continue
        if c.name not in ("ge", "gt", "le", "lt", "eq") or not isinstance(c.args[0], ir.IndexValue):
            continue
        bound = c.args[1]
        if not isinstance(bound, ir.Constant) or isinstance(bound.value, bool) or not isinstance(bound.value, int):
            continue
        e = body.simplify(sympy.sympify(c.args[0].index).xreplace(subst))
        if c.name == "eq":  # a slice's step of 2: (i + k) % 2 == 0 where taken
            if isinstance(e, indexing.ModIdx) and e.args[1] == 2 and bound.value == 0:
                evens.append(e.args[0])
            continue
        shift, e = e.as_coeff_Add()  # a * i + s against k bounds i by (k - s) / a
        scale, e = e.as_coeff_Mul()
        if not (shift.is_Integer and scale.is_Integer and scale > 0 and _one_index(e)):
            continue
        interval = found.setdefault(e, list(indexing.bounds(e, body.ranges)))
        a, k = int(scale), int(bound.value) - int(shift)
        if c.name in ("ge", "gt"):  # a * i >= k (+ 1): i >= ceil(k / a)
            interval[0] = max(interval[0], -(-(k + (c.name == "gt")) // a))
        else:  # a * i <= k (- 1): i <= floor(k / a)
            interval[1] = min(interval[1], (k - (c.name == "lt")) // a)
    entries = []
    for e, (lo, hi) in found.items():
        if isinstance(lo, int) and isinstance(hi, int) and lo <= hi:
            entries.append((e, indexing.var(f"part{len(body.narrowed) + len(entries)}"), lo, hi - lo + 1))
    return tuple(entries), tuple(evens)


def masked_by_branch(body: KernelBody, view: ir.View, idx: list[sympy.Expr]) -> bool:
    """Whether a memory load in a branch of a ``where`` on the index alone is masked by the
    branch's condition. It is, unless it reads a tensor of at most 1/``UNMASKED`` of
    the kernel's elements (a per-channel scale: cached lines, no traffic to save) at
    indices inside the tensor over the kernel's whole ranges. Such a load stays one
    instruction for all the branches that read it: a padded depthwise convolution reads
    its batch norm's four scales at each of its 9 taps, each tap a branch; masked, they
    were 36 loads and 9 square roots an element where 4 and 1 do (transformers'
    MobileNetV2, b64, bf16: 58 loads in its first block's kernel, 26 unmasked)."""
    if view.distinct_elements() * UNMASKED > size_hint(body.space.xnumel * max(body.space.rnumel, 1)):
        return True
    for i, size in zip(idx, view.sizes):
        if sizes_in(size):
            return True
        lo, hi = indexing.bounds(indexing.simplify(i, body.ranges), body.ranges)
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo and hi < int(size)):
            return True
    return False


def _one_index(e: sympy.Expr) -> bool:
    """Whether ``e`` is one index expression (not a sum of several): one subtree that
    substitution finds in the offsets it narrows."""
    return e.is_Symbol or isinstance(e, (indexing.FloorDiv, indexing.ModIdx))


def part_narrowing(body: KernelBody, expr: ir.IndirectLoad, subst: dict[sympy.Symbol, sympy.Expr]
                   ) -> Narrowed | None:
    """What a concatenation part's ``valid`` proves: its position ``e - start`` lies in [0, the
    part's size), so ``e`` lies in [start, start + size). None where the position is not one
    index expression plus a constant. The position is simplified as the loads' offsets are, so
    that it is the subtree they hold: a tiled kernel's ``(y_index + x_inner // 64) % 257`` is
    their ``y_index % 257`` where ``x_inner < 64``."""
    position = ir.affine_index(expr.position)
    if position is None:
        return None
    shift, e = body.simplify(sympy.sympify(position).xreplace(subst)).as_coeff_Add()
    if not shift.is_Integer or not _one_index(e):
        return None
    return e, indexing.var(f"part{len(body.narrowed)}"), -int(shift), expr.view.sizes[expr.dim]


def inlined_part(body: KernelBody, expr: ir.IndirectLoad, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
    """A load at computed positions (a concatenation's part) of a buffer computed in this
    kernel: the producer's value there, rendered under ``valid`` (its memory loads masked by
    it, since its indices run outside the part where it is false), and 0 where it is false.
    The scheduler fuses only such loads (``scheduler.space._check_rows``); gathers read memory."""
    idx = expr.computed_index()
    assert idx is not None, "gathers read from memory"
    producer = body.producers[expr.view.buffer.name]
    here = [sympy.sympify(i).xreplace(subst) for i in idx]
    if expr.valid is None:
        return body.value(body.as_stored(producer, body.inlined(producer, expr.view, here)), {})
    valid = body.value(expr.valid, subst)
    outer, outer_narrowed = body.guard, body.narrowed
    body.guard = valid
    if outer is not None:  # a part of a part (nested concatenations)
        body.guard = body.bool_temp(f"{outer} & {valid}", body.dims_of(outer) | body.dims_of(valid),
                                    outer in body.scalar_temps and valid in body.scalar_temps)
    narrowing = part_narrowing(body, expr, subst)
    if narrowing is not None:
        body.narrowed = outer_narrowed + (narrowing,)
    try:
        inner = body.value(body.as_stored(producer, body.inlined(producer, expr.view, here)), {})
    finally:
        body.guard, body.narrowed = outer, outer_narrowed
    dtype = producer.buffer.dtype
    return body.value(ir.Op("where", (ir.Rendered(valid, torch.bool), ir.Rendered(inner, dtype),
                                      ir.Constant(ir._convert_scalar(0, dtype), dtype)), dtype), {})
