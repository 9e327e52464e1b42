"""The IR between lowering and codegen: buffers, views, expression bodies and nodes.

Design in one paragraph. Every ATen op of the graph becomes one node that writes one buffer
(``Pointwise``, ``Reduction``) or an ``Extern`` that calls ATen. A buffer has exactly the sizes,
strides and dtype eager PyTorch gives that op's output (lowering reads them off the op's meta
function), so a view of any buffer is just another ``View``: sizes, strides and an offset over the
same storage, never a copy, and an extern call sees the layout eager would hand it. A node's
``body`` is a small expression tree over loop variables ``i0, i1, ...`` (one per output dim) and,
for reductions, ``r0, r1, ...`` (one per reduced dim). A ``Load`` reads a view at a per-dim index
(sympy); the scheduler fuses nodes into groups and codegen inlines a producer's body wherever a
consumer in the same group loads its buffer, so fused intermediates never reach memory.

Prefix scans (``Scan``) and scatters (``Scatter``) are nodes too. A ``Scatter`` is the one node
that writes memory another node produced (its target, the copy lowering makes for it): its buffer
is a new name for that memory, so each buffer is still written once, in place, and whatever reads
the result depends on the scatter.

The expressions of bodies live in ``expr.py``, ``Buffer`` and ``View`` in ``buffers.py`` (below
``expr``, whose loads read views); both are re-exported here. Everything is a frozen
dataclass and prints as readable text; ``verify`` checks a graph.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterator, Sequence, Union

import sympy
import torch

from fusebackend import indexing, sizevars
from fusebackend.buffers import Buffer, View  # noqa: F401  (re-exported: ir.Buffer, ir.View)
from fusebackend.expr import (  # noqa: F401  (re-exported: the IR's expressions are ir.Load, ir.op...)
    FLOAT_DTYPES, KERNEL_DTYPES, OP_ARITY, Constant, Expr, IndexValue, IndirectLoad, Load, Op, Rendered,
    _convert_scalar, _fold_table, affine_index, cast, compute_dtype, dtype_name, fold, format_expr, loads, map_expr, op,
    substitute_index, walk,
)

# ------------------------------------------------------------------------------------- nodes


class _Computed:
    """What Pointwise and Reduction share: a buffer they write from a body they evaluate."""

    buffer: Buffer
    body: Expr
    origin: str
    recomputes: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def ranges(self) -> tuple[int, ...]:
        return self.buffer.sizes

    @functools.cached_property
    def body_loads(self) -> tuple[Load | IndirectLoad, ...]:
        """The body's loads, in ``loads``' order, found once per node (the scheduler asks for
        them at every candidate fusion the node is in)."""
        return tuple(loads(self.body))

    def reads(self) -> list[View]:
        return [ld.view for ld in self.body_loads]

    def described(self) -> str:
        """The origin, and the nodes whose computation the scheduler folded into the body."""
        return self.origin + (f"; recomputes {', '.join(self.recomputes)}" if self.recomputes else "")


@dataclasses.dataclass(frozen=True)
class Pointwise(_Computed):
    """``buffer[i0, i1, ...] = body`` for every index of the buffer's sizes.

    ``recomputes`` names the pointwise nodes (with their origins) whose bodies the scheduler
    substituted into this one instead of storing them (``scheduler/recompute.py``).
    """

    buffer: Buffer
    body: Expr
    origin: str
    recomputes: tuple[str, ...] = ()


# "m2": the sum of squared deviations from the mean of the values reduced (Welford, one pass)
REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "m2")


@dataclasses.dataclass(frozen=True)
class Reduction(_Computed):
    """``buffer[i...] = reduce over r... of body``; the body sees both ``i`` and ``r`` variables.

    ``source_sizes`` is the shape of the tensor being reduced and ``source_index`` its index in
    terms of the ``i`` and ``r`` variables (kept dims are ``i``, reduced dims ``r``). A
    pointwise node of that shape can then share this reduction's kernel: its element at
    ``source_index`` is computed in the same (row, column) iteration. ``body`` has the
    accumulation dtype (fp32 for half inputs); argmax/argmin bodies give the values compared and
    the buffer receives indices into the reduced dims (row-major). ``source_valid``, a bool
    expression in the same variables, is set where the (row, position) pairs outnumber the
    source's elements (a split whose equal chunks overrun the rows): it holds at the pairs that
    stand for an element, each exactly once; elsewhere ``source_index`` may repeat an element.
    """

    buffer: Buffer
    body: Expr
    reduction_ranges: tuple[int, ...]
    reduction_type: str
    source_sizes: tuple[int, ...]
    source_index: tuple[sympy.Expr, ...]
    origin: str
    recomputes: tuple[str, ...] = ()  # as for Pointwise
    source_valid: Expr | None = None
    # a matrix product [M, N] over K (``lowering.matmuls``): the body is a factor over (i0, r0)
    # times one over (r0, i1), generated with ``tl.dot`` over tiles (``codegen/product.py``)
    product: bool = False

    def __post_init__(self) -> None:
        if self.reduction_type not in REDUCTION_TYPES:
            raise ValueError(f"unknown reduction type {self.reduction_type!r}")

    @property
    def reduction_numel(self) -> int:
        return math.prod(self.reduction_ranges)


@dataclasses.dataclass(frozen=True)
class Extern:
    """A call of an ATen op we do not generate code for.

    ``args``/``kwargs`` hold Views where the op takes tensors and plain Python values otherwise.
    ``outputs`` lists the tensors the op returns, each with the path of indices that reaches it in
    the returned value (``()`` when the op returns one tensor).
    """

    name: str
    op: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    outputs: tuple[tuple[tuple[int, ...], Buffer], ...]
    mutates: bool
    origin: str

    def reads(self) -> list[View]:
        return [v for v in _flatten((self.args, dict(self.kwargs))) if isinstance(v, View)]


# What a Scan combines: sums, products, running maxima and minima, log-sum-exp; "argmax" and
# "argmin" give the position of the running maximum / minimum (cummax's and cummin's indices).
SCAN_TYPES = ("sum", "prod", "max", "min", "logsumexp", "argmax", "argmin")


@dataclasses.dataclass(frozen=True)
class Scan(_Computed):
    """``buffer[i...]`` = ``body`` combined by ``scan_type`` over the positions ``0..i[dim]`` of
    ``dim``, every other index fixed (a prefix scan: cumsum, cumprod, cummax...).

    ``body`` is in the buffer's loop variables, like a pointwise body, and has the accumulation
    dtype (fp32 for half types, int64 for integer sums and products); the buffer receives it cast
    to its own dtype. "argmax"/"argmin" write the position along ``dim`` of the running
    maximum/minimum as torch.cummax/cummin do: a NaN counts as the largest (smallest) value and
    stays once seen, and of equal values the later position wins.
    """

    buffer: Buffer
    body: Expr
    dim: int
    scan_type: str
    origin: str
    recomputes: tuple[str, ...] = ()  # as for Pointwise

    def __post_init__(self) -> None:
        if self.scan_type not in SCAN_TYPES:
            raise ValueError(f"unknown scan type {self.scan_type!r}")


# How a Scatter writes each value: stores it, or combines it with what is there atomically.
SCATTER_MODES = ("store", "sum", "max", "min")


@dataclasses.dataclass(frozen=True)
class Scatter:
    """``buffer`` is ``target`` after, for every index ``i`` of ``ranges``, ``value`` has been
    stored at its element ``position`` (``mode`` "store") or combined into it atomically.

    The scatter writes into ``target``'s memory in place: ``buffer`` is a new name for that memory
    once the scatter is done, so that every buffer is still written by one node and everything
    that reads the result depends on the scatter. ``target`` is written by a pointwise node (the
    copy of the tensor scattered into, which lowering makes for this scatter) or by another
    scatter, and nothing but this scatter reads it.

    ``position`` holds one int64 expression per dim of ``buffer`` in the loop variables ``i0,
    i1, ...`` of ``ranges``: an ``IndexValue`` where the dim is iterated, a computed value (an
    index tensor's element) elsewhere. A computed position outside the buffer writes nothing
    (codegen asserts it is in bounds and masks the write). With duplicate positions, "store"
    keeps one of the values, as eager does on a GPU.
    """

    buffer: Buffer
    target: Buffer
    ranges: tuple[int, ...]
    position: tuple[Expr, ...]
    value: Expr
    mode: str
    origin: str

    def __post_init__(self) -> None:
        if self.mode not in SCATTER_MODES:
            raise ValueError(f"unknown scatter mode {self.mode!r}")

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def numel(self) -> int:
        """How many values are scattered."""
        return math.prod(self.ranges)

    def exprs(self) -> tuple[Expr, ...]:
        return (self.value, *self.position)

    def reads(self) -> list[View]:
        # the target last: the scatter needs it complete before it starts, but loads nothing from it
        return [ld.view for e in self.exprs() for ld in loads(e)] + [self.target.whole()]

    def described(self) -> str:
        return f"{self.origin}; {self.mode} into {self.target.name}"


Node = Union[Pointwise, Reduction, Scan, Scatter, Extern]


def node_loads(node: Node) -> list[Load | IndirectLoad]:
    """Every load in a node's expressions (none for an extern)."""
    if isinstance(node, Extern):
        return []
    if isinstance(node, Scatter):
        return [ld for e in node.exprs() for ld in loads(e)]
    return list(node.body_loads)


def _flatten(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flatten(v)
    else:
        yield value


def storage_numel(buf: Buffer) -> int:
    """Elements of memory a buffer spans: from its first element to its last, plus one."""
    if any(s == 0 for s in buf.sizes):
        return 0
    n = 1 + sum((n - 1) * abs(s) for n, s in zip(buf.sizes, buf.strides))
    return n if isinstance(n, int) else sympy.expand(n)  # symbolic: one form for equal sizes


def may_alias_arguments(node: Extern) -> bool:
    """Whether an ATen op's result may share memory with an argument: its schema says a result
    aliases one (a view op), or it has no schema, or it is an ``unsafe_`` view op (unannotated),
    or it is a collective's ``wait_tensor``, which returns its argument though its schema says
    it makes a new tensor."""
    schema = getattr(node.op, "_schema", None)
    return (schema is None or any(r.alias_info is not None for r in schema.returns) or "unsafe" in schema.name
            or (is_collective(node) and schema.name.endswith("wait_tensor")))


# The namespaces of the functional collectives that traced graphs hold (all_reduce,
# all_gather_into_tensor, reduce_scatter_tensor, ..., and wait_tensor, which waits for one)
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd")


def is_collective(node: Node) -> bool:
    """Whether ``node`` is a functional collective or its wait. A collective runs asynchronously
    (NCCL's own stream on a GPU): its input is read, and its result written, until the matching
    ``wait_tensor`` returns, so neither buffer's memory may be written by anything else before
    then; and every process must issue the collectives of a graph in the same order."""
    return isinstance(node, Extern) and getattr(node.op, "namespace", None) in COLLECTIVE_NAMESPACES


def written_buffers(node: Node) -> list[Buffer]:
    if isinstance(node, Extern):
        return [b for _, b in node.outputs]
    return [node.buffer]


# ------------------------------------------------------------------------------------- graph


@dataclasses.dataclass
class IRGraph:
    """One compiled FX graph: its inputs, nodes in a valid execution order, and its outputs.

    ``inputs`` has one entry per graph argument: a Buffer for a tensor, or the concrete Python
    value (ints are specialized). ``outputs`` holds Views for tensors and plain values otherwise.
    ``mutations`` maps a pointwise node's buffer to the input buffer it is written into, in place
    (an ``aten.copy_`` into a graph input, such as batch norm's running statistics): the wrapper
    passes the input's memory as the node's output, and nothing else reads the input after the
    node or at another element (``lowering.mutations`` proves it before one is recorded). It also
    maps a scatter whose target is the input itself (a static cache's ``index_copy_``): the
    scatter writes its elements into the input's memory, after every other reader of the input.
    ``constants`` are tensors the graph holds (FX ``get_attr`` nodes, such as the empty tensor a
    key-value cache starts from): buffers the wrapper binds by name, each with its value.
    """

    name: str
    device: torch.device
    inputs: list[Any]
    nodes: list[Node]
    outputs: list[Any]
    mutations: dict[str, str] = dataclasses.field(default_factory=dict)
    constants: list[tuple[Buffer, torch.Tensor]] = dataclasses.field(default_factory=list)
    # buffer name -> the FX node whose value it holds (``node`` or ``node[k]`` for one of several
    # results), where it holds one whole: what ``fusebackend.checking`` compares with eager
    fx_values: dict[str, str] = dataclasses.field(default_factory=dict)
    # node name -> the Dynamo graph's node it was lowered from (``provenance.source_name``),
    # where AOTAutograd recorded one: what the schedule and the dumps say each kernel computes
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    # buffers an ATen call makes on another device than the graph's (a factory with
    # ``device="cpu"`` in a CUDA graph, as an index made by ``torch.arange`` can be): the wrapper
    # moves one to the graph's device before a kernel reads it
    foreign: frozenset[str] = frozenset()
    # symbolic sizes: Dynamo's shape environment, whose ranges prove facts about them
    shape_env: Any = None

    def producers(self) -> dict[str, Node]:
        return {b.name: n for n in self.nodes for b in written_buffers(n)}

    def results(self) -> set[str]:
        """Buffers that must be in memory when the graph returns: its outputs and the ones
        written into inputs."""
        return {o.buffer.name for o in self.outputs if isinstance(o, View)} | set(self.mutations)

    def input_buffers(self) -> list[Buffer]:
        """Buffers in memory before the graph runs: its tensor arguments and its constants."""
        return [b for b in self.inputs if isinstance(b, Buffer)] + [b for b, _ in self.constants]

    def __str__(self) -> str:
        lines = [f"graph {self.name} on {self.device}"]
        for k, inp in enumerate(self.inputs):
            lines.append(f"  input {k}: {inp}")
        for buf, _ in self.constants:
            lines.append(f"  constant {buf}")
        for node in self.nodes:
            lines.extend("  " + line for line in format_node(node).splitlines())
        for buf, target in self.mutations.items():
            lines.append(f"  {buf} is written into input {target} in place")
        outs = ", ".join(str(o) for o in self.outputs)
        lines.append(f"  return ({outs})")
        return "\n".join(lines)


def format_node(node: Node) -> str:
    if isinstance(node, Pointwise):
        return f"{node.buffer} = pointwise  # {node.described()}\n    {format_expr(node.body)}"
    if isinstance(node, Reduction):
        return (
            f"{node.buffer} = {node.reduction_type} over r{list(node.reduction_ranges)}"
            f"  # {node.described()}\n    {format_expr(node.body)}"
        )
    if isinstance(node, Scan):
        return (
            f"{node.buffer} = {node.scan_type} scan along dim {node.dim}"
            f"  # {node.described()}\n    {format_expr(node.body)}"
        )
    if isinstance(node, Scatter):
        where = ", ".join(format_expr(p) for p in node.position)
        assign = "=" if node.mode == "store" else f"{node.mode}="
        return (
            f"{node.buffer} = scatter into {node.target.name} over {list(node.ranges)}  # {node.origin}"
            f"\n    {node.buffer.name}[{where}] {assign} {format_expr(node.value)}"
        )
    outs = ", ".join(str(b) for _, b in node.outputs) or "(no tensor outputs)"
    args = ", ".join(str(a) for a in node.args)
    kw = "".join(f", {k}={v}" for k, v in node.kwargs)
    return f"{outs} = extern {node.op}({args}{kw})"


def verify(graph: IRGraph) -> None:
    """Check the graph's invariants; raises AssertionError naming the first broken one."""
    defined: dict[str, Buffer] = {b.name: b for b in graph.input_buffers()}
    assert len(defined) == len(graph.input_buffers()), "duplicate input buffer names"
    for node in graph.nodes:
        for view in node.reads():
            b = view.buffer
            assert defined.get(b.name) == b, f"{_name(node)} reads {b.name} before it is written"
            _check_view(view, graph.shape_env)
        if isinstance(node, Scatter):
            _verify_scatter(graph, node)
        if isinstance(node, (Pointwise, Reduction, Scan)):
            nvars = len(node.ranges)
            allowed = set(indexing.loop_vars("i", nvars))
            if isinstance(node, Reduction):
                allowed |= set(indexing.loop_vars("r", len(node.reduction_ranges)))
            for e in walk(node.body):
                if isinstance(e, (Load, IndirectLoad)):
                    assert len(e.index) == len(e.view.sizes), f"{node.name}: index rank mismatch"
                    for i in e.index:
                        free = sympy.sympify(i).free_symbols
                        assert free <= allowed, f"{node.name}: index uses unknown vars {free - allowed}"
                if isinstance(e, IndirectLoad):
                    dims = [d for d, _ in e.positions]
                    assert len(set(dims)) == len(dims) and all(0 <= d < len(e.view.sizes) for d in dims), (
                        f"{node.name}: gather dims {dims} of a rank-{len(e.view.sizes)} view"
                    )
                    assert all(not p.dtype.is_floating_point and p.dtype != torch.bool for _, p in e.positions), (
                        f"{node.name}: a gather position is not an integer"
                    )
                if isinstance(e, Op) and e.name in ("add", "sub", "mul", "maximum", "minimum"):
                    assert all(a.dtype == e.dtype for a in e.args), f"{node.name}: mixed dtypes in {e.name}"
                if isinstance(e, Op) and e.name == "where":
                    assert e.args[0].dtype == torch.bool, f"{node.name}: where() condition is not bool"
                    assert e.args[1].dtype == e.args[2].dtype == e.dtype, f"{node.name}: where() dtypes differ"
            if isinstance(node, Scan):
                assert 0 <= node.dim < len(node.ranges), f"{node.name}: scans along dim {node.dim}"
            if node.buffer.numel:
                assert indexing.is_dense(node.buffer.sizes, node.buffer.strides), (
                    f"{node.name}: output layout is not dense"
                )
        for buf in written_buffers(node):
            assert buf.name not in defined, f"buffer {buf.name} written twice"
            defined[buf.name] = buf
    for out in graph.outputs:
        if isinstance(out, View):
            assert defined.get(out.buffer.name) == out.buffer, f"output {out} is never written"
    inputs = {b.name: b for b in graph.inputs if isinstance(b, Buffer)}
    pointwise = {n.name: n for n in graph.nodes if isinstance(n, Pointwise)}
    into_input = {n.name: n for n in graph.nodes if isinstance(n, Scatter) and n.target.name in inputs}
    for name, target in graph.mutations.items():
        writer = pointwise.get(name) or into_input.get(name)
        assert writer is not None and target in inputs, f"{name} -> {target}: not a pointwise node into an input"
        assert not isinstance(writer, Scatter) or writer.target.name == target, f"{name} scatters into another input"
        buf, dst = writer.buffer, inputs[target]
        assert (buf.dtype, buf.sizes, buf.strides) == (dst.dtype, dst.sizes, dst.strides), (
            f"{name} does not have input {target}'s layout"
        )
    assert len(set(graph.mutations.values())) == len(graph.mutations), "an input written twice in place"


def _check_body(node: Node, exprs: Sequence[Expr], allowed: set[sympy.Symbol]) -> None:
    for expr in exprs:
        for e in walk(expr):
            if isinstance(e, (Load, IndirectLoad)):
                assert len(e.index) == len(e.view.sizes), f"{node.name}: index rank mismatch"
                for i in e.index:
                    free = sympy.sympify(i).free_symbols
                    assert free <= allowed, f"{node.name}: index uses unknown vars {free - allowed}"
            if isinstance(e, IndexValue):
                free = sympy.sympify(e.index).free_symbols
                assert free <= allowed, f"{node.name}: index value uses unknown vars {free - allowed}"


def _verify_scatter(graph: IRGraph, node: Scatter) -> None:
    """A scatter's target is the node before's buffer, which only the scatter reads, and its
    positions and value fit the buffer."""
    buf, target = node.buffer, node.target
    assert (buf.dtype, buf.sizes, buf.strides) == (target.dtype, target.sizes, target.strides), (
        f"{node.name} does not have its target {target.name}'s layout"
    )
    assert indexing.is_dense(buf.sizes, buf.strides) or not buf.numel, f"{node.name}: output layout is not dense"
    if graph.mutations.get(node.name) == target.name:  # into an input's memory (lowering.mutations)
        assert target in graph.inputs, f"{node.name} scatters into {target.name}, not an input"
        assert len(node.position) == len(buf.sizes), f"{node.name}: one position per dim"
        return
    producer = next((n for n in graph.nodes if target in written_buffers(n)), None)
    assert isinstance(producer, (Pointwise, Scatter)), f"{node.name} scatters into {target.name}, not a node's buffer"
    readers = [n.name for n in graph.nodes if any(v.buffer.name == target.name for v in n.reads())]
    assert readers == [node.name], f"{target.name} is read by {readers}, not by its scatter {node.name} alone"
    assert target.name not in graph.results(), f"{node.name} scatters into a result of the graph"
    assert len(node.position) == len(buf.sizes), f"{node.name}: one position per dim"
    assert all(p.dtype == torch.int64 for p in node.position), f"{node.name}: positions are not int64"
    assert node.value.dtype == buf.dtype, f"{node.name}: value dtype {node.value.dtype} is not {buf.dtype}"
    ivars = indexing.loop_vars("i", len(node.ranges))
    _check_body(node, node.exprs(), set(ivars))
    ranges = dict(zip(ivars, node.ranges))
    for p, size in zip(node.position, buf.sizes):
        if isinstance(p, IndexValue) and node.numel:
            lo, hi = indexing.bounds(sympy.sympify(p.index), ranges)
            assert 0 <= lo and hi < size, f"{node.name}: an iterated position leaves its dim"


def _check_view(view: View, shape_env: Any = None) -> None:
    if view.numel == 0:
        return
    last = view.offset + sum((s - 1) * st for s, st in zip(view.sizes, view.strides))
    b = view.buffer
    base_last = sum((s - 1) * st for s, st in zip(b.sizes, b.strides))
    # over symbolic sizes, proven for every value the symbols may take (sizevars.known_le)
    assert sizevars.known_le(0, view.offset, shape_env) and sizevars.known_le(last, base_last, shape_env), (
        f"view {view} reaches outside {b.name}")


def _name(node: Node) -> str:
    return node.name


def nodes_by_name(nodes: Sequence[Node]) -> dict[str, Node]:
    return {n.name: n for n in nodes}
