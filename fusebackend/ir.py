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

Everything here is a frozen dataclass and prints as readable text; ``verify`` checks a graph.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Sequence, Union

import sympy
import torch

from fusebackend import indexing

# ----------------------------------------------------------------------------------- buffers


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A named allocation: a graph input, a node's output, or an extern's output."""

    name: str
    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def whole(self) -> "View":
        return View(self, self.sizes, self.strides, 0)

    def __str__(self) -> str:
        return f"{self.name}: {dtype_name(self.dtype)}{list(self.sizes)} strides {list(self.strides)}"


@dataclasses.dataclass(frozen=True)
class View:
    """A strided window over a buffer's storage (offset in elements from the buffer's start)."""

    buffer: Buffer
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def dtype(self) -> torch.dtype:
        return self.buffer.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    def is_whole(self) -> bool:
        b = self.buffer
        return self.offset == 0 and self.sizes == b.sizes and self.strides == b.strides

    def distinct_elements(self) -> int:
        """Elements of storage this view touches (broadcast dims count once)."""
        n = math.prod(s for s, st in zip(self.sizes, self.strides) if st != 0)
        return min(n, self.buffer.numel) if self.numel else 0

    def __str__(self) -> str:
        if self.is_whole():
            return self.buffer.name
        return (
            f"{self.buffer.name}.view({list(self.sizes)}, strides={list(self.strides)},"
            f" offset={self.offset})"
        )


# ------------------------------------------------------------------------------- expressions

# Every op a body may use, with its arity. Codegen has one rendering per name (a test checks).
OP_ARITY: dict[str, int] = {
    # arithmetic
    "add": 2, "sub": 2, "mul": 2, "truediv": 2, "neg": 1, "abs": 1,
    "int_truncdiv": 2, "int_truncmod": 2, "fmod": 2,
    "maximum": 2, "minimum": 2,
    # math
    "exp": 1, "exp2": 1, "log": 1, "log2": 1, "sqrt": 1, "rsqrt": 1, "sin": 1, "cos": 1,
    "tanh": 1, "sigmoid": 1, "erf": 1, "floor": 1, "ceil": 1, "log1p": 1, "expm1": 1,
    "isnan": 1, "isinf": 1,
    # comparisons and logic
    "eq": 2, "ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2,
    "logical_and": 2, "logical_or": 2, "logical_xor": 2, "logical_not": 1,
    "bitwise_and": 2, "bitwise_or": 2, "bitwise_xor": 2, "bitwise_not": 1,
    "where": 3,
    # dtype conversion (the target dtype is the Op's dtype)
    "to": 1,
    # counter-based random values (lowering/random_ops.py), a pure function of their arguments:
    # (seed, stream, element index, significand bits) -> uniform [0, 1), fp32 or (53 bits) fp64;
    # (seed, stream, element index) -> standard normal fp32; (..., span) -> int64 in [0, span)
    "rand": 4, "randn": 3, "randint": 4,
    # special math functions (fp32; signbit, copysign and hypot also fp64): kernels/math_helpers.py
    "atan": 1, "atan2": 2, "sinh": 1, "asinh": 1, "acosh": 1, "erfc": 1, "erfcx": 1, "erfinv": 1,
    "ndtri": 1, "lgamma": 1, "digamma": 1, "hypot": 2, "copysign": 2, "signbit": 1,
    "trigamma": 1, "i0": 1, "i0e": 1, "i1": 1, "i1e": 1, "nextafter": 2, "ldexp": 2,
    "frexp_mantissa": 1, "frexp_exponent": 1,
    # integer ops: gcd, and shifts by an amount in [0, bit width) (lowerings guard the rest)
    "gcd": 2, "lshift": 2, "rshift": 2,
}

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# The dtypes generated kernels load, compute and store. An op with a tensor of another dtype
# (complex, float8, unsigned 16-64 bit) stays an ATen call, as does a view that changes the
# dtype or carries a conjugate or negative bit: a View is a window of its buffer's elements.
KERNEL_DTYPES = frozenset(FLOAT_DTYPES + (
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic happens in: half types widen to fp32, small ints to int32."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if dtype in (torch.int8, torch.int16, torch.uint8, torch.bool):
        return torch.int32
    return dtype


@dataclasses.dataclass(frozen=True)
class Load:
    view: View
    index: tuple[sympy.Expr, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.view.dtype


@dataclasses.dataclass(frozen=True)
class IndirectLoad:
    """A load whose index along ``dim`` is a value computed at run time (gather, cat, embedding).

    ``index`` has one entry per view dim; the entry at ``dim`` is unused. ``position`` is an
    integer expression, the index along ``dim``. ``more`` holds further ``(dim, position)``
    pairs, for advanced indexing with several index tensors (``x[i, :, j]``); their entries of
    ``index`` are unused too. With ``valid`` (a bool expression) the load happens only where that
    is true and gives 0 elsewhere, and reads no memory there: a concatenation reads each element
    from one of its inputs only.

    ``checked``: the positions come from data (an index tensor) and may lie outside
    [0, size of their dim). The kernel then asserts that they do not (eager raises an index
    error; a device-side assert on the GPU) and reads no memory where they do. It is False
    where the positions are proven in range: computed from the loop index (cat) or from values
    whose range is known (``lowering/index_bounds.py``).
    """

    view: View
    index: tuple[sympy.Expr, ...]
    dim: int
    position: "Expr"
    valid: "Expr | None" = None
    more: tuple[tuple[int, "Expr"], ...] = ()
    checked: bool = True

    @property
    def dtype(self) -> torch.dtype:
        return self.view.dtype

    @property
    def positions(self) -> tuple[tuple[int, "Expr"], ...]:
        """Every (dim, position) pair the load indexes at run time."""
        return ((self.dim, self.position),) + self.more


@dataclasses.dataclass(frozen=True)
class Constant:
    value: Union[bool, int, float]
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class IndexValue:
    """An index expression used as a value (arange, iota)."""

    index: sympy.Expr
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A value codegen has already computed (a temporary's name); lowering never makes one."""

    name: str
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    args: tuple["Expr", ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        arity = OP_ARITY.get(self.name)
        if arity is None:
            raise ValueError(f"unknown IR op {self.name!r}")
        if arity != len(self.args):
            raise ValueError(f"IR op {self.name} takes {arity} args, got {len(self.args)}")


Expr = Union[Load, IndirectLoad, Constant, IndexValue, Rendered, Op]


def cast(x: Expr, dtype: torch.dtype) -> Expr:
    """Convert ``x`` to ``dtype``, folding what needs no instruction.

    A float widened straight after being narrowed (fp32 -> bf16 -> fp32, which fusion creates
    between two ops of a half-precision chain) keeps its fp32 value: fused chains compute in fp32
    and round once, on store.
    """
    if x.dtype == dtype:
        return x
    if isinstance(x, Constant):
        return Constant(_convert_scalar(x.value, dtype), dtype)
    if (
        isinstance(x, Op)
        and x.name == "to"
        and x.args[0].dtype == dtype
        and dtype in FLOAT_DTYPES
        and x.dtype in FLOAT_DTYPES
        and x.dtype.itemsize < dtype.itemsize
    ):
        return x.args[0]
    return Op("to", (x,), dtype)


def _convert_scalar(value: Any, dtype: torch.dtype) -> Union[bool, int, float]:
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"cannot convert {value} to {dtype}")
    return int(value)


def op(name: str, *args: Expr, dtype: torch.dtype | None = None) -> Expr:
    """Build an Op (its dtype defaults to its first value argument's); ops of constants are folded."""
    if dtype is None:
        dtype = args[1].dtype if name == "where" else args[0].dtype
    result = Op(name, tuple(args), dtype)
    return fold(result)


def _fold_table() -> dict[str, Callable[..., torch.Tensor]]:
    t = torch
    return {
        "add": t.add, "sub": t.sub, "mul": t.mul, "truediv": t.div, "neg": t.neg, "abs": t.abs,
        "int_truncdiv": lambda a, b: t.div(a, b, rounding_mode="trunc"), "int_truncmod": t.fmod,
        "fmod": t.fmod, "maximum": t.maximum, "minimum": t.minimum, "exp": t.exp, "exp2": t.exp2,
        "log": t.log, "log2": t.log2, "sqrt": t.sqrt, "rsqrt": t.rsqrt, "sin": t.sin, "cos": t.cos,
        "tanh": t.tanh, "sigmoid": t.sigmoid, "erf": t.erf, "floor": t.floor, "ceil": t.ceil,
        "log1p": t.log1p, "expm1": t.expm1, "isnan": t.isnan, "isinf": t.isinf, "eq": t.eq,
        "ne": t.ne, "lt": t.lt, "le": t.le, "gt": t.gt, "ge": t.ge, "logical_and": t.logical_and,
        "logical_or": t.logical_or, "logical_xor": t.logical_xor, "logical_not": t.logical_not,
        "bitwise_and": t.bitwise_and, "bitwise_or": t.bitwise_or, "bitwise_xor": t.bitwise_xor,
        "bitwise_not": t.bitwise_not, "where": t.where,
        "atan": t.atan, "atan2": t.atan2, "sinh": t.sinh, "asinh": t.asinh, "acosh": t.acosh,
        "erfc": t.erfc, "erfcx": t.special.erfcx, "erfinv": t.erfinv, "ndtri": t.special.ndtri,
        "lgamma": t.lgamma, "digamma": t.digamma, "hypot": t.hypot, "copysign": t.copysign,
        "signbit": t.signbit, "trigamma": lambda a: t.polygamma(1, a), "i0": t.i0, "i0e": t.special.i0e,
        "i1": t.special.i1, "i1e": t.special.i1e, "nextafter": t.nextafter, "ldexp": t.ldexp, "gcd": t.gcd,
        "lshift": t.bitwise_left_shift, "rshift": t.bitwise_right_shift,
        "frexp_mantissa": lambda a: t.frexp(a).mantissa, "frexp_exponent": lambda a: t.frexp(a).exponent,
    }


_FOLD: dict[str, Callable[..., torch.Tensor]] = {}


def fold(expr: Expr) -> Expr:
    """Evaluate an Op whose arguments are all constants (with torch, in the op's dtypes)."""
    if not isinstance(expr, Op) or not expr.args or not all(isinstance(a, Constant) for a in expr.args):
        return expr
    if not _FOLD:
        _FOLD.update(_fold_table())
    if expr.name == "to":
        return cast(expr.args[0], expr.dtype)
    fn = _FOLD.get(expr.name)
    if fn is None:
        return expr
    try:
        value = fn(*(torch.tensor(a.value, dtype=a.dtype) for a in expr.args))
    except (RuntimeError, TypeError):  # e.g. an integer division by zero: leave it to run time
        return expr
    return Constant(_convert_scalar(value.to(expr.dtype).item(), expr.dtype), expr.dtype)


def walk(expr: Expr) -> Iterator[Expr]:
    yield expr
    if isinstance(expr, Op):
        for a in expr.args:
            yield from walk(a)
    elif isinstance(expr, IndirectLoad):
        for _, position in expr.positions:
            yield from walk(position)
        if expr.valid is not None:
            yield from walk(expr.valid)


def loads(expr: Expr) -> list[Load | IndirectLoad]:
    return [e for e in walk(expr) if isinstance(e, (Load, IndirectLoad))]


def map_expr(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``expr`` bottom-up; ``fn`` returns a replacement for a leaf or None to keep it."""
    if isinstance(expr, Op):
        new_args = tuple(map_expr(a, fn) for a in expr.args)
        if expr.name == "to":
            return cast(new_args[0], expr.dtype)
        return Op(expr.name, new_args, expr.dtype)
    if isinstance(expr, IndirectLoad):
        valid = None if expr.valid is None else map_expr(expr.valid, fn)
        more = tuple((d, map_expr(p, fn)) for d, p in expr.more)
        expr = dataclasses.replace(expr, position=map_expr(expr.position, fn), valid=valid, more=more)
    replaced = fn(expr)
    return expr if replaced is None else replaced


def substitute_index(expr: Expr, mapping: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    """Replace loop variables in every index of ``expr``."""

    def leaf(e: Expr) -> Expr | None:
        if isinstance(e, Load):
            return Load(e.view, tuple(sympy.sympify(i).xreplace(mapping) for i in e.index))
        if isinstance(e, IndirectLoad):
            return dataclasses.replace(e, index=tuple(sympy.sympify(i).xreplace(mapping) for i in e.index))
        if isinstance(e, IndexValue):
            return IndexValue(sympy.sympify(e.index).xreplace(mapping), e.dtype)
        return None

    return map_expr(expr, leaf)


def format_expr(expr: Expr) -> str:
    if isinstance(expr, Load):
        idx = ", ".join(indexing.pexpr(i) for i in expr.index)
        return f"{expr.view}[{idx}]"
    if isinstance(expr, IndirectLoad):
        idx = [indexing.pexpr(i) for i in expr.index]
        for d, position in expr.positions:
            idx[d] = format_expr(position)
        guard = "" if expr.valid is None else f" if {format_expr(expr.valid)}"
        check = " (checked)" if expr.checked else ""
        return f"{expr.view}[{', '.join(idx)}]{guard}{check}"
    if isinstance(expr, Constant):
        return repr(expr.value)
    if isinstance(expr, IndexValue):
        return f"index({indexing.pexpr(expr.index)})"
    if isinstance(expr, Rendered):
        return expr.name
    if expr.name == "to":
        return f"to_{dtype_name(expr.dtype)}({format_expr(expr.args[0])})"
    return f"{expr.name}({', '.join(format_expr(a) for a in expr.args)})"


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

    def reads(self) -> list[View]:
        return [ld.view for ld in loads(self.body)]

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
    return loads(node.body)


def _flatten(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flatten(v)
    else:
        yield value


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
    node or at another element (``lowering.mutations`` proves it before one is recorded).
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


def dtype_name(dtype: torch.dtype) -> str:
    return {
        torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
        torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
        torch.uint8: "u8", torch.bool: "b1",
    }.get(dtype, str(dtype).replace("torch.", ""))


def verify(graph: IRGraph) -> None:
    """Check the graph's invariants; raises AssertionError naming the first broken one."""
    defined: dict[str, Buffer] = {b.name: b for b in graph.input_buffers()}
    assert len(defined) == len(graph.input_buffers()), "duplicate input buffer names"
    for node in graph.nodes:
        for view in node.reads():
            b = view.buffer
            assert defined.get(b.name) == b, f"{_name(node)} reads {b.name} before it is written"
            _check_view(view)
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
    for name, target in graph.mutations.items():
        assert name in pointwise and target in inputs, f"{name} -> {target}: not a pointwise node into an input"
        buf, dst = pointwise[name].buffer, inputs[target]
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


def _check_view(view: View) -> None:
    if view.numel == 0:
        return
    last = view.offset + sum((s - 1) * st for s, st in zip(view.sizes, view.strides))
    b = view.buffer
    base_last = sum((s - 1) * st for s, st in zip(b.sizes, b.strides))
    assert view.offset >= 0 and last <= base_last, f"view {view} reaches outside {b.name}"


def _name(node: Node) -> str:
    return node.name


def nodes_by_name(nodes: Sequence[Node]) -> dict[str, Node]:
    return {n.name: n for n in nodes}
