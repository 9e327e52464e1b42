"""Lowering over symbolic sizes: what ``GraphLowering`` does with an ATen op of a graph
compiled for every value of its symbols (``lower(symbolic_sizes=True)``).

The IR keeps the traced sizes (sympy expressions in Dynamo's symbols, ``sizevars.to_sympy``);
ATen's meta functions run at the hints (the sizes of the call being compiled), and every choice
they make (a result's layout) is carried over to the symbolic sizes only where it holds for
every value (``sizevars.dense_strides``). What cannot be lowered so raises ``NotSymbolic``, and
the graph is compiled once per shape instead.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import sympy
import torch
import torch.fx
from torch.utils import _pytree as pytree

from fusebackend import indexing, ir, sizevars
from fusebackend.lowering import layouts
from fusebackend.lowering.registry import COMPOSITE, POINTWISE, SYMBOLIC, Unsupported, bind_arguments, is_view_op
from fusebackend.lowering.values import TensorArg, beyond_kernels

aten = torch.ops.aten

# arguments a lowering uses only through its result's sizes, which the trace gives: they may be
# computed from symbolic sizes (``arange(0, s0)``, ``full([s0, 4], 0)``)
SIZE_ARGUMENTS: dict[Any, tuple[str, ...]] = {aten.arange.start_step: ("end",), aten.full.default: ("size",)}


class SymbolicSizes:
    """The symbolic track of ``GraphLowering`` (a mixin: it builds through the lowering's own
    ``extern``, ``lower_node`` and ``_composite``)."""

    hints: dict[sympy.Symbol, int]
    node: torch.fx.Node | None

    def _symbolic_call(self, node: torch.fx.Node, target: Any, args: Any, kwargs: Any) -> Any:
        """An ATen op lowered for every value of the graph's symbolic sizes. Pointwise
        ops in the layout ATen gives at the hints, with the traced sizes; the composites marked
        ``SYMBOLIC`` (reductions); views as traced; any other op (or one whose lowering declines)
        an ATen call, its results in the traced sizes. ``NotSymbolic`` for an op with an
        argument computed from sizes (lowering holds those at their hints) or one that mutates."""
        if is_view_op(target) and isinstance(args[0], TensorArg) and not beyond_kernels(args, kwargs, args[0].meta):
            return self._symbolic_view(node, args[0], target(*self._to_meta(args), **self._to_meta(kwargs)))
        from_sizes = [name for name, value in bind_arguments(target, node.args, node.kwargs).items()
                      if any(isinstance(a, torch.fx.Node) and not isinstance(a.meta.get("val"), torch.Tensor)
                             for a in pytree.tree_leaves(value))]
        if set(from_sizes) - set(SIZE_ARGUMENTS.get(target, ())):
            raise sizevars.NotSymbolic(f"{target}: argument {from_sizes[0]} is computed from sizes")
        out_meta = target(*self._to_meta(args), **self._to_meta(kwargs))
        if target._schema.is_mutable:
            raise sizevars.NotSymbolic(f"{target}: mutates its arguments")
        if not any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(out_meta)):
            return out_meta  # a size (sym_size) at its hint: what reads it as a value declines above
        beyond = beyond_kernels(args, kwargs, out_meta)
        if not beyond and target not in SYMBOLIC and (target in POINTWISE or target in COMPOSITE) \
                and _lowered_at_hints(target, args, kwargs):
            sizevars.decline(f"a lowering of {target} into kernels")  # an ATen call over symbolic sizes
        reason = beyond or ("" if target in SYMBOLIC else "no symbolic lowering")
        if not reason:
            mark = len(self.nodes)
            try:
                if target not in POINTWISE:
                    return self._composite(target, args, kwargs, out_meta)
                if isinstance(out_meta, torch.Tensor):
                    return self._symbolic_pointwise(node, target, args, kwargs, out_meta)
            except Unsupported as exc:  # declined: this op alone is an ATen call
                del self.nodes[mark:]
                reason = str(exc)
        if from_sizes:  # an ATen call would take them at the hints
            raise sizevars.NotSymbolic(f"{target}: an ATen call ({reason}) of sizes computed from symbols")
        return self.extern(target, args, kwargs, out_meta, reason=reason)

    def _symbolic_pointwise(self, node: torch.fx.Node, target: Any, args: Any, kwargs: Any,
                            out_meta: torch.Tensor) -> TensorArg:
        """A pointwise node in the traced layout where that is dense (so that the views of it
        that the graph takes are the traced ones), else in the one ATen gives at the hints."""
        sizes, strides = self._traced_sizes(node.meta.get("val"), out_meta)
        if not indexing.is_dense(sizes, strides):
            tensors = [a.meta for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, TensorArg)]
            strides = sizevars.dense_strides(sizes, layouts.pointwise_layout(out_meta, tensors).stride(), self.hints)
        out_meta = torch.empty_strided(sizevars.hints(sizes, self.hints), sizevars.hints(strides, self.hints),
                                       dtype=out_meta.dtype, device="meta")
        return self.lower_node(target, POINTWISE[target], args, kwargs, out_meta, sizes=(sizes, strides))

    def _traced_result(self, path: tuple[int, ...], meta: torch.Tensor) -> tuple[tuple, tuple]:
        """An ATen call's result at ``path`` over symbolic sizes: the traced sizes, in the layout
        its meta function gives at the hints (the wrapper checks it at each call)."""
        traced = self.node.meta.get("val") if self.node is not None else None
        for k in path:
            traced = traced[k] if isinstance(traced, (list, tuple)) else None
        sizes, _ = self._traced_sizes(traced, meta)
        return sizes, sizevars.dense_strides(sizes, meta.stride(), self.hints)

    def _traced_sizes(self, traced: Any, meta: torch.Tensor) -> tuple[tuple, tuple]:
        """A traced value's sizes and strides, its sizes checked against its meta's at the hints."""
        sizes, strides = sizevars.layout(traced)
        if sizevars.hints(sizes, self.hints) != tuple(meta.shape):
            op = self.node.target if self.node is not None else "an op"
            raise sizevars.NotSymbolic(f"{op}: traced sizes {sizes} are {tuple(meta.shape)} at the hints")
        return sizes, strides

    def _symbolic_view(self, node: torch.fx.Node, base: TensorArg, out_meta: Any) -> Any:
        """A view over symbolic sizes (or the views of a split): the traced views' sizes, strides
        and offsets, where our base is laid out as the traced base (its own offset added);
        ``NotSymbolic`` otherwise."""
        traced_base = node.args[0].meta.get("val")
        same = lambda a, b: len(a) == len(b) and all(sympy.expand(x - y) == 0 for x, y in zip(a, b))  # noqa: E731
        sizes, strides = sizevars.layout(traced_base)
        if not (same(sizes, base.view.sizes) and same(strides, base.view.strides)):
            return self._reshaped_view(node, base, out_meta)
        base_offset = sizevars.to_sympy(traced_base.storage_offset())
        metas, spec = pytree.tree_flatten(out_meta)
        traced = pytree.tree_leaves(node.meta.get("val"))
        if len(traced) != len(metas):
            raise sizevars.NotSymbolic(f"{node.target}: traced with other results")
        def make(meta: Any, value: Any) -> Any:
            if not isinstance(meta, torch.Tensor):
                return meta
            if meta.dtype != base.dtype:
                raise sizevars.NotSymbolic(f"{node.target}: a view as another dtype")
            sizes, strides = self._traced_sizes(value, meta)
            if not sizevars.same_layout(meta.shape, sizevars.hints(strides, self.hints), meta.stride()):
                raise sizevars.NotSymbolic(f"{node.target}: traced as {sizes}, {strides}")
            offset = sizevars.to_sympy(value.storage_offset()) - base_offset + base.view.offset
            return TensorArg(ir.View(base.view.buffer, sizes, strides, offset), meta)

        return pytree.tree_unflatten([make(m, v) for m, v in zip(metas, traced)], spec)

    def _reshaped_view(self, node: torch.fx.Node, base: TensorArg, out_meta: Any) -> TensorArg:
        """A view of a base laid out otherwise than traced (a padded product's columns, rows
        ``n_pad`` apart), as a reshape of our base's layout (``reshaped_strides``): ``view(1, s,
        n)`` or ``view(8, s, n)`` of ``[8*s, n]`` with rows ``n_pad`` apart. ``NotSymbolic``
        where the view is not such a reshape, or where our base's dims that it merges are not
        laid out one after another."""
        value, traced_base = node.meta.get("val"), node.args[0].meta.get("val")
        if not (isinstance(value, torch.Tensor) and isinstance(out_meta, torch.Tensor)):
            raise sizevars.NotSymbolic(f"{node.target}: of a tensor laid out otherwise than traced")
        sizes, _ = self._traced_sizes(value, out_meta)
        offset = sizevars.to_sympy(value.storage_offset()) - sizevars.to_sympy(traced_base.storage_offset())
        strides = reshaped_strides(base.view.sizes, base.view.strides, sizes, self.hints) if offset == 0 else None
        if strides is None:
            raise sizevars.NotSymbolic(f"{node.target}: of a tensor laid out otherwise than traced")
        if not sizevars.same_layout(out_meta.shape, sizevars.hints(strides, self.hints), out_meta.stride()):
            raise sizevars.NotSymbolic(f"{node.target}: traced as {sizes}, {tuple(strides)}")
        return TensorArg(ir.View(base.view.buffer, sizes, tuple(strides), base.view.offset), out_meta)

    def _symbolic_outputs(self, node: torch.fx.Node, outputs: list[Any]) -> list[Any]:
        """The graph's outputs with each size among them (a forward graph returns some for its
        backward) as its traced expression: lowering holds them at the hints."""
        traced = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        result = list(outputs)
        for k, fx_node in enumerate(traced):
            value = fx_node.meta.get("val") if isinstance(fx_node, torch.fx.Node) else None
            if isinstance(value, torch.SymInt):
                result[k] = sizevars.to_sympy(value)
            elif isinstance(value, (torch.SymFloat, torch.SymBool)):
                raise sizevars.NotSymbolic(f"output {fx_node.name}: a {type(value).__name__}")
        return result


def reshaped_strides(sizes: Sequence[Any], strides: Sequence[Any], new_sizes: Sequence[Any],
                     hints: Mapping[sympy.Symbol, int]) -> list[Any] | None:
    """The strides of a view of ``new_sizes`` of a tensor of ``sizes`` and ``strides`` (which
    may be expressions in size symbols), as ``Tensor.view`` computes them; None where the view
    would need a copy. The dims of size 1 aside, the old and the new dims are grouped into
    chunks of equal products (the hints choose which side takes its next dim; each chunk's
    products must then be equal as polynomials); a chunk of several old dims must be laid out
    one after another, and its new dims take strides within it, from its last stride up."""
    old = [(n, st) for n, st in zip(sizes, strides) if n != 1]
    new = [k for k, n in enumerate(new_sizes) if n != 1]
    out: list[Any] = [None] * len(new_sizes)
    i = j = 0
    while j < len(new):
        if i == len(old):
            return None
        chunk_old, chunk_new = [old[i]], [new[j]]
        i, j = i + 1, j + 1
        while sympy.expand(math.prod(n for n, _ in chunk_old) - math.prod(new_sizes[k] for k in chunk_new)) != 0:
            more_old = sizevars.hint(math.prod(n for n, _ in chunk_old), hints) < sizevars.hint(
                math.prod(new_sizes[k] for k in chunk_new), hints)
            if more_old and i < len(old):
                chunk_old.append(old[i])
                i += 1
            elif not more_old and j < len(new):
                chunk_new.append(new[j])
                j += 1
            else:
                return None
        for (n, st), (_, outer) in zip(chunk_old[1:], chunk_old):
            if sympy.expand(outer - st * n) != 0:  # merged dims must be laid out one after another
                return None
        stride = chunk_old[-1][1]
        for k in reversed(chunk_new):
            out[k] = stride
            stride = stride * new_sizes[k]
    if i != len(old):
        return None
    for k in reversed(range(len(new_sizes))):  # a dim of 1: as if contiguous over the dims after it
        if out[k] is None:
            out[k] = out[k + 1] * new_sizes[k + 1] if k + 1 < len(new_sizes) else 1
    return out


def _lowered_at_hints(target: Any, args: Any, kwargs: Any) -> bool:
    """Whether a compile at the hints would lower ``target`` into kernels rather than call ATen:
    a convolution only where it is depthwise or a 1x1 product over 1x1 positions
    (``convolutions.convolution``; cuDNN's otherwise, as over symbolic sizes); any other op with a
    lowering, yes."""
    if target is not torch.ops.aten.convolution.default:
        return True
    bound = bind_arguments(target, args, kwargs)
    x, weight = bound["input"], bound["weight"]
    if not isinstance(x, TensorArg) or not isinstance(weight, TensorArg):
        return False
    ones = all(sizevars.size_hint(n) == 1 for n in (*x.sizes[2:], *weight.sizes[2:]))
    return bound["groups"] > 1 or (bound["groups"] == 1 and ones)
