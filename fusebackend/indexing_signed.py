"""Divisions of index operands that may be negative, as a kernel must compute them.

The index rules (``indexing.FloorDiv``, ``ModIdx``) are floor division's; Triton's ``//`` and
``%`` round toward zero, which differs below zero. ``floored`` marks each division or remainder
whose operand the kernel's ranges do not prove non-negative; the marked ones print as calls of
``th.floordiv`` / ``th.floormod`` (``kernels/triton_helpers.py``). A view that shifts an index
down (a slice's backward, ``(i - 1023) % 16`` split over a reshape) or a masked lane's position
can divide a negative value.
"""

from __future__ import annotations

import sympy

from fusebackend.indexing import FloorDiv, ModIdx, Ranges, UnknownSign, bounds, known_nonneg


class SignedFloorDiv(sympy.Function):
    """``FloorDiv`` of an operand not proven non-negative. No rules of its own: it is made last,
    for the text."""
    is_integer = True

    def _sympystr(self, printer: sympy.printing.str.StrPrinter) -> str:
        return f"th.floordiv({printer._print(self.args[0])}, {printer._print(self.args[1])})"


class SignedModIdx(sympy.Function):
    """``ModIdx`` of an operand not proven non-negative."""
    is_integer = True
    is_nonnegative = True

    def _sympystr(self, printer: sympy.printing.str.StrPrinter) -> str:
        return f"th.floormod({printer._print(self.args[0])}, {printer._print(self.args[1])})"


def floored(expr: sympy.Expr, ranges: Ranges) -> sympy.Expr:
    """``expr`` with each division or remainder whose operand the ranges do not prove
    non-negative made a ``SignedFloorDiv``/``SignedModIdx``."""
    if not expr.atoms(FloorDiv, ModIdx):
        return expr
    return _floored(expr, ranges)


def _floored(expr: sympy.Expr, ranges: Ranges) -> sympy.Expr:
    if not expr.args:
        return expr
    args = [_floored(a, ranges) for a in expr.args]
    if isinstance(expr, (FloorDiv, ModIdx)):
        try:
            signed = not known_nonneg(bounds(expr.args[0], ranges)[0])
        except UnknownSign:
            signed = True
        if signed:
            return (SignedFloorDiv if isinstance(expr, FloorDiv) else SignedModIdx)(*args)
        return expr.func(*args, evaluate=False)
    return expr.func(*args)
