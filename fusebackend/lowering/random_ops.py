"""Lowerings of random ops: rand, randn, randint and their ``_like`` forms, bernoulli, normal and
dropout become nodes of generated kernels instead of ATen calls.

A random value is a pure function of three numbers (the IR ops ``rand``, ``randn`` and
``randint``, which ``th.philox`` computes in the kernel): the graph's *seed*, the node's *stream*
and the element's flat index (row-major over the node's sizes, whatever its strides).

- The seed is drawn on each call of the compiled graph from torch's default generator for the
  graph's device: an ATen ``randint`` the wrapper calls before the first kernel that needs it
  (the ``Extern`` this module adds at the graph's first random node; a choice, not a fallback, so
  not counted as one). ``torch.manual_seed`` makes runs repeatable and successive calls differ.
  Kernels read it from that one-element tensor, a runtime argument: their source is the same on
  every call, and a CUDA device is never synchronized with the host to pass it.
- Each random node of a graph has a stream of its own, so two nodes never repeat each other's
  values, whatever their shapes.
- An element's value is the same wherever it is computed. A random node inlined into several
  kernels, or recomputed in each of its readers (``scheduler/recompute.py``), gives every reader
  the values it would have stored: fusion and recomputation need no rule for random nodes.

Uniform values are multiples of 2**-b below 1, b the significand bits of the output dtype, as
eager draws them (a bf16 ``rand`` takes one of 256 values): exact in that dtype, so none rounds
up to 1 on store. Comparisons against a probability (bernoulli, dropout) use 24 bits.

Dropout in training: AOTAutograd's partitioner never recomputes a random op in the backward
graph, so the forward returns ``native_dropout``'s bool mask and the backward reads it, 1 byte per
element; the forward stores it from the same kernel that computes the output. Regenerating the
mask in the backward from the seed would move a byte per element less each way, but takes
longer: one Philox per element makes these kernels bound by integer work, not memory. On an H100
(2026-11-23, one run each, 8192x8192), the backward's ``g * mask * 2`` took 160 us reading a
stored mask and 280 us drawing it again in bf16 (296 against 371 us in fp32); the inference
dropout kernel ``dropout(x * 2) + 1`` took 270 us in bf16 where ``x * 2 + 1`` takes 132 us
(Inductor's, with Triton's tl.rand: 278 us; eager: 329 us).

``uniform`` and ``normal_functional`` (what ``x.uniform_()`` and ``x.normal_()`` become) are
decomposed into ``rand`` and ``randn`` in ``decompositions.py``, so that the empty tensor they
fill is never allocated. A generator other than the default one stays an ATen call.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

import torch

from fusebackend import indexing, ir
from fusebackend.ir import Constant, Expr, cast, op
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_composite

aten = torch.ops.aten

SEED_HIGH = 2**63 - 1  # seeds are drawn from [0, SEED_HIGH)
SIGNIFICAND_BITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


@dataclasses.dataclass
class _GraphRandom:
    """A graph's seed (the extern that draws it, and its buffer) and the streams handed out."""

    node: ir.Extern
    seed: TensorArg
    streams: int


_GRAPHS: "weakref.WeakKeyDictionary[GraphLowering, _GraphRandom]" = weakref.WeakKeyDictionary()


def _new_stream(builder: GraphLowering) -> tuple[TensorArg, int]:
    """The graph's seed, drawn at its first random node, and a stream for one more node."""
    state = _GRAPHS.get(builder)
    if state is None or not any(n is state.node for n in builder.nodes):  # none yet, or a composite
        # that drew it declined and took it away
        meta = aten.randint.low(0, SEED_HIGH, [], dtype=torch.int64, device="meta")
        seed = builder.extern(aten.randint.low, (0, SEED_HIGH, []), {"dtype": torch.int64, "device": builder.device},
                              meta, reason="the seed of this graph's random values", counted=False)
        node = builder.nodes[-1]
        assert isinstance(node, ir.Extern)
        state = _GraphRandom(node, seed, state.streams if state is not None else 0)
        _GRAPHS[builder] = state
    state.streams += 1
    return state.seed, state.streams - 1


@dataclasses.dataclass(frozen=True)
class _Draw:
    """The random values of one node at the element a lowering context stands for."""

    seed: Expr
    stream: int
    element: Expr

    def uniform(self, dtype: torch.dtype) -> Expr:
        """Uniform on [0, 1) on the grid of ``dtype``'s significand: fp32, or fp64 for fp64."""
        bits = SIGNIFICAND_BITS[dtype]
        result = torch.float64 if bits > 24 else torch.float32
        return ir.Op("rand", (self.seed, self._stream(), self.element, Constant(bits, torch.int32)), result)

    def normal(self) -> Expr:
        """Standard normal, fp32."""
        return ir.Op("randn", (self.seed, self._stream(), self.element), torch.float32)

    def integer(self, span: int) -> Expr:
        """Uniform int64 in [0, span)."""
        return ir.Op("randint", (self.seed, self._stream(), self.element, Constant(span, torch.int64)), torch.int64)

    def _stream(self) -> Expr:
        return Constant(self.stream, torch.int32)


def _random_node(builder: GraphLowering, meta: torch.Tensor, body: Callable[[LoweringContext, _Draw], Expr]) -> TensorArg:
    """A pointwise node with ``meta``'s layout whose body draws from a stream of its own."""
    seed, stream = _new_stream(builder)

    # int32 element indices where they fit: the same counters, and less integer work for kernels
    # bound by it (the bf16 dropout of the module docstring took 311 us with int64 indices)
    index_dtype = torch.int32 if meta.numel() < 2**31 else torch.int64

    def build(ctx: LoweringContext) -> Expr:
        element = ir.IndexValue(indexing.ravel(ctx.vars, indexing.contiguous_strides(ctx.sizes)), index_dtype)
        return body(ctx, _Draw(ctx.load(seed), stream, element))

    return builder.pointwise(tuple(meta.shape), meta.dtype, build, tuple(meta.stride()))


def _check_default_generator(generator: Any) -> None:
    if generator is not None:
        raise Unsupported("a generator other than torch's default one")


def _check_factory(builder: GraphLowering, generator: Any, layout: Any, device: Any) -> None:
    _check_default_generator(generator)
    if layout not in (None, torch.strided):
        raise Unsupported(f"layout {layout}")
    if device is not None:
        want, have = torch.device(device), builder.device
        if want.type != have.type or (want.index is not None and have.index is not None and want.index != have.index):
            raise Unsupported(f"random values on {want}, the graph's tensors are on {have}")


def _probability(p: Any) -> float:
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p <= 1:
        raise Unsupported(f"probability {p!r}")
    return float(p)


def _meta(builder: GraphLowering) -> torch.Tensor:
    meta = builder.out_meta
    assert isinstance(meta, torch.Tensor)
    return meta


# ----------------------------------------------------------------------- uniform and normal


@register_composite(aten.rand.default, aten.rand.generator)
def rand(builder: GraphLowering, size: Any, generator: Any = None, dtype: Any = None, layout: Any = None,
         device: Any = None, pin_memory: Any = None) -> TensorArg:
    _check_factory(builder, generator, layout, device)
    meta = _meta(builder)
    return _random_node(builder, meta, lambda ctx, draw: draw.uniform(meta.dtype))


@register_composite(aten.rand_like.default)
def rand_like(builder: GraphLowering, self: TensorArg, dtype: Any = None, layout: Any = None, device: Any = None,
              pin_memory: Any = None, memory_format: Any = None) -> TensorArg:
    return rand(builder, None, None, dtype, layout, device, pin_memory)


@register_composite(aten.randn.default, aten.randn.generator)
def randn(builder: GraphLowering, size: Any, generator: Any = None, dtype: Any = None, layout: Any = None,
          device: Any = None, pin_memory: Any = None) -> TensorArg:
    _check_factory(builder, generator, layout, device)
    return _random_node(builder, _meta(builder), lambda ctx, draw: draw.normal())


@register_composite(aten.randn_like.default)
def randn_like(builder: GraphLowering, self: TensorArg, dtype: Any = None, layout: Any = None, device: Any = None,
               pin_memory: Any = None, memory_format: Any = None) -> TensorArg:
    return randn(builder, None, None, dtype, layout, device, pin_memory)


def _normal(builder: GraphLowering, mean: Any, std: Any, generator: Any) -> TensorArg:
    """``mean + std * z`` for a standard normal ``z``, in the output's compute dtype."""
    _check_default_generator(generator)
    meta = _meta(builder)
    if not meta.dtype.is_floating_point:
        raise Unsupported(f"normal of {meta.dtype}")
    compute = ir.compute_dtype(meta.dtype)

    def body(ctx: LoweringContext, draw: _Draw) -> Expr:
        return op("add", ctx.value(mean, compute), op("mul", ctx.value(std, compute), cast(draw.normal(), compute)))

    return _random_node(builder, meta, body)


@register_composite(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal(builder: GraphLowering, mean: Any, std: Any = 1.0, generator: Any = None) -> TensorArg:
    return _normal(builder, mean, std, generator)


@register_composite(aten.normal.float_float)
def normal_sized(builder: GraphLowering, mean: float, std: float, size: Any, generator: Any = None,
                 dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> TensorArg:
    _check_factory(builder, generator, layout, device)
    return _normal(builder, mean, std, generator)


# ------------------------------------------------------------------------------- integers


def _randint(builder: GraphLowering, low: Any, high: Any) -> TensorArg:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
        raise Unsupported("randint bounds that are not integers")
    span = high - low
    if not 0 < span < 2**32:
        raise Unsupported(f"randint over a range of {span} values")
    meta = _meta(builder)
    if meta.dtype == torch.bool:
        raise Unsupported("randint of bool")

    def body(ctx: LoweringContext, draw: _Draw) -> Expr:
        return op("add", draw.integer(span), Constant(low, torch.int64))

    return _random_node(builder, meta, body)


@register_composite(aten.randint.default, aten.randint.generator, aten.randint.low, aten.randint.low_generator)
def randint(builder: GraphLowering, high: Any, size: Any, low: Any = 0, generator: Any = None, dtype: Any = None,
            layout: Any = None, device: Any = None, pin_memory: Any = None) -> TensorArg:
    _check_factory(builder, generator, layout, device)
    return _randint(builder, low, high)


@register_composite(aten.randint_like.default, aten.randint_like.low_dtype)
def randint_like(builder: GraphLowering, self: TensorArg, high: Any, low: Any = 0, dtype: Any = None,
                 layout: Any = None, device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> TensorArg:
    _check_factory(builder, None, layout, device)
    return _randint(builder, low, high)


# ------------------------------------------------------------------------ bernoulli, dropout


@register_composite(aten.bernoulli.p)
def bernoulli_p(builder: GraphLowering, self: TensorArg, p: Any = 0.5, generator: Any = None) -> TensorArg:
    _check_default_generator(generator)
    prob = _probability(p)
    meta = _meta(builder)
    return _random_node(builder, meta, lambda ctx, draw: op(
        "lt", draw.uniform(torch.float32), Constant(prob, torch.float32), dtype=torch.bool))


@register_composite(aten.bernoulli.Tensor)
def bernoulli_tensor(builder: GraphLowering, self: TensorArg, p: TensorArg, generator: Any = None) -> TensorArg:
    """1 where a uniform value falls below ``p`` (broadcast to ``self``), compared in ``p``'s
    compute dtype."""
    _check_default_generator(generator)
    if not isinstance(p, TensorArg) or not p.dtype.is_floating_point:
        raise Unsupported("bernoulli with a probability that is not a float tensor")
    compute = ir.compute_dtype(p.dtype)
    return _random_node(builder, _meta(builder), lambda ctx, draw: op(
        "lt", draw.uniform(compute), ctx.value(p, compute), dtype=torch.bool))


@register_composite(aten.native_dropout.default)
def native_dropout(builder: GraphLowering, input: TensorArg, p: Any, train: Any) -> tuple[TensorArg, TensorArg]:
    """(``input * mask * scale``, ``mask``): each element kept with probability 1 - p, scaled by
    1 / (1 - p), or 0 for p = 1, in that order of operations, as eager computes it (a NaN or an
    infinity dropped gives NaN). ``train=False`` keeps every element. On CUDA, eager answers
    p = 1 with zeros (a NaN or an infinity gives 0 there): so does this, on CUDA."""
    prob = _probability(p)
    out_meta, mask_meta = builder.out_meta
    dtype = out_meta.dtype

    def constant(meta: torch.Tensor, value: Any) -> TensorArg:
        return builder.pointwise(tuple(meta.shape), meta.dtype, lambda ctx: Constant(value, meta.dtype),
                                 tuple(meta.stride()))

    if train is False:
        out = builder.pointwise(tuple(out_meta.shape), dtype, lambda ctx: ctx.load(input), tuple(out_meta.stride()))
        return out, constant(mask_meta, True)
    if prob == 1 and builder.device.type == "cuda":
        return constant(out_meta, 0.0), constant(mask_meta, False)
    mask = _random_node(builder, mask_meta, lambda ctx, draw: op(
        "ge", draw.uniform(torch.float32), Constant(prob, torch.float32), dtype=torch.bool))
    scale = 0.0 if prob == 1 else 1.0 / (1.0 - prob)
    compute = ir.compute_dtype(dtype)

    def scaled(ctx: LoweringContext) -> Expr:
        kept = op("mul", ctx.value(input, compute), ctx.value(mask, compute))
        return op("mul", kept, Constant(scale, compute))

    return builder.pointwise(tuple(out_meta.shape), dtype, scaled, tuple(out_meta.stride())), mask
