"""Expression bodies of IR nodes: loads, constants, index values and ops over them.

A node's ``body`` (``ir.py``) is one of these trees over its loop variables. ``op`` builds an op
and folds it when its arguments are constants; ``cast`` converts, folding what needs no
instruction; ``walk``, ``loads``, ``map_expr`` and ``substitute_index`` visit and rewrite a tree;
``format_expr`` prints one. ``OP_ARITY`` is the one table of op names, which codegen renders
(``codegen/triton_ops.py``). ``ir`` re-exports all of it: the IR is used as ``ir.Load``,
``ir.op`` and so on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Union

import sympy
import torch

from fusebackend import indexing
from fusebackend.buffers import View, dtype_name  # noqa: F401  (dtype_name re-exported: expr.dtype_name)

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
    # dtype conversion (the target dtype is the Op's dtype); round_to: a half-precision value
    # computed in fp32 put on its dtype's grid, as eager stores it between two ops (codegen/body.py)
    "to": 1, "round_to": 1,
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
    # (position, size): the position, asserted in [0, size) where the kernel evaluates it (a
    # scatter lowered to a comparison, lowering/scatters.py; codegen/body.py renders it)
    "checked_position": 2,
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

    def computed_index(self) -> tuple[sympy.Expr, ...] | None:
        """The whole index as index expressions, where every position is computed from loop
        indices (a concatenation's ``here - start``), not read from data; None for a gather.

        Such a load reads the element ``view[index]`` where ``valid`` holds, like a plain load,
        so the buffer may also be computed in the same kernel (inlined under ``valid``).
        """
        if self.checked:
            return None
        idx = list(self.index)
        for d, position in self.positions:
            affine = affine_index(position)
            if affine is None:
                return None
            idx[d] = affine
        return tuple(idx)


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


def affine_index(expr: Expr) -> sympy.Expr | None:
    """``expr`` as an index expression when it is one (integer constants, indices, their sums
    and differences, casts between integer types); None otherwise."""
    if isinstance(expr, Constant) and isinstance(expr.value, int) and not isinstance(expr.value, bool):
        return sympy.Integer(expr.value)
    if isinstance(expr, IndexValue):
        return sympy.sympify(expr.index)
    if isinstance(expr, Op) and expr.name in ("add", "sub", "to") and not expr.dtype.is_floating_point \
            and expr.dtype != torch.bool:
        parts = [affine_index(a) for a in expr.args]
        if any(p is None for p in parts):
            return None
        return parts[0] if expr.name == "to" else parts[0] + parts[1] if expr.name == "add" else parts[0] - parts[1]
    return None


def walk(expr: Expr) -> Iterator[Expr]:
    """Every expression of the tree, parents before their arguments, arguments left to right.

    With a stack rather than nested generators: the scheduler walks bodies often, and a deep
    fused body would otherwise pass each value up through one generator per level."""
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        if isinstance(e, Op):
            stack.extend(reversed(e.args))
        elif isinstance(e, IndirectLoad):
            if e.valid is not None:
                stack.append(e.valid)
            stack.extend(reversed([position for _, position in e.positions]))


def loads(expr: Expr) -> list[Load | IndirectLoad]:
    """The loads of ``expr``, in ``walk``'s order."""
    out: list[Load | IndirectLoad] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Op):
            stack.extend(reversed(e.args))
        elif isinstance(e, Load):
            out.append(e)
        elif isinstance(e, IndirectLoad):
            out.append(e)
            if e.valid is not None:
                stack.append(e.valid)
            stack.extend(reversed([position for _, position in e.positions]))
    return out


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
