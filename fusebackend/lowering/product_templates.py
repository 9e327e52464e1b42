"""Matrix products as generated kernels that take their epilogues (``config.product_templates``).

``mm`` and ``addmm`` of 2-d matrices and ``bmm`` of 3-d ones become one ``ir.Reduction`` marked
``product``: the sums over K of ``mat1[i, k] * mat2[k, j]`` (a bmm's per batch) in the accumulation dtype, then a pointwise node for alpha, the
bias and the cast to the product's dtype, as eager's library call rounds once at the end. The
scheduler fuses what reads the product into its kernel as into any reduction's (a bias, an
activation, a residual, a cast: by the bytes they save), and ``codegen/product.py`` generates the
kernel with ``tl.dot`` over tiles of the output, the epilogue computed on the accumulator's tile
before the one store.

When (``auto``): under ``mode="max-autotune"`` in Triton's interpreter, where the tests run every
generated product; on a GPU the library's call stays until a timed choice between the two is made
per shape. ``always`` generates every product that fits, ``never`` none. A product fits where its
sizes are static, its dtype is a float one ``tl.dot`` takes (fp32, fp16, bf16), and M, N and K are
at least ``MIN_DIM`` with K a multiple of it (tiles of at least 16 along each dim: ``tl.dot``'s
least, and no mask along K).
"""

from __future__ import annotations

from typing import Any

import torch

from fusebackend import indexing, ir, sizevars
from fusebackend.config import config, use_interpreter
from fusebackend.lowering.values import LoweringContext, TensorArg

MODES = ("auto", "always", "never")
MIN_DIM = 16
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def wanted(autotune: bool) -> bool:
    """Whether a graph's products are generated where they fit (``config.product_templates``;
    ``autotune``: the graph is compiled under mode="max-autotune")."""
    mode = config.product_templates
    if mode not in MODES:
        raise ValueError(f"FUSE_PRODUCT_TEMPLATES={mode!r}: choose from {', '.join(MODES)}")
    if mode == "auto":
        return autotune and use_interpreter()
    return mode == "always"


def template_product(b: Any, bias: TensorArg | None, mat1: Any, mat2: Any, beta: Any = 1,
                     alpha: Any = 1) -> TensorArg | None:
    """``alpha * mat1 @ mat2 + beta * bias`` (``mat1`` and ``mat2`` 2-d, or 3-d of one batch) as a
    product reduction and its pointwise result;
    None where the product is not generated (see the module's docstring)."""
    if not wanted(b.autotune) or not (isinstance(mat1, TensorArg) and isinstance(mat2, TensorArg)):
        return None
    dims = mat1.meta.dim()
    if dims not in (2, 3) or mat2.meta.dim() != dims or sizevars.symbolic(tuple(mat1.sizes) + tuple(mat2.sizes)):
        return None
    *batch, m, k = tuple(mat1.sizes)
    n = mat2.sizes[-1]
    if tuple(mat2.sizes[:-2]) != tuple(batch) or 0 in batch:
        return None
    if mat1.dtype not in DTYPES or mat2.dtype != mat1.dtype or min(m, n, k) < MIN_DIM or k % MIN_DIM:
        return None
    if bias is not None and (bias.meta.dim() != 1 or bias.dtype != mat1.dtype):
        return None
    acc = ir.compute_dtype(mat1.dtype)
    *ib, i, j = indexing.loop_vars("i", dims)
    (r,) = indexing.loop_vars("r", 1)
    body = ir.op("mul", ir.cast(ir.Load(mat1.view, (*ib, i, r)), acc), ir.cast(ir.Load(mat2.view, (*ib, r, j)), acc))
    buf = b.new_buffer((*batch, m, n), acc)
    b.nodes.append(ir.Reduction(buf, body, (k,), "sum", (*batch, m, n, k), (*ib, i, j, r), b.origin, product=True))
    return product_result(b, b._tensor_arg(buf, b.meta(buf)), bias, beta, alpha)


def product_result(b: Any, sums: TensorArg, bias: TensorArg | None, beta: Any, alpha: Any) -> TensorArg:
    """The op's result from the sums of a generated product [M, N] (in the accumulation dtype):
    times ``alpha``, plus ``beta`` times the bias (a row of N, or one value), in the op's dtype."""
    acc = sums.dtype
    meta = b.out_meta

    def result(ctx: LoweringContext) -> ir.Expr:
        *ib, i, j = ctx.vars
        out: ir.Expr = ir.Load(sums.view, (*ib, i, j))
        if alpha != 1:
            out = ir.op("mul", out, ir.Constant(float(alpha), acc))
        if bias is not None and beta != 0:  # beta 0: the bias is not read (eager ignores even NaN there)
            term = ir.cast(ir.Load(bias.view, (j if bias.sizes[0] != 1 else 0,)), acc)
            out = ir.op("add", out, term if beta == 1 else ir.op("mul", term, ir.Constant(float(beta), acc)))
        return out

    return b.pointwise(tuple(meta.shape), meta.dtype, result, tuple(meta.stride()))
