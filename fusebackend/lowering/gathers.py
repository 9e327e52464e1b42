"""Gathers: ATen ops that read a tensor at positions held in index tensors, as indirect loads.

``embedding``, ``index_select``, ``gather`` and advanced indexing (``index.Tensor``: ``x[i]``,
``x[i, :, j]``, ``x[:, i]`` with broadcast index tensors) each become one pointwise node whose
body is an ``ir.IndirectLoad``: the gathered tensor read at the loop index along its other dims
and at the loaded index value along the gathered ones. The index tensors are plain loads, so
whatever computes them fuses into the gather, and the gather into what reads its result
(``embedding(ids) + pos`` is one kernel). The gathered tensor itself is read from memory
(``scheduler/space.py``).

Positions are checked (``IndirectLoad.checked``): the kernel asserts that each lies in its dim,
as eager raises an index error, and reads nothing where one does not. ``index.Tensor`` wraps
negative positions first, as eager does; the others take them as out of range, as eager does.
Boolean and byte masks (``x[mask]``) stay ATen calls: their output's size depends on the data.
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from fusebackend import ir
from fusebackend.ir import Constant, Expr, cast, op
from fusebackend.lowering.graph import LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_pointwise
from fusebackend.lowering.values import size_value

aten = torch.ops.aten

_INDEX_DTYPES = (torch.int64, torch.int32)


def _load_at(arg: TensorArg, idx: Sequence[sympy.Expr]) -> ir.Load:
    """``arg`` read at ``idx`` (one entry per dim; size-1 dims read at 0, as broadcasting does)."""
    view = arg.view
    return ir.Load(view, tuple(sympy.Integer(0) if s == 1 else i for s, i in zip(view.sizes, idx)))


def _index_tensor(arg: Any) -> TensorArg:
    if not isinstance(arg, TensorArg):
        raise Unsupported(f"index of type {type(arg).__name__}")
    if arg.dtype not in _INDEX_DTYPES:
        raise Unsupported(f"index tensor of {arg.dtype}")  # bool and byte masks: data-dependent sizes
    return arg


def _broadcast(shapes: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
    """The index tensors' broadcast shape, their sizes aligned on the last dims: each dim's size
    where one is not 1 (sizes that are expressions in size symbols are never 1: Dynamo's symbols
    are at least 2); sizes that differ (structurally, for expressions) raise as eager would."""
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        sizes = {s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0} - {1}
        if len(sizes) > 1:
            raise Unsupported(f"index tensors of sizes {list(shapes)} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _checked(view: ir.View, idx: Sequence[sympy.Expr], positions: Sequence[tuple[int, Expr]]) -> ir.IndirectLoad:
    (dim, position), *more = positions
    return ir.IndirectLoad(view, tuple(idx), dim, position, more=tuple(more), checked=True)


@register_pointwise(aten.embedding.default, symbolic=True)
def embedding(
    ctx: LoweringContext, weight: Any, indices: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Expr:
    """``out[s..., j] = weight[indices[s...], j]`` (``padding_idx`` matters to the backward only)."""
    ids = _index_tensor(indices)
    if len(weight.sizes) != 2:
        raise Unsupported("embedding of a weight that is not 2-D")
    nids = len(ids.sizes)
    position = cast(_load_at(ids, ctx.vars[:nids]), torch.int64)
    return _checked(weight.view, (sympy.Integer(0), ctx.vars[nids]), [(0, position)])


@register_pointwise(aten.index_select.default, symbolic=True)
def index_select(ctx: LoweringContext, self: Any, dim: int, index: Any) -> Expr:
    idx = _index_tensor(index)
    rank = len(self.sizes)
    if rank == 0 or len(idx.sizes) > 1:
        raise Unsupported("index_select of a 0-dim tensor or with a multi-dim index")
    dim = dim % rank
    position = cast(_load_at(idx, (ctx.vars[dim],)[: len(idx.sizes)]), torch.int64)
    at = tuple(sympy.Integer(0) if k == dim else ctx.vars[k] for k in range(rank))
    return _checked(self.view, at, [(dim, position)])


@register_pointwise(aten.gather.default, symbolic=True)
def gather(ctx: LoweringContext, self: Any, dim: int, index: Any, sparse_grad: bool = False) -> Expr:
    """``out[i] = self[i with i[dim] replaced by index[i]]``; ``index`` has the output's shape."""
    idx = _index_tensor(index)
    rank = len(self.sizes)
    if rank == 0 or len(idx.sizes) != rank:
        raise Unsupported("gather of a 0-dim tensor")
    dim = dim % rank
    position = cast(_load_at(idx, ctx.vars[:rank]), torch.int64)
    at = tuple(sympy.Integer(0) if k == dim else ctx.vars[k] for k in range(rank))
    return _checked(self.view, at, [(dim, position)])


@register_pointwise(aten.index.Tensor, aten.index.Tensor_hacked_twin, symbolic=True)
def index(ctx: LoweringContext, self: Any, indices: Any) -> Expr:
    """Advanced indexing: the index tensors broadcast together to a shape B; the output holds B
    where the indexed dims were when they are adjacent, and first otherwise (NumPy's rule), with
    the dims not indexed around it in order. Negative positions count from the end."""
    rank = len(self.sizes)
    entries = list(indices) + [None] * (rank - len(indices))
    if rank == 0 or len(entries) > rank:
        raise Unsupported("indexing a 0-dim tensor")
    indexed = [d for d, t in enumerate(entries) if t is not None]
    if not indexed:
        raise Unsupported("indexing with no index tensor")
    tensors = {d: _index_tensor(entries[d]) for d in indexed}
    bshape = _broadcast([t.sizes for t in tensors.values()])
    nb = len(bshape)
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0  # where B's dims are in the output
    bvars = ctx.vars[first:first + nb]
    rest = iter(ctx.vars[:first] + ctx.vars[first + nb:])  # the dims not indexed, in order
    at = [sympy.Integer(0) if d in tensors else next(rest) for d in range(rank)]
    if any(s == 0 for s in bshape):
        raise Unsupported("indexing with empty index tensors")
    positions = []
    for d, t in tensors.items():
        lead = nb - len(t.sizes)  # index tensors broadcast aligned on their last dims
        p = cast(_load_at(t, bvars[lead:]), torch.int64)
        size = size_value(self.sizes[d], torch.int64)
        wrapped = op("where", op("lt", p, Constant(0, torch.int64), dtype=torch.bool), op("add", p, size), p)
        positions.append((d, wrapped))
    return _checked(self.view, at, positions)
