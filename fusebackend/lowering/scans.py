"""Lowerings of prefix scans (cumsum, cumprod, logcumsumexp, cummax, cummin) to ``Scan`` nodes.

A scan's body is the scanned tensor read at the output's index, as a pointwise body would be, so
a pointwise producer fuses into the scan's kernel as its prologue and a pointwise consumer that
reads each result at its own element as its epilogue (``scheduler/scan_scatter_space.py``). Half types
accumulate in fp32; integer sums and products in int64 (eager's result dtype for integer and
bool inputs, and exact modulo 2**64 for a narrower requested dtype), then each result is cast
to the output's dtype once.
"""

from __future__ import annotations

from typing import Any

import torch

from fusebackend import ir
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_composite

aten = torch.ops.aten


def _accumulator(scan_type: str, out_dtype: torch.dtype) -> torch.dtype:
    if scan_type in ("sum", "prod") and not out_dtype.is_floating_point:
        return torch.int64
    return ir.compute_dtype(out_dtype)


def _scan(
    b: GraphLowering, x: TensorArg, dim: int, scan_type: str, out: torch.Tensor, value_dtype: torch.dtype,
) -> TensorArg:
    """A scan of ``x`` along ``dim`` into a buffer with ``out``'s dtype and layout; the body
    reads ``x`` as ``value_dtype``."""
    sizes = tuple(x.sizes)  # the traced sizes (``out`` is at the hints where they are symbolic)
    if out.dtype.is_complex or x.dtype.is_complex:
        raise Unsupported("scan of complex numbers")
    if not sizes or any(s == 0 for s in sizes):
        # a 0-dim tensor scans to itself (position 0), an empty one to nothing
        def single(ctx: LoweringContext) -> ir.Expr:
            if scan_type in ("argmax", "argmin"):
                return ir.Constant(0, out.dtype)
            return ctx.value(x, out.dtype)

        return b.pointwise(sizes, out.dtype, single, tuple(out.stride()))
    dim = dim % len(sizes)
    ctx = LoweringContext(torch.empty(tuple(out.shape), dtype=value_dtype, device="meta"), b.device, sizes=sizes)
    body = ctx.value(x, value_dtype)
    buf = b.new_buffer(sizes, out.dtype, tuple(out.stride()))
    return b.add_node(ir.Scan(buf, body, dim, scan_type, b.origin))


def _out(b: GraphLowering, k: int | None = None) -> torch.Tensor:
    return b.out_meta if k is None else b.out_meta[k]


@register_composite(aten.cumsum.default, symbolic=True)
def cumsum(b: GraphLowering, self: TensorArg, dim: int, dtype: Any = None) -> TensorArg:
    out = _out(b)
    return _scan(b, self, dim, "sum", out, _accumulator("sum", out.dtype))


@register_composite(aten.cumprod.default, symbolic=True)
def cumprod(b: GraphLowering, self: TensorArg, dim: int, dtype: Any = None) -> TensorArg:
    out = _out(b)
    return _scan(b, self, dim, "prod", out, _accumulator("prod", out.dtype))


@register_composite(aten.logcumsumexp.default, symbolic=True)
def logcumsumexp(b: GraphLowering, self: TensorArg, dim: int) -> TensorArg:
    out = _out(b)
    if not out.dtype.is_floating_point:
        raise Unsupported("logcumsumexp of a non-float tensor")
    return _scan(b, self, dim, "logsumexp", out, _accumulator("logsumexp", out.dtype))


def _extreme(kind: str) -> None:
    """torch.cummax / torch.cummin: the running extreme and its position, two scans of one body
    that the scheduler puts in one kernel."""

    def lower(b: GraphLowering, self: TensorArg, dim: int) -> tuple[TensorArg, TensorArg]:
        values_meta, indices_meta = _out(b, 0), _out(b, 1)
        compare = ir.compute_dtype(self.dtype)
        values = _scan(b, self, dim, kind, values_meta, compare)
        indices = _scan(b, self, dim, f"arg{kind}", indices_meta, compare)
        return values, indices

    lower.__name__ = f"cum{kind}"
    register_composite(getattr(aten, f"cum{kind}").default, symbolic=True)(lower)


_extreme("max")
_extreme("min")
