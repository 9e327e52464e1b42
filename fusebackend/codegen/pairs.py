"""Pairs of neighbours along a kernel's lanes read by one contiguous load.

An interleaved rotary embedding reads ``x[..., 1::2]`` beside ``x[..., ::2]`` (and its backward's
slice_scatters read their sources so): each lane at ``2 * (lane // 2) + c``, an offset no vector
load covers. ``pair_load`` finds such an offset and gives the contiguous load that holds both
elements of every pair; the kernel takes element ``c`` of each pair in registers
(``th.pair_take``, ``KernelBody._emit_pair_load``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from fusebackend import indexing
from fusebackend.buffers import Buffer
from fusebackend.scheduler.space import R

if TYPE_CHECKING:
    from fusebackend.codegen.body import KernelBody


def pair_load(body: KernelBody, raw: sympy.Expr, buffer: Buffer) -> tuple[sympy.Expr, int] | None:
    """A load that reads one element of each pair of neighbours along the block's lanes,
    ``rest + 2 * ((lane + k) // 2)`` for an even ``k``, as a contiguous load of ``rest - c +
    lane + k`` and element ``c`` of each pair taken in registers (``th.pair_take``), ``c``
    the parity of ``rest``'s constant (so that the contiguous load starts where the pairs
    do). An interleaved rotary embedding reads its pairs so (``x[..., 1::2]`` beside
    ``x[..., ::2]``, and its backward's slice_scatters): loaded element by element, each
    lane of a thread's vector one instruction, EVA-02's rotary backward took 123 us over 38
    MB (H200, bf16, b64; 9 us at the copy's bandwidth); read so, its 12 kernels take 272 us a
    training step where they took 1474 (2026-12-03).

    The contiguous load reads the other element of each pair too, so it is taken only where
    its offsets stay within the buffer over the kernel's whole ranges, and where the lanes'
    mask keeps both elements of a pair or neither (the lane extent even or whole blocks).
    It is masked by the lanes' extent alone: a guard's or a branch's lanes read values in
    range that their ``where`` discards. None where the offset is not of that form.

    ``raw``: the load's offset as lowered; the form and the bounds are read from it
    simplified but not yet taken at the block's start (``KernelBody.index``), where the kernel's
    ranges bound it (``xindex - 64 * (xoffset // 64)`` is not known to be >= 0). Returns
    the contiguous load's offset, as ``KernelBody.index`` gives it, and ``c``."""
    if body.lanes is None:
        return None
    lane, block = body.lanes
    offset = body.simplify(raw)
    terms = sympy.Add.make_args(offset)
    def pair_of(t: sympy.Expr) -> sympy.Expr | None:  # 2 * (inner // 2) with inner along the lanes
        coeff, q = t.as_coeff_Mul()
        return q.args[0] if (coeff == 2 and isinstance(q, indexing.FloorDiv) and q.args[1] == 2
                             and lane in q.args[0].free_symbols) else None

    paired = [t for t in terms if pair_of(t) is not None]
    if block < 2 or block % 2 or len(paired) != 1 or not all(
            _pair_invariant(t, lane) for t in terms if t is not paired[0] and lane in t.free_symbols):
        return None
    inner = pair_of(paired[0])
    along = [t for t in sympy.Add.make_args(inner) if lane in t.free_symbols and not _pair_invariant(t, lane)]
    if len(along) != 1 or not _pair_aligned(along[0], lane):
        return None  # the lane itself, or its remainder by an even size: pairs kept whole
    shift = 0
    for t in sympy.Add.make_args(inner):
        c = t.as_coeff_Mul()[0]
        if t.is_Integer:
            shift = int(t) % 2
        elif t is not along[0] and not (c.is_Integer and int(c) % 2 == 0 and _pair_invariant(t, lane)):
            return None
    # An odd shift pairs each lane with its other neighbour; where the branch is taken only
    # on lanes that make the shifted index even (a slice from 1 with a step of 2), those
    # lanes read their own element, ``rest + inner``: the element before them in a pair.
    if shift and not any(_same_parity(inner, e, lane) for e in body.even):
        return None
    axis = "r" if lane == R else "x"
    extent = body.space.rnumel if axis == "r" else body.space.xnumel
    if axis not in body.exact and not (isinstance(extent, int) and extent % 2 == 0):
        return None
    rest = offset - paired[0]
    taken = int(rest.as_coeff_Add()[0]) % 2
    contiguous = rest + inner + (1 - taken if shift else -taken)
    lo, hi = indexing.bounds(contiguous, body.ranges)
    reach = sum((size - 1) * stride for size, stride in zip(buffer.sizes, buffer.strides))
    if not (isinstance(lo, int) and isinstance(hi, int) and isinstance(reach, int) and 0 <= lo and hi <= reach):
        return None
    return body.index(contiguous), taken


def _even(size: sympy.Expr) -> bool:
    return size.is_Integer and int(size) % 2 == 0


def _pair_aligned(e: sympy.Expr, lane: sympy.Symbol) -> bool:
    """Whether ``e`` is ``lane``, or its remainder by an even size (of such a remainder): the
    lanes of each pair (``2k``, ``2k + 1``) stay neighbours in it, the even one first."""
    while isinstance(e, indexing.ModIdx) and _even(e.args[1]):
        e = e.args[0]
    return e == lane


def _pair_invariant(t: sympy.Expr, lane: sympy.Symbol) -> bool:
    """Whether ``t`` is the same for both lanes of each pair: it reads ``lane`` only through
    quotients of ``_pair_aligned`` values by even sizes."""
    stand_in = sympy.Dummy("pair", integer=True, nonnegative=True)
    quotients = {q: stand_in for q in t.atoms(indexing.FloorDiv)
                 if _pair_aligned(q.args[0], lane) and _even(q.args[1])}
    return lane not in t.xreplace(quotients).free_symbols


def _same_parity(a: sympy.Expr, b: sympy.Expr, lane: sympy.Symbol) -> bool:
    """Whether ``a - b`` is even for every value of the variables: their difference, with a
    remainder of ``lane`` by an even size taken as ``lane`` itself, has even coefficients."""
    def plain(e: sympy.Expr) -> sympy.Expr:
        return e.xreplace({m: lane for m in e.atoms(indexing.ModIdx) if _pair_aligned(m, lane)})
    diff = sympy.expand(plain(a) - plain(b))
    return all(t.as_coeff_Mul()[0].is_Integer and int(t.as_coeff_Mul()[0]) % 2 == 0
               for t in sympy.Add.make_args(diff) if t != 0)
