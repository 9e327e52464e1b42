"""Where a kernel computes an approximation instead of a correctly rounded sequence.

Eager's fp32 division and square root are correctly rounded, and so are fuse's (``th.div``,
``th.sqrt``): long instruction sequences on a GPU. Two patterns need no such rounding;
``KernelBody._render`` asks these functions before it renders an op:

- ``reciprocal_root``: ``1 / sqrt(v)`` in fp32 is one ``rsqrt``;
- ``rounded_to_half``: a quotient or root rounded to bf16/fp16 at once is Triton's ``/`` or
  ``tl.sqrt`` (``approximate`` renders them; an optimizer's list kernel,
  ``lowering/foreach_lists.py``, takes the same rule for its half-precision lists).
"""

from __future__ import annotations

from typing import Protocol

import sympy
import torch

from fusebackend import ir

Subst = dict[sympy.Symbol, sympy.Expr]


class KernelBody(Protocol):
    """What these functions use of ``codegen.body.KernelBody`` (which calls them)."""

    dims: dict[str, frozenset[str]]

    def value(self, expr: ir.Expr, subst: Subst) -> str: ...
    def dims_of(self, value: str) -> frozenset[str]: ...
    def resolve(self, load: ir.Load, subst: Subst) -> ir.Expr | None: ...
    def _emit(self, text: str, dims: frozenset[str]) -> str: ...
    def _constant(self, expr: ir.Expr, subst: Subst) -> ir.Constant | None: ...


def rounded_to_half(body: KernelBody, expr: ir.Op, subst: dict[sympy.Symbol, sympy.Expr]) -> ir.Rendered | None:
    """For an fp32 division or square root rounded to half precision at once (``expr`` a
    ``round_to`` or ``to`` fp16/bf16 of it): the quotient or root computed with Triton's
    approximate ``/`` or ``tl.sqrt``, within 2 ulp of fp32; else None.

    Correctly rounded division and root (``th.div``, ``th.sqrt``) are long instruction
    sequences. Per element in GRN's output kernel (ConvNeXt V2, b64 56x56x384 bf16, H100,
    2026-11-27) the division made it 248 us against 154 us approximate (Inductor's: 149 us).
    Rounded to bf16 or fp16, 2 ulp of fp32 change the result only where the exact value
    lies that close to a rounding boundary (about one element in 2**14 for bf16), and then
    by the one unit in the last place the rounding itself may cost."""
    if expr.name not in ("round_to", "to") or expr.dtype not in (torch.float16, torch.bfloat16):
        return None
    inner = expr.args[0]
    if not isinstance(inner, ir.Op) or inner.dtype != torch.float32 or inner.name not in ("truediv", "sqrt"):
        return None
    if all(body._constant(a, subst) is not None for a in inner.args):
        return None  # folded where it is rendered
    args = [body.value(a, subst) for a in inner.args]
    args = [a if a in body.dims else f"tl.full([], {a}, tl.float32)" for a in args]
    dims = frozenset().union(*(body.dims_of(a) for a in args))
    return ir.Rendered(body._emit(approximate(inner.name, args), dims), torch.float32)


def approximate(name: str, args: list[str]) -> str:
    """Triton's approximate fp32 quotient (``truediv``) or root (``sqrt``) of ``args``, within
    2 ulp: for a result rounded to half precision at once (``rounded_to_half``)."""
    return f"{args[0]} / {args[1]}" if name == "truediv" else f"tl.sqrt({args[0]})"


def reciprocal_root(body: KernelBody, expr: ir.Op, subst: dict[sympy.Symbol, sympy.Expr]) -> ir.Expr | None:
    """For an fp32 ``1 / sqrt(v)`` whose root is computed in this kernel: ``v``, so that it
    renders as one ``rsqrt``; else None.

    Batch norm's decomposition divides 1 by the correctly rounded root of the variance, and
    correctly rounded division and root are long instruction sequences on a GPU: at batch 1,
    where a kernel's time is the latency of its one pass, they made ResNet-50's batch norms
    1.8 us against 1.5 us for Inductor's (H100, 2026-11-25). ``rsqrt`` is within 2 ulp of
    the quotient, as Inductor's approximate division is, and ``torch.rsqrt`` on the GPU.
    """
    if expr.name != "truediv" or expr.dtype != torch.float32 or not isinstance(expr.args[1], ir.Load):
        return None
    one = body._constant(expr.args[0], subst)
    if one is None or one.value != 1.0:
        return None
    root = body.resolve(expr.args[1], subst)
    if isinstance(root, ir.Op) and root.name == "sqrt" and root.dtype == torch.float32:
        return root.args[0]
    return None
