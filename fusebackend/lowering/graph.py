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

Each IR node keeps the name of the Dynamo graph's node its FX node came from
(``IRGraph.sources``, ``provenance.py``): what the schedule says each kernel computes.

Two corrections to the meta results. Some meta functions do not know the device: a convolution
of channels-last tensors gives NCHW strides on meta and NHWC on CUDA or the CPU. Where the FX
node carries its traced value (``node.meta["val"]``, a fake tensor on the real device) an extern's
strides come from that, so the wrapper does not copy ATen's result into a layout eager never
uses. And nodes whose results nothing uses (the empty tensors a batch-norm decomposition
returns, say) are not lowered at all, unless they mutate something.

An ``aten.copy_`` into a graph input (AOTAutograd leaves batch norm's running statistics to the
graph that way) becomes a pointwise node that the wrapper points at the input's memory, so the
kernel computing the new value stores it in place, where that is safe (``mutations``):
what reads the input must only flow into that node, at the element it writes. Otherwise it is
an extern ``copy_`` after everything else, as any mutation.
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from typing import Any, Collection, Sequence

import torch
import torch.fx
from torch.utils import _pytree as pytree

from fusebackend import foreach, indexing, ir, metrics, sizevars, symbolic
from fusebackend.config import config
from fusebackend.constants import fold_foreign
from fusebackend.lowering import attention_heads, foreach_lists, layouts, product_epilogues, product_templates, trace
from fusebackend.lowering.builder import IRBuilder
from fusebackend.lowering.index_bounds import prove_positions
from fusebackend.lowering.mutations import in_place_copies, scatters_into_inputs
from fusebackend.lowering.registry import COMPOSITE, POINTWISE, Unsupported, bind_arguments, is_view_op
from fusebackend.lowering.symbolic_sizes import SymbolicSizes
from fusebackend.lowering.unrolled import unroll_short_reductions
from fusebackend.lowering.values import LoweringContext, TensorArg, beyond_kernels, check_matches
from fusebackend.provenance import source_name

aten = torch.ops.aten

# Ops whose composite lowering (convolutions.py: depthwise, one-position and grouped 1-d
# convolutions) is tried before the ATen call's preparations (its input made channels-last for
# cuDNN, its bias split off); where it declines, the op is an ATen call.
OWN_FIRST = (aten.convolution.default, aten.convolution_backward.default)
# AOTAutograd's effect tokens made and consumed inside the graph (``unlift_effect_tokens``, which
# fuse sets as Inductor does: backend.py)
_TOKEN_OPS = (torch.ops.prims._make_token.default, torch.ops.prims._sink_tokens.default)


def _live_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes the output depends on, and those with side effects (mutations) and theirs."""
    live: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if node.op in ("output", "placeholder") or node.is_impure() or any(u in live for u in node.users):
            live.add(node)
    return live


class GraphLowering(SymbolicSizes, IRBuilder):
    """Walks an ATen FX graph for concrete inputs, lowering each op (the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any], name: str,
                 user_outputs: int | None = None, symbolic_sizes: bool = False,
                 copied: Collection[str] = (), autotune: bool = False) -> None:
        self.gm = gm
        self.autotune = autotune  # mode="max-autotune": products may be generated (lowering.matmuls)
        self.copied = copied  # inputs that ATen copies into, never written in place (lower())
        self.symbolic = symbolic_sizes  # sizes as Dynamo's symbols, for all their values (lower())
        self.args = list(args)
        self.name = name
        self.env: dict[torch.fx.Node, Any] = {}
        tensors = [a for a in self.args if isinstance(a, torch.Tensor)]
        devices = {a.device for a in tensors if a.dim() > 0} or {a.device for a in tensors} or trace.devices(gm)
        if len(devices) > 1:
            raise Unsupported(f"graph inputs on several devices: {sorted(map(str, devices))}")
        super().__init__(devices.pop() if devices else torch.device("cpu"))
        self.moved_inputs: list[int] = []
        self.node: torch.fx.Node | None = None  # the FX node being lowered
        self.copies: list[tuple[ir.Pointwise, ir.Buffer, Any]] = []  # copy_ into an input: node, input, meta
        self.input_index: dict[ir.Buffer, int] = {}  # tensor inputs and their argument positions
        self.out_meta: Any = None  # the current op's meta output, for composite lowerings
        self.constants: list[tuple[ir.Buffer, torch.Tensor]] = []  # get_attr tensors
        self.fx_values: dict[str, str] = {}  # buffer -> FX node whose value it holds
        self.sources: dict[str, str] = {}  # IR node -> the Dynamo node it comes from (provenance.py)
        self.foreign: set[str] = set()  # extern results on another device (ir.IRGraph.foreign)
        # layouts.py: 2-d convolutions read channels-last inputs; the first ``user_outputs``
        # outputs (all where None) keep eager's layout once some tensor's layout was changed
        self.channels_last = layouts.wants_channels_last(self.device, gm)
        self.relaid: dict[ir.View, TensorArg] = {}  # a tensor's channels-last copy, made once
        self.padded: dict[tuple, TensorArg] = {}  # a matrix's zero-padded copy (matmuls.py), made once
        self.padded_products: set[str] = set()  # buffers of products with padded columns (matmuls.py)
        self.user_outputs = user_outputs
        # Dynamo's symbols (a graph with symbolic sizes) bound to this call's sizes
        self.bound = symbolic.binding(gm, args)
        self.hints = self.bound if symbolic_sizes else {}

    # ---------------------------------------------------------------------------- helpers
    def traced(self, node: Any) -> Any:
        """An FX node's traced value (``node.meta["val"]``) at the sizes being compiled
        (``symbolic.concrete``); None for anything else, where there is none, or where a tensor
        in it has a size that no input's size gives (one that depends on data)."""
        if not isinstance(node, torch.fx.Node):
            return None
        raw = node.meta.get("val")
        value = symbolic.concrete(raw, self.bound)
        tensors = lambda v: sum(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(v))  # noqa: E731
        return value if tensors(value) == tensors(raw) else None

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
                sizes, strides = trace.input_layout(node, value, self.bound) if self.symbolic else (
                    tuple(value.shape), tuple(value.stride()))
                buf = ir.Buffer(f"arg{k}", value.dtype, sizes, strides)
                self.input_index[buf] = k
                meta = torch.empty_strided(value.shape, value.stride(), dtype=buf.dtype, device="meta")
                self.env[node] = self._tensor_arg(buf, meta)
                inputs.append(buf)
            else:
                self.env[node] = value  # a size at its hint: only metas read it (symbolic_sizes.py)
                traced = node.meta.get("val")
                inputs.append(sizevars.to_sympy(traced) if self.symbolic and isinstance(traced, torch.SymInt) else value)
        outputs: list[Any] = []
        live = _live_nodes(self.gm.graph)
        for node in self.gm.graph.nodes:
            if node.op == "call_function":
                if node in live:
                    mark = len(self.nodes)
                    self.env[node] = self.call_function(node)
                    self._record_fx_value(node)
                    self._record_source(node, mark)
            elif node.op == "output":
                result = pytree.tree_map(
                    lambda v: v.view if isinstance(v, TensorArg) else v,
                    self._lookup(node.args[0]),
                )
                outputs = list(result) if isinstance(result, (list, tuple)) else [result]
                outputs = self._eager_output_layouts(node, outputs)
                if self.symbolic:  # a size it returns (for the backward) is the traced one, not its hint
                    outputs = self._symbolic_outputs(node, outputs)
            elif node.op == "get_attr":
                self.env[node] = self._constant(node)
            elif node.op != "placeholder":
                raise Unsupported(f"FX node kind {node.op} ({node.target})")
        graph = ir.IRGraph(self.name, self.device, inputs, self.nodes, outputs,  # nodes: the same list
                           constants=self.constants, fx_values=self.fx_values, sources=self.sources,
                           foreign=frozenset(self.foreign),
                           shape_env=sizevars.shape_env_of(self.gm) if self.symbolic else None)
        scattered = scatters_into_inputs(graph, [(c, t) for c, t, _ in self.copies], self.copied)
        self.copies = [(c, t, m) for c, t, m in self.copies if c.buffer.name not in scattered]
        in_place, refused = in_place_copies(graph, [(c, t) for c, t, _ in self.copies], self.copied)
        graph.mutations.update(in_place)
        for copy, target, meta in self.copies:
            if copy.buffer.name in in_place:
                continue
            # written after everything else instead, by ATen (an extern mutation is a barrier)
            self.node = None
            self.extern(aten.copy_.default, (TensorArg(target.whole(), meta), TensorArg(copy.buffer.whole(), meta)),
                        {}, meta, reason=f"not in place: {refused[copy.buffer.name]}")
        return graph

    def _effectful(self, args: Any, kwargs: Any) -> Any:
        """``with_effects(token, op, *args)``: an op with a side effect (an error check of a
        linalg result) that AOTAutograd orders by a token. It is an ATen call that no node moves
        across (as a mutation); the token, made in the graph with no value, passes through."""
        token, op, *rest = args
        out_meta = op(*self._to_meta(rest), **self._to_meta(kwargs))
        before = len(self.nodes)
        result = self.extern(op, tuple(rest), kwargs, out_meta, reason="an effectful call")
        assert len(self.nodes) == before + 1
        self.nodes[-1] = dataclasses.replace(self.nodes[-1], mutates=True)
        return (token, *result) if isinstance(result, (list, tuple)) else (token, result)

    def _record_fx_value(self, node: torch.fx.Node) -> None:
        """Remember which buffers hold this node's results whole (first node to hold one wins:
        a later view of the whole buffer holds the same values)."""
        value = self.env[node]
        leaves = [((), value)] if isinstance(value, TensorArg) else (
            [((k,), v) for k, v in enumerate(value)] if isinstance(value, (list, tuple)) else [])
        for path, leaf in leaves:
            if isinstance(leaf, TensorArg) and leaf.view.is_whole():
                label = node.name + "".join(f"[{k}]" for k in path)
                self.fx_values.setdefault(leaf.view.buffer.name, label)

    def _record_source(self, node: torch.fx.Node, mark: int) -> None:
        """The IR nodes lowering ``node`` added (from ``mark`` on) come from its source node."""
        source = source_name(node)
        if source is not None:
            for made in self.nodes[mark:]:
                self.sources.setdefault(made.name, source)

    def _constant(self, node: torch.fx.Node) -> TensorArg:
        """A tensor the graph module holds (``get_attr``): a buffer bound into the wrapper."""
        value: Any = self.gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"FX constant {node.target} is a {type(value).__name__}, not a tensor")
        value = value.detach().to(self.device)  # as an input on another device is moved
        buf = ir.Buffer(f"const_{len(self.constants)}", value.dtype, tuple(value.shape), tuple(value.stride()))
        self.constants.append((buf, value))
        meta = torch.empty_strided(buf.sizes, buf.strides, dtype=buf.dtype, device="meta")
        return self._tensor_arg(buf, meta)

    def _lookup(self, value: Any) -> Any:
        return pytree.tree_map(
            lambda v: self.env[v] if isinstance(v, torch.fx.Node) else v,
            value,
        )

    def call_function(self, node: torch.fx.Node) -> Any:
        self.node = node
        target = node.target
        args = self._lookup(node.args)
        kwargs = self._lookup(node.kwargs)
        if not isinstance(target, torch._ops.OpOverload):
            if target is operator.getitem and isinstance(args[0], (list, tuple)):
                return args[0][args[1]]
            if target is torch.ops.higher_order.with_effects:
                return self._effectful(args, kwargs)
            result = target(*self._to_meta(args), **self._to_meta(kwargs))
            if any(isinstance(r, torch.Tensor) for r in pytree.tree_leaves(result)):
                raise Unsupported(f"non-ATen call {target} returns a tensor")
            return result
        if target in _TOKEN_OPS:
            return None  # an effect token orders effectful calls; it holds no value (_effectful)
        if self.symbolic:
            return self._symbolic_call(node, target, args, kwargs)
        if target in OWN_FIRST:
            own = self._own_lowering(target, args, kwargs)
            if own is not None:
                return own
        if target is aten.convolution.default and self.channels_last:
            # the weight too: cuDNN would copy a weight that is not channels-last for a
            # channels-last input, on every call (a 3x3 one: ATen's clone, about 30 us of host
            # time a convolution on an H200 host); our copy is one launch of a generated kernel
            args = self._channels_last_args(args, ("input", "weight"))
        if target is aten.convolution.default and isinstance(args[2], TensorArg) and not kwargs:
            return self._convolution_then_bias(args)
        if target is aten.convolution_backward.default and not kwargs:
            if self.channels_last:
                # its output's gradient, input and weight, for the reason above: cuDNN copies any
                # of them that is not channels-last, when the others are, inside the ATen call
                # (Stable Diffusion's UNet, training, H100, bf16, 2026-11-27: 91 such copies,
                # 2.0 ms of a 27 ms step); ours fuse into the kernels computing the gradients
                args = self._channels_last_args(args, ("output gradient", "input", "weight"))
            if args[10][2]:
                return self._convolution_backward_then_bias(args)
        try:
            out_meta = target(*self._to_meta(args), **self._to_meta(kwargs))
        except Exception as exc:
            traced = self._traced_layouts(node, args)
            if traced is None:  # no meta kernel: the traced value says what it returns
                return self.extern(target, args, kwargs, trace.meta_of(self.traced(node), target, exc),
                                   reason="no meta kernel")
            # the op needs the layout it was traced with (a view of what was contiguous, now
            # channels-last): a copy in that layout, as reshape would make
            args = traced
            out_meta = target(*self._to_meta(args), **self._to_meta(kwargs))
        leaves = pytree.tree_leaves(out_meta)
        if not any(isinstance(t, torch.Tensor) for t in leaves):
            if target._schema.is_mutable:  # (a run of foreach calls generated here is no fallback)
                return self.extern(target, args, kwargs, out_meta, counted=target is not foreach_lists.CALL)
            return out_meta  # sizes, strides and other non-tensor results
        reason = beyond_kernels(args, kwargs, out_meta)
        if reason is not None:
            return self.extern(target, args, kwargs, out_meta, reason=reason)
        if is_view_op(target):
            base = args[0]
            if any(t.dtype != base.dtype for t in leaves if isinstance(t, torch.Tensor)):
                return self.extern(target, args, kwargs, out_meta, reason="a view as another dtype")
            return self.view(args, out_meta)
        if target is aten.copy_.default and not node.users:
            into = self._copy_into_input(args, out_meta)
            if into is not None:
                return into
        mark = len(self.nodes)
        try:
            if target in POINTWISE and isinstance(out_meta, torch.Tensor):
                tensors = [a.meta for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, TensorArg)]
                out_meta = layouts.pointwise_layout(out_meta, tensors)
                return self.lower_node(target, POINTWISE[target], args, kwargs, out_meta)
            if target in COMPOSITE and target not in OWN_FIRST:
                if target in layouts.REDUCTIONS:
                    out_meta = layouts.reduction_layout(out_meta, args, kwargs)
                return self._composite(target, args, kwargs, out_meta)
        except Exception as exc:  # declined (Unsupported) or a bug: this op alone is an ATen call
            del self.nodes[mark:]  # a lowering that fails leaves nothing behind
            if isinstance(exc, sizevars.NotSymbolic):
                raise  # the whole graph is compiled per shape instead
            if not isinstance(exc, Unsupported):
                warnings.warn(f"fusebackend: lowering {target} failed ({type(exc).__name__}: {exc}); "
                              "it runs as an ATen call", stacklevel=2)
            return self.extern(target, args, kwargs, out_meta, reason=str(exc))
        return self.extern(target, args, kwargs, out_meta)

    def _composite(self, target: Any, args: Any, kwargs: Any, out_meta: Any) -> Any:
        """``target``'s composite lowering on these arguments, checked against ``out_meta``."""
        self.out_meta, self.origin = out_meta, str(target)
        result = COMPOSITE[target](self, **bind_arguments(target, args, kwargs))
        check_matches(result, out_meta)
        return result

    def _own_lowering(self, target: Any, args: Any, kwargs: Any) -> Any:
        """``target``'s composite lowering, tried before the ATen call's own preparations (an
        input made channels-last for cuDNN): its result, or None where it declines (or fails,
        with the same warning as any lowering)."""
        if target not in COMPOSITE:
            return None
        mark = len(self.nodes)
        try:
            return self._composite(target, args, kwargs, target(*self._to_meta(args), **self._to_meta(kwargs)))
        except Exception as exc:
            del self.nodes[mark:]
            if isinstance(exc, sizevars.NotSymbolic):
                raise
            if not isinstance(exc, Unsupported):
                warnings.warn(f"fusebackend: lowering {target} failed ({type(exc).__name__}: {exc}); "
                              "it runs as an ATen call", stacklevel=2)
            return None

    def _traced_layouts(self, node: torch.fx.Node, args: Any) -> Any:
        """``args`` with each tensor the lowering laid out otherwise than the trace (channels-last
        around convolutions) copied back to its traced layout; None if there is none."""
        changed = False
        result = list(args)
        for k, (arg, fx_arg) in enumerate(zip(args, node.args)):
            val = self.traced(fx_arg)
            if not (isinstance(arg, TensorArg) and isinstance(val, torch.Tensor)):
                continue
            strides = tuple(val.stride())
            if (tuple(val.shape) != tuple(arg.meta.shape) or not all(isinstance(x, int) for x in strides)
                    or strides == tuple(arg.meta.stride())
                    or not indexing.is_dense(tuple(val.shape), strides)):
                continue
            meta = torch.empty_strided(tuple(val.shape), strides, dtype=arg.meta.dtype, device="meta")
            result[k] = self._copy_as(arg, meta, "the layout the graph was traced with")
            changed = True
        return tuple(result) if changed else None

    def _convolution_then_bias(self, args: tuple[Any, ...]) -> TensorArg:
        """A convolution with a bias as the convolution alone, then the bias added by a node of
        ours, which fuses into the kernel that reads the result (a layer norm, a GELU).

        ATen's cuDNN path adds the bias by a kernel of its own after the convolution (one more
        launch and one more pass over the result, per convolution); rounded in the same places:
        the convolution's result in its dtype, then the sum.
        """
        x, weight, bias, *rest = args
        alone = (x, weight, None, *rest)
        conv = self.extern(aten.convolution.default, alone, {}, aten.convolution.default(*self._to_meta(list(alone))))
        shape = (bias.meta.shape[0],) + (1,) * (conv.meta.dim() - 2)
        per_channel = self.view((bias,), aten.view.default(bias.meta, shape))
        add = aten.add.Tensor
        out_meta = add(conv.meta, per_channel.meta)
        return self.lower_node(add, POINTWISE[add], (conv, per_channel), {}, out_meta, "a convolution's bias")

    def _channels_last_args(self, args: tuple[Any, ...], roles: tuple[str, ...]) -> tuple[Any, ...]:
        """``args`` with its first ``len(roles)`` made channels-last (``as_channels_last``)."""
        return (*(self.as_channels_last(a, role) for a, role in zip(args, roles)), *args[len(roles):])

    def _convolution_backward_then_bias(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A convolution's backward whose bias gradient is asked for, as the ATen call for the
        input's and the weight's gradients alone, then the bias's as a sum of the output's
        gradient over every dim but the channels, by a reduction of ours: it fuses into the
        kernel that computes that gradient, where ATen reads the gradient again in a reduction
        kernel of its own (Stable Diffusion's UNet, training, H100, bf16, 2026-11-27: 97 such
        kernels, 1.2 ms of a 27 ms step)."""
        grad_out, mask = args[0], args[10]
        grads: Any = (None, None)
        if mask[0] or mask[1]:
            alone = (*args[:10], [mask[0], mask[1], False])
            grads = self.extern(aten.convolution_backward.default, alone, {},
                                aten.convolution_backward.default(*self._to_meta(list(alone))))[:2]
        return (*grads, self.bias_gradient(grad_out))

    def bias_gradient(self, grad_out: TensorArg) -> TensorArg:
        """A convolution's bias gradient: its output's gradient summed over every dim but the
        channels, a reduction of ours."""
        total = aten.sum.dim_IntList
        dims = [0, *range(2, grad_out.meta.dim())]
        return self._composite(total, (grad_out, dims), {}, total(grad_out.meta, dims))

    def as_channels_last(self, x: Any, role: str) -> Any:
        """``x``, the ``role`` of a convolution, as a channels-last tensor (layouts.py): itself,
        or a generated copy."""
        if not (isinstance(x, TensorArg) and layouts.needs_conversion(x.meta)):
            return x
        if x.view in self.relaid:  # read by several convolutions (a block and its shortcut)
            return self.relaid[x.view]
        sizes = tuple(x.meta.shape)
        meta = torch.empty_strided(sizes, layouts.channels_last_strides(sizes), dtype=x.dtype, device="meta")
        copy = self.relaid[x.view] = self._copy_as(x, meta, f"channels-last {role} of a convolution")
        return copy

    def _copy_as(self, x: TensorArg, meta: torch.Tensor, why: str) -> TensorArg:
        clone = aten.clone.default
        return self.lower_node(clone, POINTWISE[clone], (x,), {}, meta, why)

    def _eager_output_layouts(self, node: torch.fx.Node, outputs: list[Any]) -> list[Any]:
        """Outputs the user sees in the layout eager gives them, where the lowering made them
        another (channels-last around convolutions, layouts.py; padded matrix products,
        matmuls.py; or in the forward graph, for a backward graph's gradients): a copy, which
        fuses into the kernel computing the value. An output that aliases an input keeps the
        input's layout: AOTAutograd rebuilds it from the input. A padded product's columns are
        returned as they are, rows padded, where its dims are in eager's order
        (``matmuls.py`` says why)."""
        traced = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        constants = {buf for buf, _ in self.constants}
        keep = len(outputs) if self.user_outputs is None else min(self.user_outputs, len(outputs))
        result = list(outputs)
        for k in range(keep):
            view, fx_node = outputs[k], traced[k]
            val = self.traced(fx_node)
            if not (isinstance(view, ir.View) and isinstance(val, torch.Tensor)):
                continue
            if view.buffer in self.input_index or view.buffer in constants:
                continue  # an alias of an input: AOTAutograd rebuilds it from the input as it is
            strides = tuple(val.stride())
            if (not all(isinstance(s, int) for s in strides) or tuple(val.shape) != view.sizes
                    or all(a == b for n, a, b in zip(view.sizes, strides, view.strides) if n != 1)
                    or not indexing.is_dense(view.sizes, strides)):
                continue
            if view.buffer.name in self.padded_products and trace.same_order(view.sizes, view.strides, strides):
                continue  # eager's order with padded rows, as Inductor returns it (matmuls.py)
            meta = torch.empty_strided(view.sizes, strides, dtype=view.dtype, device="meta")
            source = TensorArg(view, torch.empty_strided(view.sizes, view.strides, dtype=view.dtype, device="meta"))
            self.node = None
            result[k] = self._copy_as(source, meta, "an output in eager's layout").view
        return result

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

    def _copy_into_input(self, args: Any, out_meta: torch.Tensor) -> TensorArg | None:
        """``copy_(dst, src)`` into a whole graph input on the graph's device: a pointwise node
        with the input's layout, to be written in place (checked once the graph is lowered)."""
        dst = args[0]
        if not (isinstance(dst, TensorArg) and dst.view.is_whole() and dst.view.buffer in self.input_index):
            return None
        if self.input_index[dst.view.buffer] in self.moved_inputs:
            return None  # the kernel would write the device copy of a host tensor
        if not indexing.is_dense(dst.view.buffer.sizes, dst.view.buffer.strides):
            return None  # a layout no node writes (a slice of a larger tensor)
        try:
            value = self.lower_node(aten.copy.default, POINTWISE[aten.copy.default], args[:2], {}, out_meta)
        except Unsupported:
            return None
        copy = self.nodes[-1]
        assert isinstance(copy, ir.Pointwise) and copy.buffer == value.view.buffer
        assert copy.buffer.strides == dst.view.buffer.strides  # the meta output is dst: its layout
        self.nodes[-1] = dataclasses.replace(copy, origin="aten.copy_.default (into an input)")
        self.copies.append((self.nodes[-1], dst.view.buffer, out_meta))
        return dst

    def lower_node(self, target: Any, lowering: Any, args: Any, kwargs: Any, out_meta: torch.Tensor,
                   why: str = "", sizes: tuple[tuple, tuple] | None = None) -> TensorArg:
        """A pointwise node for ``target`` in ``out_meta``'s layout; ``why``: for the dumps, when
        the lowering itself adds the op (a layout copy, a pad); ``sizes``: symbolic sizes and
        strides in place of ``out_meta``'s (at the hints)."""
        bound = bind_arguments(target, args, kwargs)
        shape, strides = sizes or (tuple(out_meta.shape), tuple(out_meta.stride()))
        ctx = LoweringContext(out_meta, self.device, sizes=shape)
        body = lowering(ctx, **bound)
        origin = f"{target} ({why})" if why else str(target)
        return self._add_pointwise(shape, out_meta.dtype, body, strides, origin)

    def extern(self, target: Any, args: Any, kwargs: Any, out_meta: Any, reason: str = "", counted: bool = True,
               sizes: tuple[tuple, tuple] | None = None) -> Any:
        """An ATen call; ``counted`` (a fallback) unless the lowering chose it (a random seed);
        ``sizes``: over symbolic sizes, the (one) result's sizes and strides where they are not
        the traced node's (a padded matrix product's)."""
        if counted:
            metrics.fallbacks[target.overloadpacket.__name__] += 1
        if target in layouts.CONVOLUTIONS and self.channels_last:
            out_meta = layouts.result_layout(target, tuple(self._to_meta(list(args))), out_meta, self.device)
        elif self.node is not None and trace.inputs_as_traced(
                [self.traced(n) for n in pytree.tree_leaves((self.node.args, self.node.kwargs))], args, kwargs):
            out_meta = trace.layout_of(self.traced(self.node), out_meta)
        name = self._new_name()
        outputs: list[tuple[tuple[int, ...], ir.Buffer]] = []
        produced: dict[tuple[int, ...], TensorArg] = {}

        def visit(value: Any, path: tuple[int, ...]) -> None:
            if isinstance(value, torch.Tensor):
                buf_name = name if path == () else f"{name}_{'_'.join(map(str, path))}"
                shape, strides = (tuple(value.shape), tuple(value.stride())) if not self.symbolic else (
                    sizes if sizes is not None and path == () else self._traced_result(path, value))
                buf = ir.Buffer(buf_name, value.dtype, shape, strides)
                outputs.append((path, buf))
                produced[path] = self._tensor_arg(buf, value)
            elif isinstance(value, (list, tuple)):
                for k, v in enumerate(value):
                    visit(v, path + (k,))

        visit(out_meta, ())
        traced = pytree.tree_leaves(self.node.meta.get("val")) if self.node is not None else []
        if any(isinstance(t, torch.Tensor) and t.device != self.device for t in traced):
            self.foreign.update(buf.name for _, buf in outputs)
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


def lower(gm: torch.fx.GraphModule, args: Sequence[Any], name: str, user_outputs: int | None = None,
          symbolic_sizes: bool = False, copied: Collection[str] = (), autotune: bool = False
          ) -> tuple[ir.IRGraph, list[int]]:
    """Lower ``gm`` for these concrete inputs; returns the IR graph and the inputs to move to its device.

    ``user_outputs``: how many of the graph's first outputs the user sees (the rest are saved for
    a backward graph); these keep eager's layouts. None: all of them. ``symbolic_sizes``: sizes
    stay Dynamo's symbols (for every value; ``args`` give one), or ``sizevars.NotSymbolic``.
    ``copied``: inputs (``arg3``) whose ``copy_`` ATen makes, not a kernel in place.
    ``autotune``: compiled under mode="max-autotune"."""
    attention_heads.share_kv_heads(gm)  # grouped-query attention reads the unrepeated heads
    if not product_templates.wanted(autotune):  # (a generated product takes its epilogue itself)
        product_epilogues.fold_activations(gm)  # a product's ReLU or tanh-GELU in cuBLASLt's epilogue
    foreach.in_place_chains(gm)  # foreach calls left whole update the inputs in place
    if config.foreach_lists:
        foreach_lists.fuse_runs(gm)  # and their runs are one generated kernel over every tensor
    lowering = GraphLowering(gm, args, name, user_outputs, symbolic_sizes, copied, autotune)
    # CPU tensors a CUDA graph makes from constants: made once, here, not at every call
    fold_foreign(gm, lowering.device)
    graph = lowering.run()
    graph = prove_positions(graph)  # gathers whose indices are known in range: no check
    graph = unroll_short_reductions(graph)  # reductions of a few positions: pointwise nodes
    return graph, lowering.moved_inputs
