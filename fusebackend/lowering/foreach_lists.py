"""Runs of ``_foreach_*`` calls over long lists as one generated kernel over every tensor.

An optimizer's step over N parameters is a run of ``_foreach_*`` calls, one per step of its
formula; AOTAutograd's graph keeps them whole where their lists are longer than
``foreach.MAX_TENSORS`` (``fusebackend/foreach.py``; decomposed, each parameter's update would
be nodes of its own, and the compile time would grow with N), and ``foreach.in_place_chains``
makes the updates in place.
Each call is then a pass over every tensor: an AdamW step over GPT-2's 148 tensors was 20 such
calls, 7.5 ms on an H100 where eager's ``fused=True`` takes 1.34 and Inductor's compiled step
1.26 (2026-11-28, torch 2.11).

``fuse_runs`` replaces each run of such calls (consecutive in the graph but for the
``getitem`` of their results and ``full_like`` constants), or each longest part of it that it
can generate, by one call of
``torch.ops.fusebackend.foreach_lists``: a kernel generated here whose programs each take one
block of one tensor of the lists, found in a table (tensor, first element) made once for the
lists' sizes. Each list is a row of a table made at the call, of each tensor's address as its
distance from the table's own (Triton knows the alignment of a pointer argument, not of a
pointer loaded from memory: where every tensor lies at a multiple of 16 bytes, the kernel is told
so, and a whole block then loads and stores 16 bytes at a time; a tensor's last block is
masked). A program loads its tensor's elements of every list it reads once, computes the whole
run in registers, and stores each list the run updates in place, once. The step reads and
writes each tensor once, in one launch, and compiles the same for 20 tensors or 2000. AdamW
over Llama's bf16 parameters (1.1G elements, H200, 2026-11-28): 5.72 ms (71% of the copy
bandwidth) from a table of pointers, loading 2 bytes at a time, and 101-118 registers a thread
for sm_90; 5.05-5.06 ms (81%) so, in three processes, and 63-64 registers; Inductor's 4.46-4.49
ms (91%). A row of every address a block (one load before the data, not two) made 4.96 ms in
one process, with a table three times the size, which a captured CUDA graph copies from the
host at each replay: not taken. The kernel was then bound by its instructions (103 an element
for sm_90, two thirds of them the correctly rounded root and divisions): with a quotient or root
rounded to bf16 at once computed approximate (``_Source.rounded``), 67 an element and 4.34-4.38
ms (94%) in three processes, Inductor's 4.48 ms in the same process (H200, 2026-12-01).

A run is taken where, for every position of the lists, each tensor is a contiguous tensor of
that position's size or a scalar (a 0-dim tensor: an optimizer's step count, or a value computed
from it, the same for every element of the position), every list of one dtype (float32, bfloat16
or float16: computed in fp32, and each result of a half-precision list rounded to its dtype as
eager's op stores it), on one device, every result of a
call is read by later calls of the run only, scalars are numbers, and every call is one of
``_OPS`` (the optimizers' arithmetic). An update in place of a list of scalars (the step counts'
``+= 1``) ends a run: each of a position's programs would read the count another had written.
Anything else is left as the ATen calls it was. The call at run time (its tables and its
launch) is ``foreach_call.py``. The generated source is the call's first
argument: a dump shows it, and a graph loaded from the cache needs nothing else.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
import torch.fx

from fusebackend.codegen import fast_math
from fusebackend.codegen.kernel_header import HEADER
from fusebackend.codegen.triton_ops import TRITON_DTYPE, render_op, takes_tensors
from fusebackend.lowering.registry import bind_arguments

aten = torch.ops.aten

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # computed in fp32, half types rounded
MIN_TENSORS = 2  # a run over fewer tensors is left as it is

_LIBRARY = torch.library.Library("fusebackend", "DEF")
_LIBRARY.define("foreach_lists(str source, int n, Tensor(a!)[] written, Tensor[] read) -> ()")
CALL = torch.ops.fusebackend.foreach_lists.default


KERNEL_NAME = "foreach_lists"  # the generated function's name; the dumps' (one for each call of a graph)


def list_kernels(schedule: Any) -> dict[str, str]:
    """The kernels of a schedule's ``foreach_lists`` calls, by name for the dumps
    (``foreach_lists0``...)."""
    calls = [step.node for step in schedule.steps if getattr(getattr(step, "node", None), "op", None) is CALL]
    return {f"{KERNEL_NAME}{k}": call.args[0] for k, call in enumerate(calls)}


class _Refused(Exception):
    """A run this module does not generate: left as ATen calls."""


# --------------------------------------------------------------------------- the kernel's ops
# Each entry: the per-element value of one ``_foreach_*`` overload (functional or in place) from
# its bound arguments, each list argument already an element's value (a Triton expression).

def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Refused(f"a scalar argument {value!r} that is not a number")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        return f'float("{value}")'
    return repr(value)


class _Source(str):
    """An op's Triton source that keeps the op and its operands' sources, so that a quotient or
    a root a half-precision result rounds at once can be rendered approximate instead
    (``_Source.rounded``)."""

    op: str
    operands: tuple[str, ...]

    def rounded(self, dtype: torch.dtype) -> str:
        """This value rounded to ``dtype`` as eager's op stores it. A correctly rounded fp32
        quotient or root is a long instruction sequence, and rounded to bf16 or fp16 at once its
        last two bits rarely count (``codegen/fast_math.rounded_to_half``): AdamW's list kernel
        over Llama's bf16 parameters took 103 instructions an element compiled for sm_90 with
        its two divisions and its root correctly rounded, 67 with them approximate (its
        ``addcdiv``'s quotient, added to the parameter before it is rounded, stays correctly
        rounded)."""
        text = str(self)
        if dtype in (torch.float16, torch.bfloat16) and self.op in ("truediv", "sqrt"):
            text = "(" + fast_math.approximate(self.op, list(self.operands)) + ")"
        return render_op("round_to", [text], dtype, [torch.float32])


def _op(name: str, *args: Any) -> _Source:
    """``name`` of fp32 ``args`` (expressions, or numbers) as Triton source; a helper (``th.``)
    gets numbers as tensors."""
    wrap = takes_tensors(name)
    texts = [a if isinstance(a, str) else f"tl.full([], {_number(a)}, tl.float32)" if wrap else _number(a)
             for a in args]
    source = _Source("(" + render_op(name, texts, torch.float32, [torch.float32] * len(texts)) + ")")
    source.op = name
    source.operands = tuple(a if isinstance(a, str) else _number(a) for a in args)
    return source


def _other(a: dict[str, Any]) -> Any:
    """A binary op's second operand: a list (``other``), a scalar (``scalar``), or scalars."""
    for name in ("other", "scalar", "scalars"):
        if name in a:
            return a[name]
    raise _Refused("a binary op without its second operand")


def _arith(name: str) -> Callable[..., str]:
    def rule(a: dict[str, Any]) -> str:
        other = _other(a)
        if name in ("add", "sub") and a.get("alpha", 1) != 1:
            other = _op("mul", other, a["alpha"])
        return _op("truediv" if name == "div" else name, a["self"], other)
    return rule


def _addc(name: str) -> Callable[..., str]:
    def rule(a: dict[str, Any]) -> str:
        value = a.get("value", a.get("scalars", 1))
        inner = _op("mul" if name == "addcmul" else "truediv", a["tensor1"], a["tensor2"])
        return _op("add", a["self"], inner if value == 1 else _op("mul", inner, value))
    return rule


def _lerp(a: dict[str, Any]) -> str:
    # ATen's lerp: the form that is exact at the end the weight is nearer to
    start, end, weight = a["self"], a["tensors1"], a.get("weight", a.get("weights"))
    weight = weight if isinstance(weight, str) else _number(weight)
    return (f"tl.where(tl.abs({weight}) < 0.5, {start} + {weight} * ({end} - {start}), "
            f"{end} - ({end} - {start}) * (1.0 - {weight}))")


def _unary(name: str) -> Callable[..., str]:
    def rule(a: dict[str, Any]) -> str:
        if name == "reciprocal":
            return _op("truediv", 1.0, a["self"])
        return _op(name, a["self"])
    return rule


def _pow(a: dict[str, Any]) -> str:
    base, exponent = a["self"], a["exponent"]
    if _is_number(base):  # ScalarAndTensor: base ** t, as exp2(t * log2(base))
        if not base > 0:
            raise _Refused("a power of a scalar base that is not positive")
        return f"tl.exp2({exponent} * {_number(math.log2(base))})"
    if _is_number(exponent):
        special = {1: base, 2: _op("mul", base, base), 0.5: _op("sqrt", base)}
        if exponent in special:
            return special[exponent]
    raise _Refused("a power other than a positive scalar's, a square or a square root")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_OPS: dict[str, Callable[[dict[str, Any]], str]] = {
    **{name: _arith(name) for name in ("add", "sub", "mul", "div")},
    "maximum": lambda a: _op("maximum", a["self"], _other(a)),
    "minimum": lambda a: _op("minimum", a["self"], _other(a)),
    "addcmul": _addc("addcmul"),
    "addcdiv": _addc("addcdiv"),
    "lerp": _lerp,
    **{name: _unary(name) for name in ("sqrt", "neg", "reciprocal", "exp", "abs", "rsqrt")},
    "pow": _pow,
}


def _call_name(node: torch.fx.Node) -> tuple[str, bool] | None:
    """(the op's name without ``_foreach_`` and a trailing ``_``, whether in place) of a foreach
    call, or None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    packet = target.overloadpacket.__name__
    if not packet.startswith("_foreach_"):
        return None
    in_place = packet.endswith("_")
    return packet[len("_foreach_"): -1 if in_place else None], in_place


# --------------------------------------------------------------------------- runs in the graph

def fuse_runs(gm: torch.fx.GraphModule) -> int:
    """Replace each run of foreach calls this module generates by one ``foreach_lists`` call
    (module docstring); returns how many calls were replaced."""
    replaced = 0
    for run in _runs(gm.graph):
        sizes = _sizes(run)  # (a part's tensors are the run's: the same sizes)
        start, end = 0, len(run)
        while start < end:  # the longest part from ``start`` that is generated, then the rest
            plan, at = _plan(run[start:end], sizes)
            if plan is None:
                # cut before the call that refused it (or, refused as a whole, one call shorter);
                # a part that cannot start at ``start`` leaves that call ATen's
                end = start + at if at is not None else end - 1
                if end == start:
                    start, end = start + 1, len(run)
                continue
            plan.rewrite(gm.graph)
            replaced += len(plan.run)
            start, end = end, len(run)
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced


def _plan(run: list[torch.fx.Node], sizes: list[int]) -> tuple[_Plan | None, int | None]:
    """The plan of ``run``, or None and the position of the call that refused it (None where
    the run was refused as a whole)."""
    at: list[int] = []
    try:
        return _Plan(run, sizes, at), None
    except Exception:  # refused, or a call this module reads wrong: left as it was, still right
        return None, at[0] if at else None


def _sizes(run: list[torch.fx.Node]) -> list[int]:
    """Each position's tensor size: the largest element count there (the others are scalars)."""
    n = len(_lists_of(run[0])[0])
    sizes = [1] * n
    for node in run:
        for arg in _lists_of(node):
            if len(arg) != n:
                continue
            for k, item in enumerate(arg):
                val = item.meta.get("val") if isinstance(item, torch.fx.Node) else None
                if isinstance(val, torch.Tensor) and isinstance(val.numel(), int):
                    sizes[k] = max(sizes[k], val.numel())
    return sizes


def _lists_of(node: torch.fx.Node) -> list[Any]:
    """The list arguments of a call (``self`` is a scalar in ``_foreach_pow.ScalarAndTensor``)."""
    return [a for a in node.args if isinstance(a, (list, tuple))]


def _member(node: torch.fx.Node) -> bool:
    """A foreach call a run may hold: one of ``_OPS``, not an update in place of scalars."""
    named = _call_name(node)
    if named is None or named[0] not in _OPS or not _lists_of(node) or not _lists_of(node)[0]:
        return False
    first = _lists_of(node)[0][0]
    val = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
    return not (named[1] and isinstance(val, torch.Tensor) and val.dim() == 0)


def _runs(graph: torch.fx.Graph) -> list[list[torch.fx.Node]]:
    """Runs of foreach calls: consecutive calls with lists of one length, but for the ``getitem``
    of their results and ``full_like`` nodes between them."""
    runs: list[list[torch.fx.Node]] = []
    current: list[torch.fx.Node] = []
    for node in graph.nodes:
        if _member(node):
            if current and len(_lists_of(node)[0]) != len(_lists_of(current[0])[0]):
                runs.append(current)
                current = []
            current.append(node)
        elif node.op == "call_function" and node.target in (operator.getitem, aten.full_like.default):
            continue
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [run for run in runs if len(_lists_of(run[0])[0]) >= MIN_TENSORS]


class _Plan:
    """One run's kernel: its lists in memory (pointer table rows), the per-element value of
    every call, and the lists it writes."""

    def __init__(self, run: list[torch.fx.Node], sizes: list[int] | None = None, at: list[int] | None = None) -> None:
        self.run = run
        self.n = len(_lists_of(run[0])[0])
        members = set(run)
        self.rows: dict[tuple[torch.fx.Node, ...], int] = {}  # a list in memory -> its row
        self.scalar_rows: set[int] = set()  # rows whose tensors are 0-dim
        self.row_dtype: dict[int, torch.dtype] = {}
        self.current: dict[int, str] = {}  # row -> the variable holding its value now
        self.written: list[int] = []  # rows updated in place, in order of first update
        self.lines: list[str] = []
        self.values: dict[torch.fx.Node, str] = {}  # functional call -> its result's variable
        self.sizes = sizes if sizes is not None else _sizes(run)
        if at is not None:
            at[:] = [0]  # no list of tensors from the first call on: nor in any part from it
        self.device = self._device()
        for position, node in enumerate(run):
            if at is not None:
                at[:] = [position]  # (the call being planned, for a caller that cuts the run)
            name, in_place = _call_name(node)
            rule = _OPS.get(name)
            if rule is None:
                raise _Refused(f"_foreach_{name} is not generated")
            bound = bind_arguments(node.target, node.args, node.kwargs)
            values = {key: self._value(arg, members) for key, arg in bound.items()}
            expr = rule(values)
            var = f"v{len(self.lines)}"
            row = self._row(bound.get("self")) if in_place else None
            dtype = self.row_dtype[row] if in_place else self._result_dtype(node)
            if dtype != torch.float32:  # as eager's op stores it: computed in fp32, rounded once
                expr = expr.rounded(dtype) if isinstance(expr, _Source) else render_op(
                    "round_to", [expr], dtype, [torch.float32])
            if in_place:
                if row in self.scalar_rows:
                    raise _Refused("a list of scalars updated in place")
                self.lines.append(f"{var} = {expr}")
                self.current[row] = var
                if row not in self.written:
                    self.written.append(row)
            else:
                for user in node.users:
                    readers = list(user.users) if user.target is operator.getitem else [user]
                    readers += [r for u in readers if u.target is aten.full_like.default for r in u.users]
                    if user.target is not operator.getitem or any(
                            r not in members and r.target is not aten.full_like.default for r in readers):
                        raise _Refused(f"{node.name}'s results are read outside the run")
                self.lines.append(f"{var} = {expr}")
                self.values[node] = var
        if at is not None:
            at.clear()  # refused as a whole from here on
        if not self.written:
            raise _Refused("a run that updates nothing in place")
        seen: dict[torch.fx.Node, int] = {}
        for key, row in self.rows.items():
            for t in key:
                if seen.setdefault(t, row) != row and (row in self.written or seen[t] in self.written):
                    raise _Refused("a tensor in two lists, one of them updated")

    @staticmethod
    def _result_dtype(node: torch.fx.Node) -> torch.dtype:
        """The dtype of a functional call's results (one for the whole list)."""
        vals = node.meta.get("val")
        dtypes = {v.dtype for v in vals if isinstance(v, torch.Tensor)} if isinstance(vals, (list, tuple)) else set()
        if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
            raise _Refused(f"{node.name}'s results are not all of one float dtype")
        return next(iter(dtypes))

    def _device(self) -> torch.device:
        """The device of the run's tensors (its first list's that is not of scalars)."""
        for node in self.run:
            for arg in _lists_of(node):
                val = arg[0].meta.get("val") if isinstance(arg[0], torch.fx.Node) else None
                if isinstance(val, torch.Tensor) and val.dim() > 0:
                    return val.device
        raise _Refused("a run over scalars only")

    def _value(self, arg: Any, members: set[torch.fx.Node]) -> Any:
        """An argument as the kernel sees it: a list as a Triton expression (one element of one
        position), a number as itself."""
        if isinstance(arg, torch.fx.Node):  # one scalar tensor for every position (a tensor learning rate)
            val = arg.meta.get("val")
            if not (isinstance(val, torch.Tensor) and val.dim() == 0):
                raise _Refused("a tensor argument shared by every position that is not a scalar")
            return self.current[self._row((arg,) * self.n)]
        if not isinstance(arg, (list, tuple)):
            return arg
        if all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in arg):
            raise _Refused("a list of scalars, one per position")
        if not all(isinstance(a, torch.fx.Node) for a in arg) or len(arg) != self.n:
            raise _Refused("a list that is not of the run's tensors")
        producers = {a.args[0] if a.target is operator.getitem else None for a in arg}
        if len(producers) == 1 and next(iter(producers)) in members:
            producer = next(iter(producers))
            if [a.args[1] for a in arg] != list(range(self.n)) or producer not in self.values:
                raise _Refused("a list of a call's results out of order")
            return self.values[producer]
        if all(a.target is aten.full_like.default for a in arg):
            fills = {a.args[1] for a in arg}
            dtypes = {a.meta["val"].dtype for a in arg if isinstance(a.meta.get("val"), torch.Tensor)}
            if len(fills) != 1 or len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
                raise _Refused("fills of different values or dtypes")
            fill = next(iter(fills))
            if not _is_number(fill):
                raise _Refused("a fill that is not a number")
            return float(torch.tensor(fill, dtype=next(iter(dtypes))))  # the value as stored
        if any(a in members or (a.target is operator.getitem and a.args[0] in members) for a in arg):
            raise _Refused("a list mixing a call's results with other tensors")
        row = self._row(arg)
        return self.current[row]

    def _row(self, arg: Any) -> int:
        key = tuple(arg)
        row = self.rows.get(key)
        if row is not None:
            return row
        scalars = []
        dtypes = set()
        for k, node in enumerate(key):
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or val.dtype not in _DTYPES:
                raise _Refused("a list of tensors that are not float32, bfloat16 or float16")
            dtypes.add(val.dtype)
            if val.device != self.device:  # (under compile an optimizer keeps its step counts there)
                raise _Refused("a tensor on another device than the lists'")
            if val.dim() == 0:
                scalars.append(True)
            elif val.numel() == self.sizes[k] and val.is_contiguous() and isinstance(val.numel(), int):
                scalars.append(False)
            else:
                raise _Refused("a tensor neither of its position's size and contiguous nor a scalar")
        if any(scalars) and not all(scalars):
            raise _Refused("a list mixing scalars and tensors")
        if len(dtypes) != 1:
            raise _Refused("a list of tensors of different dtypes")
        row = self.rows[key] = len(self.rows)
        self.row_dtype[row] = dtypes.pop()
        if all(scalars):
            self.scalar_rows.add(row)
        self.current[row] = f"r{row}"
        return row

    def slots(self) -> list[int]:
        """The rows in the order the call passes them: those written, then those only read."""
        return self.written + [row for row in range(len(self.rows)) if row not in self.written]

    def source(self) -> str:
        """The kernel's Triton source."""
        names = ", ".join(f"{_call_name(n)[0]}{'_' if _call_name(n)[1] else ''}" for n in self.run)
        lines = [
            *HEADER,
            "def foreach_lists(table_ptr, blocks_ptr, numels_ptr, N, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):",
            f"    # {len(self.run)} foreach calls over lists of N tensors: {names}",
            "    # a program: one block of one tensor of the lists (blocks_ptr: tensor, first element);",
            "    # table_ptr: a row of N a list, the lists written first, each tensor's address as its",
            "    # distance from table_ptr's in elements of its dtype; ALIGNED: every tensor's address a",
            "    # multiple of 16 bytes, so a whole block loads and stores 16 bytes at a time",
            "    pid = tl.program_id(0)",
            "    t = tl.load(blocks_ptr + 2 * pid)",
            "    first = tl.load(blocks_ptr + 2 * pid + 1)",
            "    numel = tl.load(numels_ptr + t)",
        ]
        slots = self.slots()
        lines += [f"    d{row} = tl.load(table_ptr + {slot} * N + t)" for slot, row in enumerate(slots)]
        lines += ["    if ALIGNED:", "        first = tl.multiple_of(first, BLOCK)"]
        lines += [f"        d{row} = tl.multiple_of(d{row}, {16 // self.row_dtype[row].itemsize})"
                  for row in slots if row not in self.scalar_rows]
        lines += [f"    p{row} = table_ptr.to(tl.pointer_type({TRITON_DTYPE[self.row_dtype[row]]})) + d{row}" for row in slots]
        lines += ["    offs = first + tl.arange(0, BLOCK)",
                  "    if first + BLOCK <= numel:  # a whole block",
                  *self._body(""),
                  "    else:  # the tensor's last block",
                  "        mask = offs < numel",
                  *self._body(", mask=mask")]
        return "\n".join(lines) + "\n"

    def _body(self, mask: str) -> list[str]:
        """Loads, the run's arithmetic and stores for one block (``mask``: the loads' and stores'
        mask argument, or none)."""
        lines = []
        for row in self.slots():
            dtype = self.row_dtype[row]
            load = f"tl.load(p{row})" if row in self.scalar_rows else f"tl.load(p{row} + offs{mask})"
            lines.append(f"r{row} = {load}" + ("" if dtype == torch.float32 else ".to(tl.float32)"))
        lines += self.lines
        for row in self.written:
            value = self.current[row]
            if self.row_dtype[row] != torch.float32:
                value = render_op("to", [value], self.row_dtype[row], [torch.float32])
            lines.append(f"tl.store(p{row} + offs, {value}{mask})")
        return [f"        {line}" for line in lines]

    def rewrite(self, graph: torch.fx.Graph) -> None:
        """One ``foreach_lists`` call in place of the run, and the run's nodes erased."""
        lists = {row: list(key) for key, row in self.rows.items()}
        written = [t for row in self.written for t in lists[row]]
        read = [t for row in self.slots()[len(self.written):] for t in lists[row]]
        with graph.inserting_after(self.run[-1]):
            call = graph.call_function(CALL,
                                       (self.source(), self.n, written, read))
        call.meta = {"val": None}
        doomed = set(self.run)
        for node in self.run:
            doomed.update(u for u in node.users if u.target is operator.getitem)
        for node in list(graph.nodes):
            if node.target is aten.full_like.default and node.users and set(node.users) <= doomed:
                doomed.add(node)
        for node in reversed(list(graph.nodes)):
            if node in doomed:
                assert set(node.users) <= doomed, node
                graph.erase_node(node)


# the op's implementations (the call at run time), registered once this module's names exist
from fusebackend.lowering import foreach_call  # noqa: E402,F401
