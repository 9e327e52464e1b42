"""What a node's traced value (``node.meta["val"]``, Dynamo's fake tensor) says where lowering
reads it: the layouts ATen gives results, metas for ops without a meta kernel, the devices of a
graph without tensor inputs, and an input's symbolic sizes (``GraphLowering`` in ``graph.py``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import sympy
import torch
import torch.fx
from torch.utils import _pytree as pytree

from fusebackend import indexing, sizevars
from fusebackend.lowering.registry import Unsupported
from fusebackend.lowering.values import TensorArg


def layout_of(traced: Any, out_meta: Any) -> Any:
    """``out_meta`` with the strides of the node's traced value (``GraphLowering.traced``) where
    that is concrete and agrees."""
    if traced is None:
        return out_meta
    metas, spec = pytree.tree_flatten(out_meta)
    vals = pytree.tree_leaves(traced)
    if len(vals) != len(metas):
        return out_meta

    def pick(m: Any, v: Any) -> Any:
        if not (isinstance(m, torch.Tensor) and isinstance(v, torch.Tensor)):
            return m
        if v.dtype != m.dtype or tuple(v.shape) != tuple(m.shape):
            return m
        strides = v.stride()
        if not all(isinstance(s, int) for s in strides) or tuple(strides) == tuple(m.stride()):
            return m
        if not indexing.is_dense(tuple(m.shape), tuple(strides)):
            return m
        return torch.empty_strided(tuple(m.shape), tuple(strides), dtype=m.dtype, device="meta")

    return pytree.tree_unflatten([pick(m, v) for m, v in zip(metas, vals)], spec)


def inputs_as_traced(vals: list[Any], args: Any, kwargs: Any) -> bool:
    """Whether an extern's tensor arguments have the sizes and strides the node was traced with.

    Only then does the traced value say how the ATen kernel lays out its result. Where the
    lowering laid an input out otherwise, the meta function's result on the actual inputs holds:
    the cuDNN attention's output follows the query's layout, and Qwen2's queries, written
    [B, H, S, D] by the rotary kernel where the trace had them [B, S, H, D], came back from cuDNN
    [B, H, S, D]; declared [B, S, H, D] as traced, each of the 24 layers' results was copied
    again (``wrapper_calls.expect_layout``)."""
    ours = [a.meta for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, TensorArg)]
    traced = [v for v in vals if isinstance(v, torch.Tensor)]
    return len(ours) == len(traced) and all(
        tuple(m.shape) == tuple(v.shape) and tuple(m.stride()) == tuple(v.stride()) for m, v in zip(ours, traced))


def same_order(sizes: Sequence[int], strides: Sequence[int], eager: Sequence[int]) -> bool:
    """Whether ``strides`` lay the dims (those larger than 1) out in ``eager``'s order, the
    fastest one with eager's stride: eager's layout, but for gaps between rows."""
    ours = [d for d in indexing.dense_order(sizes, strides) if sizes[d] != 1]
    theirs = [d for d in indexing.dense_order(sizes, eager) if sizes[d] != 1]
    return ours == theirs and (not ours or strides[ours[-1]] == eager[ours[-1]])


def meta_of(traced: Any, target: Any, exc: Exception) -> Any:
    """Meta tensors with the sizes, strides and dtypes of a node's traced value (a fake
    tensor, ``GraphLowering.traced``), for an op that has no meta kernel; Unsupported where there
    is none, or its sizes depend on data."""

    def meta(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        if not all(isinstance(s, int) for s in (*v.shape, *v.stride())):
            raise Unsupported(f"{target} has no meta kernel and a data-dependent shape")
        return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")

    if traced is None:
        raise Unsupported(f"{target} has no meta implementation: {exc}") from exc
    return pytree.tree_map(meta, traced)


def devices(gm: torch.fx.GraphModule) -> set[torch.device]:
    """The devices of the tensors a graph without tensor inputs makes (``torch.rand(n,
    device="cuda")``), as traced."""
    values = pytree.tree_leaves([n.meta.get("val") for n in gm.graph.nodes if n.op == "call_function"])
    return {v.device for v in values if isinstance(v, torch.Tensor)}


def input_layout(node: torch.fx.Node, value: torch.Tensor,
                 bound: Mapping[sympy.Symbol, int]) -> tuple[tuple[sympy.Expr, ...], tuple[sympy.Expr, ...]]:
    """A graph input's traced sizes and strides as fuse's expressions, which must give the
    call's own at the call's sizes (``bound``); ``sizevars.NotSymbolic`` otherwise."""
    sizes, strides = sizevars.layout(node.meta.get("val"))
    if sizevars.hints(sizes, bound) != tuple(value.shape) or not sizevars.same_layout(
            value.shape, sizevars.hints(strides, bound), value.stride()):
        raise sizevars.NotSymbolic(f"input {node.name}: traced as {sizes}, {strides}; called with "
                                   f"{tuple(value.shape)}, {value.stride()}")
    return sizes, strides
