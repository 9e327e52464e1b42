"""Rendering node bodies into Triton statements: shared by pointwise and reduction kernels.

``KernelBody`` turns IR expressions into numbered temporaries with common-subexpression
elimination. A load of a buffer produced inside the same kernel is replaced by the producer's
body evaluated at the loaded index (inlining); a load of a reduction computed in the kernel is
the reduction's value for the current row. Temporaries live in scopes: a looped reduction opens a
scope per loop, so nothing computed inside one loop is reused outside it.

Each temporary records whether it varies along ``xindex`` and/or ``rindex``; that picks each
load's mask and tells where a value must be broadcast before a store or a reduction. A dim whose
block size divides its extent (``exact``) needs no mask: every lane is in range, and the
generated code leaves the mask out, so Triton needs no predicates on those loads and stores.
"""

from __future__ import annotations

import dataclasses
import math

import sympy
import torch

from fusebackend import indexing, indexing_signed, ir
from fusebackend.codegen import branches, fast_math, pairs
from fusebackend.codegen.kernel_header import sizes_in
from fusebackend.codegen.triton_ops import LITERAL_ARGS, TRITON_DTYPE, render_literal, render_op, takes_tensors
from fusebackend.scheduler import KernelPlan
from fusebackend.inlining import producer_index
from fusebackend.scheduler.space import R, X, KernelSpace

INT32_MAX = 2**31 - 1
XOFFSET = indexing.var("xoffset")  # the first xindex of the block (a multiple of XBLOCK)
ROFFSET = indexing.var("roffset")  # the first rindex of a looped kernel's block
_STARTS = frozenset({XOFFSET, ROFFSET})


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A generated kernel: its function name, source, and how the wrapper launches it."""

    name: str
    source: str
    args: tuple[str, ...]  # buffer names, one pointer argument each, in order
    sizes: tuple[int, ...]  # xnumel (and rnumel), passed after the pointers
    grid: int
    launch: dict[str, int]  # constexpr block sizes and num_warps
    plan: KernelPlan
    asserts: bool = False  # it asserts (a checked gather): launched with runtime.ASSERT_OPTIONS
    # mode="max-autotune": the same kernel with other launch configurations (kernels/autotune.py)
    variants: tuple[KernelSource, ...] = ()
    # (output, input) pairs where the kernel reads the input only at the element it then writes
    # of the output, in the same program: the output may be written into the input's memory
    # where the input dies here (codegen/memory.py)
    in_place: tuple[tuple[str, str], ...] = ()
    # a row reduction over a symbolic row length: the RBLOCK of the persistent kernel ``<name>_persistent``
    # (in ``source`` too) that the wrapper launches in this one's place where a call's rows fit
    # one block (codegen/reduction.py); None: this kernel serves every call
    short_rows: int | None = None

    def written(self) -> tuple[int, ...]:
        """The positions in ``args`` of the buffers it stores."""
        stored = {b.name for b in self.plan.stored}
        return tuple(k for k, name in enumerate(self.args) if name in stored)


@dataclasses.dataclass
class _Scope:
    cse: dict[str, str] = dataclasses.field(default_factory=dict)
    lines: list[str] = dataclasses.field(default_factory=list)
    # (id of an IR expression, its substitution, the guard) -> (the expression, its temp or
    # literal): see KernelBody.value
    values: dict[tuple, tuple[ir.Expr, str]] = dataclasses.field(default_factory=dict)


# What a rendered value depends on besides its expression, substitution and guard: setting one
# of these forgets every value rendered (KernelBody.__setattr__).
_RENDER_STATE = frozenset({"ranges", "blocks", "lanes", "eviction", "x_symbols", "x_zero", "rank", "element_loads",
                           "exact", "program_scalars"})


class KernelBody:
    def __init__(self, plan: KernelPlan, space: KernelSpace, exact: frozenset[str] = frozenset()) -> None:
        self.plan = plan
        self.space = space
        self.ranges = space.ranges
        self.scopes: list[_Scope] = [_Scope()]
        self.counter = 0
        self.dims: dict[str, frozenset[str]] = {}
        self.inputs: dict[str, str] = {}  # buffer name -> pointer argument
        self.producers = {n.name: n for n in plan.nodes}
        self.row_values: dict[str, ir.Expr] = {}  # reduction name -> its value (current row)
        self.max_offset = 0
        # symbolic sizes: the size symbols the kernel's indices use (its parameters
        # after the extents), and whether an offset's bound is symbolic (its indices are int64)
        self.size_symbols: set[sympy.Symbol] = set()
        self.symbolic_offsets = False
        self.exact = exact  # dims whose blocks tile the extent exactly: no mask
        self.eviction: str | None = None  # L2 hint for loads that vary along rows and positions
        self.x_symbols = frozenset({X})  # what "varies along x" means: a tiled kernel has three
        # those of x_symbols that are one value a program (a tiled kernel's x_outer), and the
        # temps computed from them alone: their comparisons are made tensors (th.as_bool), which
        # Triton's interpreter can combine with a block into a mask
        self.program_scalars: frozenset[sympy.Symbol] = frozenset()
        self.scalar_temps: set[str] = set()
        self.x_zero = "0 * xindex"  # broadcasts a store offset that does not vary along x
        self.load_offsets: list[tuple[ir.Buffer, sympy.Expr]] = []  # memory loads, for tiling
        # temps that are 0 wherever a branch's condition (the value) is false: its loads, masked
        # by it with other=0, and their casts (branches.where_in_branches drops a where(c, x, 0)
        # over them)
        self.zero_outside: dict[str, str] = {}
        self.gathered: set[str] = set()  # buffers read by a gather (at run-time positions)
        self.asserts = False  # whether the kernel asserts (checked gathers): compiled in debug mode
        # the rank of the kernel's index tensors: a flat kernel's [XBLOCK]; a reduction's, a
        # scan's and a tiled kernel's blocks are 2-d
        self.element_loads = True  # window loads element by element (off in tiled kernels, whose
        # divisions are of the outer tile index; the faults were in flat kernels)
        self.rank = 1 if space.anchor is None and not any(isinstance(n, ir.Scan) for n in plan.nodes) else 2
        # the condition under which the value being rendered is used (a concatenation's part,
        # inlined): every memory load under it is masked by it, and its indices may fall outside
        # the buffer where it is false
        self.guard: str | None = None
        # the condition under which a branch of a ``where`` on the index alone is used (a
        # select_scatter's or a slice_scatter's part): its memory loads are masked by it where
        # they vary along its dims, so that blocks outside the part read nothing; what the
        # condition proves narrows the branch's indices (``branches.branch_facts``), which may then
        # fall outside the buffer where it is false
        self.branch: str | None = None
        # what the guard proves about the index: (an index expression, a stand-in symbol, its
        # least value, its extent) for each concatenation part being rendered (``_narrowing``)
        self.narrowed: tuple[branches.Narrowed, ...] = ()
        self.even: tuple[sympy.Expr, ...] = ()  # indices a branch being rendered is taken only where even
        # index -> (block size, symbol of the block's start): see align_blocks
        self.blocks: dict[sympy.Symbol, tuple[int, sympy.Symbol]] = {}
        self.lanes: tuple[sympy.Symbol, int] | None = None  # see align_blocks
        self._inlined_bodies: dict[tuple, ir.Expr] = {}  # see inlined

    def __setattr__(self, name: str, value: object) -> None:
        if name in _RENDER_STATE and "scopes" in self.__dict__:
            for scope in self.scopes:
                scope.values.clear()
        object.__setattr__(self, name, value)

    # ----------------------------------------------------------------------------- scopes
    def push(self) -> None:
        self.scopes.append(_Scope())

    def pop(self) -> list[str]:
        return self.scopes.pop().lines

    @property
    def lines(self) -> list[str]:
        return self.scopes[-1].lines

    def emit_raw(self, line: str) -> None:
        self.scopes[-1].lines.append(line)

    def _emit(self, text: str, dims: frozenset[str]) -> str:
        for scope in reversed(self.scopes):
            if text in scope.cse:
                return scope.cse[text]
        name = f"tmp{self.counter}"
        self.counter += 1
        self.scopes[-1].cse[text] = name
        self.scopes[-1].lines.append(f"{name} = {text}")
        self.dims[name] = dims
        return name

    def new_temp(self, dims: frozenset[str]) -> str:
        name = f"tmp{self.counter}"
        self.counter += 1
        self.dims[name] = dims
        return name

    def dims_of(self, value: str) -> frozenset[str]:
        return self.dims.get(value, frozenset())

    # ---------------------------------------------------------------------------- indices
    def simplify(self, expr: sympy.Expr) -> sympy.Expr:
        """``expr`` simplified over the kernel's ranges and what the guard proves (``narrowed``).

        Under a concatenation part's guard its position along the concatenated dim lies in the
        part: a rotary embedding's rotate-half part reading ``x[..., d + 32]`` for ``d < 32``
        addresses ``d + 32``, not ``(d + 32) % 64`` with a carry into the dim outside it, which
        the kernel's ranges alone allow. Each narrowed expression stands in as ``start + p``
        with ``p`` in [0, extent) while simplifying, then is put back.
        """
        if not self.narrowed:
            return indexing.simplify(expr, self.ranges)
        forward, back, ranges = self._narrowing()
        narrowed = indexing.simplify(sympy.sympify(expr).xreplace(forward), ranges).xreplace(back)
        return indexing.simplify(narrowed, self.ranges)  # a div/mod pair put back may fold

    def _narrowing(self) -> tuple[dict, dict, dict]:
        forward = {e: start + p for e, p, start, _ in self.narrowed}
        back = {p: e - start for e, p, start, _ in self.narrowed}
        return forward, back, {**self.ranges, **{p: extent for _, p, _, extent in self.narrowed}}

    def index(self, expr: sympy.Expr) -> sympy.Expr:
        expr = self.simplify(expr)
        lo, hi = indexing.bounds(expr, self.ranges)
        if not indexing.known_nonneg(lo) and self.guard is None and self.branch is None:
            raise ValueError(f"negative index {expr}")
        self._reach(hi)
        self.size_symbols |= sizes_in(expr)
        expr = indexing_signed.floored(expr, self.ranges)
        return indexing.block_aligned(expr, self.blocks) if self.blocks else expr

    def _reach(self, hi: int | sympy.Expr) -> None:
        """An offset's largest value: the kernel's offsets are int64 past int32's range, or over
        symbolic sizes (no bound below 2**31 is known)."""
        if isinstance(hi, int) or hi.is_Integer:
            self.max_offset = max(self.max_offset, int(hi))
        else:
            self.symbolic_offsets = True

    def align_blocks(self, blocks: dict[sympy.Symbol, int], lanes: sympy.Symbol | None = None,
                     lane_block: int = 0) -> None:
        """Take divisions of these indices by multiples of their block sizes at the block's
        start (``indexing.block_aligned``): ``xindex`` starts at ``xoffset``, ``rindex`` at
        ``roffset`` (a looped kernel's). ``lanes``: the index along the block's last axis (the
        one Triton vectorizes), whose blocks of ``lane_block`` start at multiples of it."""
        starts = {X: XOFFSET, R: ROFFSET}
        self.blocks = {v: (size, starts[v]) for v, size in blocks.items()}
        self.ranges = {**self.ranges, **{starts[v]: self.ranges[v] for v in blocks}}  # for bounds
        self.lanes = (lanes, lane_block) if lanes is not None else None

    def _lane_hints(self, offset: sympy.Expr) -> tuple[list[int], list[int]] | None:
        """Contiguity and divisibility hints for a window load of a 2-d block whose offset is
        ``lanes`` plus terms the same on every lane of the last axis (a max pool's backward
        in a column reduction: the window's clamped rows times their stride, plus the
        channel): contiguous along that axis over the whole block, and its first element a
        multiple of the largest power of two dividing every term's coefficient and the block
        start. Other axes get 1, as ``window_arithmetic`` asks. None where that shape is not
        the offset's."""
        if self.rank != 2 or self.lanes is None:
            return None
        lane, block = self.lanes
        terms = sympy.Add.make_args(offset)
        if [t for t in terms if lane in t.free_symbols] != [lane]:
            return None
        divisor = block
        for t in terms:
            if t != lane:
                divisor = math.gcd(divisor, abs(int(t.as_coeff_Mul()[0])))
        multiple = divisor & -divisor if divisor else block  # the largest power of two in it
        return [1, block], [1, min(multiple, block)]

    def index_dims(self, expr: sympy.Expr) -> frozenset[str]:
        free = sympy.sympify(expr).free_symbols
        dims = frozenset("x") if free & self.x_symbols else frozenset()
        return (dims | frozenset("r")) if R in free else dims

    def mask(self, dims: frozenset[str]) -> str | None:
        parts = [f"{d}mask" for d in ("x", "r") if d in dims and d not in self.exact]
        return " & ".join(parts) if parts else None

    def guarded(self, mask: str | None, dims: frozenset[str]) -> tuple[str | None, frozenset[str], str]:
        """A memory load's mask and dims with the current guard added, and what its address
        needs added to be a block of the guard's shape (a load's pointers set its shape)."""
        if self.guard is None:
            return mask, dims, ""
        gdims = self.dims_of(self.guard)
        spread = "".join(f" + {self.x_zero}" if d == "x" else " + 0 * rindex" for d in ("x", "r")
                         if d in gdims and d not in dims)
        mask = self.guard if mask is None else f"{self.guard} & {mask}"
        return mask, dims | gdims, spread

    def pointer(self, buffer: ir.Buffer) -> str:
        if buffer.name not in self.inputs:
            self.inputs[buffer.name] = f"in_ptr{len(self.inputs)}"
        return self.inputs[buffer.name]

    # ------------------------------------------------------------------------ expressions
    def value(self, expr: ir.Expr, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
        """Render ``expr`` with loop variables replaced by ``subst``; returns a temp or literal.

        An expression object rendered before with the same substitution and guard, in this scope
        or one around it, gives the same temporary without being walked again. Inlined producers
        make a kernel's expressions a graph that shares subtrees (``inlined`` hands every
        consumer of one element the same body): walked as a tree, a chain of producers each read
        twice is rendered exponentially often, although CSE names it once."""
        if isinstance(expr, ir.Constant):
            return render_literal(expr.value, expr.dtype)
        if isinstance(expr, ir.Rendered):
            return expr.name
        key = (id(expr), tuple(subst.items()), self.guard, self.branch)
        for scope in reversed(self.scopes):
            hit = scope.values.get(key)
            if hit is not None:
                return hit[1]
        rendered = self._render(expr, subst)
        self.scopes[-1].values[key] = (expr, rendered)  # the expression kept: its id stays its own
        return rendered

    def _render(self, expr: ir.Expr, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
        if isinstance(expr, ir.IndexValue):
            idx = self.index(sympy.sympify(expr.index).xreplace(subst))
            dims = self.index_dims(idx)
            if not dims:
                return self._emit(f"tl.full([], {indexing.pexpr(idx)}, {TRITON_DTYPE[expr.dtype]})", dims)
            name = self._emit(f"({indexing.pexpr(idx)}).to({TRITON_DTYPE[expr.dtype]})", dims)
            if sympy.sympify(idx).free_symbols <= self.program_scalars:
                self.scalar_temps.add(name)
            return name
        if isinstance(expr, ir.Load):
            return self.load(expr, subst)
        if isinstance(expr, ir.IndirectLoad):
            return self.indirect_load(expr, subst)
        if expr.name == "where" and branches.on_index_alone(expr.args[0]) and any(ir.loads(a) for a in expr.args[1:]):
            return branches.where_in_branches(self, expr, subst)
        if expr.name == "checked_position":
            return self._checked_position(expr, subst)
        if expr.name == "to" and isinstance(expr.args[0], ir.Load):
            inlined = self.resolve(expr.args[0], subst)
            if inlined is not None:  # fold casts across the fusion boundary (fp32 stays fp32)
                return self.value(ir.cast(inlined, expr.dtype), {})
        root = fast_math.reciprocal_root(self, expr, subst)
        if root is not None:
            return self.value(ir.Op("rsqrt", (root,), torch.float32), {})
        approximate = fast_math.rounded_to_half(self, expr, subst)
        if approximate is not None:
            return self.value(ir.Op(expr.name, (approximate,), expr.dtype), {})
        constants = [self._constant(a, subst) for a in expr.args]
        if all(c is not None for c in constants):  # e.g. an op on an inlined full()
            folded = ir.fold(ir.Op(expr.name, tuple(constants), expr.dtype))
            if isinstance(folded, ir.Constant):
                return render_literal(folded.value, folded.dtype)
        args = [self.value(a, subst) for a in expr.args]
        if expr.name not in LITERAL_ARGS and (
                not any(a in self.dims for a in args) or takes_tensors(expr.name) or expr.dtype == torch.float64):
            # literals get a dtype so that tl functions accept them when all arguments are
            # literals; helpers get tensors always (they may bitcast any argument); and in fp64
            # ops, since Triton makes a float literal fp32 (tl.where(c, pi, 0.0) would round pi).
            # Never the random helpers' literals: compiled, a constexpr given as a tensor becomes
            # a branch taken at run time (fp64 rand came back on a coarser grid).
            args = [a if a in self.dims else f"tl.full([], {a}, {TRITON_DTYPE[x.dtype]})"
                    for a, x in zip(args, expr.args)]
        text = render_op(expr.name, args, expr.dtype, [a.dtype for a in expr.args])
        dims = frozenset().union(*(self.dims_of(a) for a in args))
        scalar = bool(dims) and all(a in self.scalar_temps or not self.dims_of(a) for a in args)
        if (not dims or scalar) and (expr.name in _COMPARISONS or (expr.name == "to" and expr.dtype == torch.bool)):
            text = f"th.as_bool({text})"
        name = self._emit(text, dims)
        if scalar:
            self.scalar_temps.add(name)
        zero = branches.zero_preserved(expr, args, self.zero_outside)
        if zero is not None:
            self.zero_outside[name] = zero
        return name

    def bool_temp(self, text: str, dims: frozenset[str], scalar: bool = False) -> str:
        """A bool temp; a scalar one (no dims, or ``scalar``: computed from ``program_scalars``
        alone) made a tensor that the interpreter can use as a mask."""
        name = self._emit(text if dims and not scalar else f"th.as_bool({text})", dims)
        if scalar and dims:
            self.scalar_temps.add(name)
        return name

    def load(self, expr: ir.Load, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
        view = expr.view
        idx = [sympy.sympify(i).xreplace(subst) for i in expr.index]
        producer = self.producers.get(view.buffer.name)
        if producer is not None:
            return self.value(self.as_stored(producer, self.inlined(producer, view, idx)), {})
        raw = indexing.ravel(idx, view.strides, view.offset)
        offset = self.index(raw)
        self.load_offsets.append((view.buffer, offset))
        ptr = self.pointer(view.buffer)
        dims = self.index_dims(offset)
        pair = pairs.pair_load(self, raw, view.buffer)
        if pair is not None:
            return self._emit_pair_load(ptr, *pair, dims)
        text = indexing.pexpr(offset)
        if dims and self.element_loads and self.guard is None and indexing.window_arithmetic(offset, _STARTS):
            ones = [1] * self.rank  # see window_arithmetic
            contiguous, multiple = self._lane_hints(offset) or (ones, ones)
            text = f"tl.max_constancy(tl.multiple_of(tl.max_contiguous({text}, {contiguous}), {multiple}), {ones})"
        hint = f", eviction_policy='{self.eviction}'" if self.eviction and dims == {"x", "r"} else ""
        mask, dims, spread = self.guarded(self.mask(dims), dims)
        text += spread
        if self.branch is not None and self.dims_of(self.branch) <= dims and branches.masked_by_branch(self, view, idx):
            mask = self.branch if mask is None else f"{self.branch} & {mask}"
        if mask is None:
            return self._emit(f"tl.load({ptr} + ({text}){hint})", dims)
        other = ", other=0" if view.dtype != torch.bool else ""
        name = self._emit(f"tl.load({ptr} + ({text}), {mask}{other}{hint})", dims)
        if other and self.branch is not None and self.branch in mask.split(" & "):
            self.zero_outside[name] = self.branch
        return name

    def _emit_pair_load(self, ptr: str, contiguous: sympy.Expr, taken: int, dims: frozenset[str]) -> str:
        hint = f", eviction_policy='{self.eviction}'" if self.eviction and dims == {"x", "r"} else ""
        mask = self.mask(dims)
        loaded = self._emit(f"tl.load({ptr} + ({indexing.pexpr(contiguous)})"
                            f"{'' if mask is None else f', {mask}, other=0'}{hint})", dims)
        return self._emit(f"th.pair_take{'_2d' if self.rank == 2 else ''}({loaded}, {taken})", dims)

    def _constant(self, expr: ir.Expr, subst: dict[sympy.Symbol, sympy.Expr]) -> ir.Constant | None:
        """``expr`` as a constant, looking through loads of in-kernel producers that are constants."""
        if isinstance(expr, ir.Constant):
            return expr
        if isinstance(expr, ir.Load) and expr.view.buffer.name in self.producers:
            producer = self.producers[expr.view.buffer.name]
            if isinstance(producer, ir.Pointwise) and isinstance(producer.body, ir.Constant):
                return producer.body
        if isinstance(expr, ir.Op) and expr.name == "to":
            inner = self._constant(expr.args[0], subst)
            return None if inner is None else ir.cast(inner, expr.dtype)
        return None

    def indirect_load(self, expr: ir.IndirectLoad, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
        """A gather: the address adds each run-time position times its dim's stride.

        A load with ``valid`` reads nothing where that is false. A ``checked`` load asserts that
        its positions are in range wherever it happens (``tl.device_assert``: Triton keeps it in
        kernels compiled in debug mode, which ``asserts`` asks the launch for) and reads nothing
        where they are not, so that no address outside the tensor is read with asserts off.
        """
        view = expr.view
        if view.buffer.name in self.producers:
            return branches.inlined_part(self, expr, subst)
        gathered = {d for d, _ in expr.positions}
        idx = [sympy.Integer(0) if d in gathered else sympy.sympify(i).xreplace(subst) for d, i in enumerate(expr.index)]
        affine = [ir.affine_index(p) for _, p in expr.positions]
        if not expr.checked and all(a is not None for a in affine):  # a cat's part: its element is known
            at = list(idx)
            for a, (d, _) in zip(affine, expr.positions):
                at[d] = sympy.sympify(a).xreplace(subst)
            raw = indexing.ravel(at, view.strides, view.offset)
            pair = pairs.pair_load(self, raw, view.buffer)
            if pair is not None:  # masked by the lanes alone: the part's where discards the rest
                element = self.index(raw)
                self.load_offsets.append((view.buffer, element))
                return self._emit_pair_load(self.pointer(view.buffer), *pair, self.index_dims(element))
        self.gathered.add(view.buffer.name)
        offset = self.index(indexing.ravel(idx, view.strides, view.offset))
        # every position is at most size-1 along its dim (checked, or proven)
        reach = sympy.sympify(sum((view.sizes[d] - 1) * view.strides[d] for d in gathered))
        self._reach(indexing.bounds(offset, self.ranges)[1] + reach)
        dims = self.index_dims(offset)
        rendered = [(d, self.value(position, subst)) for d, position in expr.positions]
        dims = dims.union(*(self.dims_of(pos) for _, pos in rendered))
        mask = self.mask(dims)
        if expr.valid is not None:  # lanes outside it read nothing (and may point anywhere)
            valid = self.value(expr.valid, subst)
            dims |= self.dims_of(valid)
            mask = valid if mask is None else f"{valid} & {mask}"
        mask, dims, _ = self.guarded(mask, dims)
        if self.branch is not None and self.dims_of(self.branch) <= dims:
            mask = self.branch if mask is None else f"{self.branch} & {mask}"
        checks = [self._in_range(pos, view.sizes[d], dims) for d, pos in rendered if expr.checked]
        checks = [c for c in checks if c is not None]
        if checks:
            ok = checks[0] if len(checks) == 1 else self._emit(" & ".join(f"({c})" for c in checks), dims)
            self._assert(ok, mask, f"index out of bounds: a gather from {view.buffer.name} of sizes {list(view.sizes)}")
            mask = ok if mask is None else f"{ok} & {mask}"
        terms = "".join(f" + {pos}" if view.strides[d] == 1 else f" + {pos} * {self._size_text(view.strides[d])}"
                        for d, pos in rendered)
        if all(a is not None for a in affine):  # a cat's position: the load's address is known, for tiling
            moved = sum((a.xreplace(subst) * view.strides[d] for a, (d, _) in zip(affine, expr.positions)),
                        sympy.Integer(0))
            self.load_offsets.append((view.buffer, offset + moved))
        else:  # a gather: how its address moves with the lanes apart from the positions read
            self.load_offsets.append((view.buffer, offset))  # (a transposed read asks for tiles)
        address = f"{self.pointer(view.buffer)} + ({indexing.pexpr(offset)}){terms}"
        spread = self.index_dims(offset).union(*(self.dims_of(pos) for _, pos in rendered))
        for d in sorted(dims - spread):  # a block mask needs a block of pointers (one address, repeated)
            address += f" + {self.x_zero}" if d == "x" else " + 0 * rindex"
        if mask is None:
            return self._emit(f"tl.load({address})", dims)
        other = ", other=0" if view.dtype != torch.bool else ""
        return self._emit(f"tl.load({address}, {mask}{other})", dims)

    def _checked_position(self, expr: ir.Op, subst: dict[sympy.Symbol, sympy.Expr]) -> str:
        """A position taken from data, asserted in [0, size) wherever the kernel evaluates it,
        as a checked gather's positions are (``indirect_load``)."""
        pos = self.value(expr.args[0], subst)
        size = expr.args[1]
        assert isinstance(size, ir.Constant)
        dims = self.dims_of(pos)
        ok = self._in_range(pos, int(size.value), dims)
        if ok is not None:
            self._assert(ok, self.mask(dims), f"index out of bounds: a scatter position outside [0, {size.value})")
        return pos

    def _assert(self, ok: str, mask: str | None, message: str) -> None:
        """``tl.device_assert`` of ``ok`` on the lanes in ``mask``; the kernel is then compiled
        in debug mode, where Triton keeps asserts (``KernelSource.asserts``)."""
        where = "" if mask is None else f" | ~({mask})"
        self._statement(f'tl.device_assert({ok}{where}, "{message}")')
        self.asserts = True

    def _in_range(self, pos: str, size: int, dims: frozenset[str]) -> str | None:
        """``0 <= pos < size`` as a block varying along ``dims`` (a load's mask must have the
        load's shape, and Triton's interpreter fails to splat a condition on a loaded scalar, so
        the position is broadcast first); None for a literal position, checked now."""
        if pos not in self.dims and not sizes_in(size):
            if not 0 <= int(pos) < size:
                raise ValueError(f"a gather at {pos} along a dim of {size}")
            return None
        spread = [f" + {self.x_zero}" if d == "x" else " + 0 * rindex" for d in ("x", "r")
                  if d in dims and d not in self.dims_of(pos)]
        if spread:
            pos = self._emit(pos + "".join(spread), dims)
        return self._emit(f"(0 <= {pos}) & ({pos} < {self._size_text(size)})", self.dims_of(pos))

    def _size_text(self, size: int | sympy.Expr) -> str:
        """A size or stride in the kernel's text: over symbolic sizes, of the size arguments."""
        self.size_symbols |= sizes_in(size)
        return indexing.pexpr(sympy.sympify(size))

    def _statement(self, text: str) -> None:
        """Emit a statement with no value (an assert) once per scope chain, as ``_emit`` would."""
        for scope in reversed(self.scopes):
            if text in scope.cse:
                return
        self.scopes[-1].cse[text] = ""
        self.scopes[-1].lines.append(text)

    def offset_text(self, offset: sympy.Expr, dims: frozenset[str]) -> str:
        """An offset for a store over ``dims``: broadcast when it is the same for every lane."""
        text = indexing.pexpr(offset)
        missing = [d for d in ("x", "r") if d in dims and d not in self.index_dims(offset)]
        for d in missing:
            text += f" + {self.x_zero}" if d == "x" else " + 0 * rindex"
        return text

    def inlined(self, producer: ir.Node, view: ir.View, idx: list[sympy.Expr]) -> ir.Expr:
        """The IR expression for ``producer``'s value at element ``view[idx]``."""
        if isinstance(producer, ir.Reduction):
            # the scheduler proved every in-kernel load of a reduction addresses the current row
            return self.row_values[producer.name]
        # A producer is loaded at the same element again by each consumer that reads it there
        # (and by each of a window's consumers that overlap): its body is substituted once.
        key = (producer.name, view, tuple(idx), tuple(self.ranges.items()), self.narrowed)
        body = self._inlined_bodies.get(key)
        if body is None:
            if self.narrowed:
                forward, back, ranges = self._narrowing()
                pidx = producer_index(producer, view, [self.simplify(i).xreplace(forward) for i in idx], ranges)
                pidx = [indexing.simplify(i.xreplace(back), self.ranges) for i in pidx]
            else:
                pidx = producer_index(producer, view, [indexing.simplify(i, self.ranges) for i in idx], self.ranges)
            pvars = indexing.loop_vars("i", len(producer.buffer.sizes))
            body = self._inlined_bodies[key] = ir.substitute_index(producer.body, dict(zip(pvars, pidx)))
        return body

    def resolve(self, load: ir.Load, subst: dict[sympy.Symbol, sympy.Expr]) -> ir.Expr | None:
        """The IR expression a load of an in-kernel buffer stands for (indices substituted)."""
        producer = self.producers.get(load.view.buffer.name)
        if producer is None:
            return None
        idx = [sympy.sympify(i).xreplace(subst) for i in load.index]
        return self.as_stored(producer, self.inlined(producer, load.view, idx))

    @staticmethod
    def as_stored(producer: ir.Node, value: ir.Expr) -> ir.Expr:
        """An in-kernel producer's value as its consumers would read it from memory.

        A half-precision value is computed in fp32 registers; eager rounds it to its dtype before
        the next op reads it, and so do we (a bf16 residual sum feeds a layer norm rounded, as in
        eager). Within one ATen op, computed in fp32 as eager computes it, nothing is rounded.
        """
        dtype = producer.buffer.dtype
        if dtype not in (torch.float16, torch.bfloat16) or isinstance(value, ir.Constant):
            return value
        if isinstance(value, ir.Op) and value.name == "to" and value.args[0].dtype.is_floating_point:
            value = value.args[0]  # computed wider, then narrowed: round it once, here
        return ir.Op("round_to", (value,), dtype)

    def broadcast(self, value: str, dtype: torch.dtype, shape: str, dims: frozenset[str]) -> str:
        """``value`` as a block of ``shape`` (for stores and reductions of lower-rank values)."""
        if self.dims_of(value) == dims:
            return value
        if value in self.dims:
            return self._emit(f"tl.broadcast_to({value}, {shape})", dims)
        return self._emit(f"tl.full({shape}, {value}, {TRITON_DTYPE[dtype]})", dims)

    def uses_int64(self, *numels: int | sympy.Expr) -> bool:
        """Whether an offset or an extent may pass int32's range: over symbolic sizes, unless
        proven otherwise, they may."""
        if self.symbolic_offsets or any(not isinstance(n, int) and not n.is_Integer for n in numels):
            return True
        return max(self.max_offset, *map(int, numels)) > INT32_MAX

    def size_params(self) -> list[sympy.Symbol]:
        """The size symbols the kernel's indices use, in name order: its parameters after the
        extents (which it takes whole: ``xnumel``, ``rnumel``)."""
        return sorted(self.size_symbols, key=lambda s: (len(s.name), s.name))


_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf"})
