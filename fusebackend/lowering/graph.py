"""Lowering: walk an ATen FX graph with concrete input metadata and build an IRGraph.

Every op is first run on meta tensors. That gives, for free and always in agreement with eager,
each output's sizes, strides, dtype and, for views, the offset into its base's storage. Then:

- a view op (its schema says the output aliases the input) becomes a new ``View`` of the same
  buffer: no node, no copy;
- an op with a registered lowering becomes a ``Pointwise`` or ``Reduction`` node whose buffer
  takes the meta output's layout;
- anything else, or a lowering that raises ``Unsupported``, becomes an ``Extern`` ATen call,
  counted in ``metrics.fallbacks``;
- ops that return no tensor (``sym_size``, Python arithmetic on sizes) are evaluated on the spot:
  a graph is always lowered for concrete shapes.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Sequence

import torch
import torch.fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
from torch.utils import _pytree as pytree

from fusebackend import indexing, ir, metrics
from fusebackend.lowering.registry import POINTWISE, REDUCTIONS, Unsupported, bind_arguments

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class TensorArg:
    """A tensor value during lowering: a view of a buffer and a meta tensor with its layout."""

    view: ir.View
    meta: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.view.dtype

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.view.sizes


class LoweringContext:
    """What a lowering sees: the output's layout and helpers to read arguments at its index."""

    def __init__(self, out_meta: torch.Tensor, device: torch.device) -> None:
        self.out_meta = out_meta
        self.device = device
        self.sizes = tuple(out_meta.shape)
        self.dtype = out_meta.dtype
        self.vars = indexing.loop_vars("i", len(self.sizes))

    def load(self, arg: TensorArg) -> ir.Expr:
        """``arg`` broadcast to the output's sizes and read at the output's index."""
        view = arg.view
        nd_out, nd = len(self.sizes), len(view.sizes)
        if nd > nd_out:
            raise Unsupported("argument has more dims than the output")
        idx = []
        for k, size in enumerate(view.sizes):
            out_size = self.sizes[nd_out - nd + k]
            if size == 1:
                idx.append(indexing.sympy.Integer(0))
            elif size == out_size:
                idx.append(self.vars[nd_out - nd + k])
            else:
                raise Unsupported(f"cannot broadcast {view.sizes} to {self.sizes}")
        return ir.Load(view, tuple(idx))

    def value(self, arg: Any, dtype: torch.dtype) -> ir.Expr:
        """A tensor argument or a Python scalar as an expression of ``dtype``."""
        if isinstance(arg, TensorArg):
            return ir.cast(self.load(arg), dtype)
        if isinstance(arg, (bool, int, float)):
            return ir.Constant(ir._convert_scalar(arg, dtype), dtype)
        raise Unsupported(f"unsupported argument {type(arg).__name__}")

    @staticmethod
    def result_type(*args: Any) -> torch.dtype:
        """Type promotion of tensors and scalars, exactly as ATen does it."""
        metas = [a.meta if isinstance(a, TensorArg) else a for a in args if a is not None]
        _, result = elementwise_dtypes(
            *metas, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
        )
        return result


def is_view_op(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    if schema.is_mutable or not schema.returns:
        return False
    info = schema.returns[0].alias_info
    return info is not None and not info.is_write


class GraphLowering:
    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any], name: str) -> None:
        self.gm = gm
        self.args = list(args)
        self.name = name
        self.nodes: list[ir.Node] = []
        self.env: dict[torch.fx.Node, Any] = {}
        self.base_offset: dict[str, int] = {}
        self._count = 0
        tensors = [a for a in self.args if isinstance(a, torch.Tensor)]
        devices = {a.device for a in tensors if a.dim() > 0} or {a.device for a in tensors}
        if len(devices) > 1:
            raise Unsupported(f"graph inputs on several devices: {sorted(map(str, devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        self.moved_inputs: list[int] = []

    # ---------------------------------------------------------------------------- helpers
    def _new_name(self) -> str:
        name = f"buf{self._count}"
        self._count += 1
        return name

    def _tensor_arg(self, buffer: ir.Buffer, meta: torch.Tensor) -> TensorArg:
        self.base_offset[buffer.name] = meta.storage_offset()
        return TensorArg(buffer.whole(), meta)

    def _to_meta(self, value: Any) -> Any:
        def leaf(v: Any) -> Any:
            if isinstance(v, TensorArg):
                return v.meta
            if isinstance(v, torch.device):
                return torch.device("meta")
            return v

        return pytree.tree_map(leaf, value)

    # ------------------------------------------------------------------------------- run
    def run(self) -> ir.IRGraph:
        inputs: list[Any] = []
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.args):
            raise Unsupported(f"graph takes {len(placeholders)} inputs, got {len(self.args)}")
        for k, (node, value) in enumerate(zip(placeholders, self.args)):
            if isinstance(value, torch.Tensor):
                if value.device != self.device:
                    self.moved_inputs.append(k)
                buf = ir.Buffer(f"arg{k}", value.dtype, tuple(value.shape), tuple(value.stride()))
                meta = torch.empty_strided(buf.sizes, buf.strides, dtype=buf.dtype, device="meta")
                self.env[node] = self._tensor_arg(buf, meta)
                inputs.append(buf)
            else:
                self.env[node] = value
                inputs.append(value)
        outputs: list[Any] = []
        for node in self.gm.graph.nodes:
            if node.op == "call_function":
                self.env[node] = self.call_function(node)
            elif node.op == "output":
                result = pytree.tree_map(
                    lambda v: v.view if isinstance(v, TensorArg) else v,
                    self._lookup(node.args[0]),
                )
                outputs = list(result) if isinstance(result, (list, tuple)) else [result]
            elif node.op != "placeholder":
                raise Unsupported(f"FX node kind {node.op} ({node.target})")
        return ir.IRGraph(self.name, self.device, inputs, self.nodes, outputs)

    def _lookup(self, value: Any) -> Any:
        return pytree.tree_map(
            lambda v: self.env[v] if isinstance(v, torch.fx.Node) else v,
            value,
        )

    def call_function(self, node: torch.fx.Node) -> Any:
        target = node.target
        args = self._lookup(node.args)
        kwargs = self._lookup(node.kwargs)
        if not isinstance(target, torch._ops.OpOverload):
            if target is operator.getitem and isinstance(args[0], (list, tuple)):
                return args[0][args[1]]
            result = target(*self._to_meta(args), **self._to_meta(kwargs))
            if any(isinstance(r, torch.Tensor) for r in pytree.tree_leaves(result)):
                raise Unsupported(f"non-ATen call {target} returns a tensor")
            return result
        try:
            out_meta = target(*self._to_meta(args), **self._to_meta(kwargs))
        except Exception as exc:  # no meta kernel: a data-dependent or exotic op
            raise Unsupported(f"{target} has no meta implementation: {exc}") from exc
        leaves = pytree.tree_leaves(out_meta)
        if not any(isinstance(t, torch.Tensor) for t in leaves):
            if target._schema.is_mutable:
                return self.extern(target, args, kwargs, out_meta)
            return out_meta  # sizes, strides and other non-tensor results
        if is_view_op(target):
            return self.view(args, out_meta)
        lowering = POINTWISE.get(target) or REDUCTIONS.get(target)
        if lowering is not None and isinstance(out_meta, torch.Tensor):
            try:
                return self.lower_node(target, lowering, args, kwargs, out_meta)
            except Unsupported as exc:
                return self.extern(target, args, kwargs, out_meta, reason=str(exc))
        return self.extern(target, args, kwargs, out_meta)

    def view(self, args: Any, out_meta: Any) -> Any:
        base = args[0]
        assert isinstance(base, TensorArg)
        buffer = base.view.buffer
        origin = self.base_offset[buffer.name]

        def make(meta: torch.Tensor) -> TensorArg:
            view = ir.View(
                buffer, tuple(meta.shape), tuple(meta.stride()), meta.storage_offset() - origin
            )
            return TensorArg(view, meta)

        return pytree.tree_map(lambda m: make(m) if isinstance(m, torch.Tensor) else m, out_meta)

    def lower_node(self, target: Any, lowering: Any, args: Any, kwargs: Any, out_meta: torch.Tensor) -> TensorArg:
        bound = bind_arguments(target, args, kwargs)
        sizes = tuple(out_meta.shape)
        strides = tuple(out_meta.stride())
        if not indexing.is_dense(sizes, strides):
            strides = indexing.contiguous_strides(sizes)
        buf = ir.Buffer(self._new_name(), out_meta.dtype, sizes, strides)
        ctx = LoweringContext(out_meta, self.device)
        result = lowering(ctx, **bound)
        if isinstance(result, tuple):  # a reduction: (body, reduction ranges, type)
            body, rranges, rtype = result
            node: ir.Node = ir.Reduction(buf, ir.cast(body, buf.dtype) if rtype not in ("argmax", "argmin") else body,
                                         tuple(rranges), rtype, str(target))
        else:
            node = ir.Pointwise(buf, ir.cast(result, buf.dtype), str(target))
        self.nodes.append(node)
        meta = torch.empty_strided(sizes, strides, dtype=buf.dtype, device="meta")
        return self._tensor_arg(buf, meta)

    def extern(self, target: Any, args: Any, kwargs: Any, out_meta: Any, reason: str = "") -> Any:
        metrics.fallbacks[str(target.overloadpacket.__name__ if hasattr(target, "overloadpacket") else target)] += 1
        name = self._new_name()
        outputs: list[tuple[tuple[int, ...], ir.Buffer]] = []
        produced: dict[tuple[int, ...], TensorArg] = {}

        def visit(value: Any, path: tuple[int, ...]) -> None:
            if isinstance(value, torch.Tensor):
                buf_name = name if path == () else f"{name}_{'_'.join(map(str, path))}"
                buf = ir.Buffer(buf_name, value.dtype, tuple(value.shape), tuple(value.stride()))
                outputs.append((path, buf))
                produced[path] = self._tensor_arg(buf, value)
            elif isinstance(value, (list, tuple)):
                for k, v in enumerate(value):
                    visit(v, path + (k,))

        visit(out_meta, ())
        to_ir = lambda v: v.view if isinstance(v, TensorArg) else v  # noqa: E731
        node = ir.Extern(
            name,
            target,
            tuple(pytree.tree_map(to_ir, list(args))),
            tuple((k, pytree.tree_map(to_ir, v)) for k, v in kwargs.items()),
            tuple(outputs),
            bool(target._schema.is_mutable),
            str(target) + (f" ({reason})" if reason else ""),
        )
        self.nodes.append(node)

        def rebuild(value: Any, path: tuple[int, ...]) -> Any:
            if isinstance(value, torch.Tensor):
                return produced[path]
            if isinstance(value, (list, tuple)):
                return type(value)(rebuild(v, path + (k,)) for k, v in enumerate(value))
            return value

        return rebuild(out_meta, ())


def lower(gm: torch.fx.GraphModule, args: Sequence[Any], name: str) -> tuple[ir.IRGraph, list[int]]:
    """Lower ``gm`` for these concrete inputs; returns the IR graph and the inputs to move to its device."""
    lowering = GraphLowering(gm, args, name)
    graph = lowering.run()
    return graph, lowering.moved_inputs
