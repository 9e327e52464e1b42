"""``IRBuilder``: how lowerings add IR nodes to a graph: buffers, pointwise nodes, reductions
(split into two phases where there are too few rows to fill a GPU), and nodes a composite
lowering builds itself. ``GraphLowering`` (``graph.py``) is an IRBuilder that also walks the FX
graph; composite lowerings receive it and build through these methods."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple, Sequence

import sympy
import torch

from fusebackend import indexing, ir, sizevars
from fusebackend.inlining import producer_index
from fusebackend.lowering.registry import Unsupported
from fusebackend.lowering.values import LoweringContext, TensorArg


def _accumulator_dtype(reduction_type: str, dtype: torch.dtype) -> torch.dtype:
    if reduction_type == "any":
        return torch.bool
    return ir.compute_dtype(dtype)


def _neutral(reduction_type: str, dtype: torch.dtype) -> bool | int | float:
    if reduction_type in ("sum", "m2"):
        return 0
    if reduction_type == "prod":
        return 1
    if reduction_type == "any":
        return False
    big = math.inf if dtype.is_floating_point else torch.iinfo(dtype).max
    return -big if reduction_type == "max" else big


def memory_order(dims: Sequence[int], sizes: Sequence[int], strides: dict[int, int]) -> list[int]:
    """``dims`` ordered as a walk through memory would meet them, given each one's stride in
    the memory read: larger strides first, the dim of the smallest stride last (dims of one
    element and dims the read does not move along, first; ties keep their order). A reduction
    over a channels-last tensor's channels, height and width then runs along height, width and
    channels, reading each row as one contiguous stretch rather than with a stride of the
    channel count between neighbouring positions: a one-group GroupNorm over channels-last
    activations."""
    moving = [d for d in dims if sizes[d] != 1 and strides[d] != 0]
    ordered = sorted(moving, key=lambda d: -abs(strides[d]))  # stable: equal strides keep their order
    return [d for d in dims if d not in moving] + ordered


# How far ``_read_strides`` looks: pointwise nodes through, loads of a body
_READ_DEPTH = 8
_READ_LOADS = 16


# A column sum's chunks are at least this many positions long (``split_count``)
COLUMN_CHUNK = 256


def split_count(xnumel: int, rnumel: int, column: bool) -> int:
    """How many chunks to split each row into: enough programs to fill a GPU when rows are few.

    A row reduction runs a program per row or so: it splits when there are under 256 rows (about
    two a streaming multiprocessor on an H100) of at least 64K elements. Unsplit, 64 rows of 1M
    elements (a GroupNorm of 32 groups over 2x128x512x512) ran 64 programs on 132 SMs, each
    looping over its row for the mean, the variance and the normalized output: 0.35 ms, 25% of
    its floor, against Inductor's 0.22 (H100, bf16, 2026-11-26). A column reduction runs a
    program per 64 columns: it splits when that gives under 1024 programs and the columns are at least 2048 long. Chunks are a power of two
    where one divides the length. Depends only on shapes, so CPU tests run the kernels a GPU runs.
    """
    if column:
        programs = -(-xnumel // 64)
        if rnumel < 8 * COLUMN_CHUNK or programs >= 1024:
            return 1
        want = min(1024 // programs, rnumel // COLUMN_CHUNK)
    else:
        if rnumel < 65536 or xnumel >= 256:
            return 1
        want = min(-(-rnumel // 8192), 512 // max(xnumel, 1))
    if want < 2:
        return 1
    split = 1 << (want.bit_length() - 1)  # a power of two: divides power-of-two lengths
    return split if rnumel % split == 0 else want


# A split over interleaved rows (``_interleave``): where a row's runs in memory are shorter
# than a cache line, and only when there is enough to read for a second kernel to pay
_RUN_BYTES = 128
_INTERLEAVE_MIN_ELEMENTS = 1 << 20
_INTERLEAVE_MIN_RUNS = 16


@dataclasses.dataclass(frozen=True)
class Interleave:
    """How the rows of a reduction lie in memory when their runs interleave: each row is runs
    of ``run`` neighbouring elements (its last ``inner`` reduced dims, in memory order), and
    the runs of the rows along the output dims ``mid`` sit side by side between them, a dense
    block of ``block`` elements. The rows along ``outer`` (the other output dims) are apart.

    A GroupNorm of 32 groups over channels-last activations [N, C, H, W]: the rows are (n, g),
    reduced over (h, w, the group's channels); a run is a group's C/32 channels at one
    position and the block is all C channels there. A program a row reads a run, skips the
    other groups' and reads the next: with 8 channels of bf16, 16 bytes in every 512.
    """

    inner: int
    run: int
    outer: tuple[int, ...]
    mid: tuple[int, ...]
    block: int


def _interleave(reduced: Sequence[tuple[int, int]], kept: Sequence[tuple[int, int]], itemsize: int) -> Interleave | None:
    """The ``Interleave`` of a reduction whose reduced dims, in memory order, have these
    (size, stride) pairs, and whose output dims have these (size, stride) pairs in the
    tensor it reads (elements of ``itemsize`` bytes); None where the rows' runs are a cache
    line or longer, or no other row's runs lie between them."""
    moving = [(size, abs(stride)) for size, stride in reduced if size != 1 and stride != 0]
    run, k = 1, len(moving)
    while k > 0 and moving[k - 1][1] == run:  # the dense suffix that starts at stride 1
        run *= moving[k - 1][0]
        k -= 1
    if run == 1 or k == 0 or run * itemsize >= _RUN_BYTES:
        return None
    nearest = min(stride for _, stride in moving[:k])
    mid = sorted((d for d, (size, stride) in enumerate(kept) if size != 1 and 0 < abs(stride) < nearest),
                 key=lambda d: -abs(kept[d][1]))
    block = run
    for d in reversed(mid):  # innermost first: each output dim's runs dense beside the last
        if abs(kept[d][1]) != block:
            return None
        block *= kept[d][0]
    if not mid:
        return None
    outer = sorted((d for d in range(len(kept)) if d not in mid), key=lambda d: -abs(kept[d][1]))
    return Interleave(len(moving) - k, run, tuple(outer), tuple(mid), block)


class ReductionParts(NamedTuple):
    """A reduction of a tensor as ``IRBuilder._reduction_parts`` lays it out."""

    sizes: tuple[int, ...]  # the reduced tensor's sizes
    out_sizes: tuple[int, ...]
    rranges: tuple[int, ...]  # the reduced dims' sizes, in the order the reduction runs them
    source_index: tuple[sympy.Expr, ...]  # the reduced tensor's index in i/r variables
    value: ir.Expr  # the value reduced, in i/r variables
    column: bool  # the last reduced dim is not the one of stride 1 in memory
    interleave: Interleave | None


class IRBuilder:
    """The nodes built so far, in order, and the primitives that add them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.nodes: list[ir.Node] = []
        self.base_offset: dict[str, int] = {}  # buffer -> storage offset of its whole view's meta
        self.origin = ""  # what the nodes being built come from (the ATen op), for the dumps
        self._count = 0
        # symbolic sizes: each symbol's value at the call being compiled, which meta tensors
        # (ATen's shape functions, layout heuristics) are made at (``sizevars.hint``)
        self.hints: dict[sympy.Symbol, int] = {}
        self._producers: dict[str, ir.Pointwise] = {}  # _pointwise_producers, up to node _producers_seen
        self._producers_seen = 0

    def meta(self, buf: ir.Buffer) -> torch.Tensor:
        """A meta tensor in ``buf``'s layout, at the hints where its sizes are symbolic."""
        return torch.empty_strided(sizevars.hints(buf.sizes, self.hints), sizevars.hints(buf.strides, self.hints),
                                   dtype=buf.dtype, device="meta")

    def _contiguous_meta(self, sizes: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(sizevars.hints(sizes, self.hints), dtype=dtype, device="meta")

    def _new_name(self) -> str:
        name = f"buf{self._count}"
        self._count += 1
        return name

    def _tensor_arg(self, buffer: ir.Buffer, meta: torch.Tensor) -> TensorArg:
        self.base_offset[buffer.name] = meta.storage_offset()
        return TensorArg(buffer.whole(), meta)

    def _new_buffer(self, sizes: tuple[int, ...], dtype: torch.dtype, strides: tuple[int, ...] | None) -> ir.Buffer:
        if strides is not None and sizevars.symbolic(sizes) and not sizevars.symbolic(strides):
            # strides a meta function gave at the hints: the same order of dims, symbolic
            try:
                strides = sizevars.dense_strides(sizes, strides, self.hints)
            except sizevars.NotSymbolic:
                strides = None
        if strides is None or not indexing.is_dense(sizes, strides):
            strides = indexing.contiguous_strides(sizes)
        return ir.Buffer(self._new_name(), dtype, sizes, strides)

    def _add_pointwise(
        self, sizes: tuple[int, ...], dtype: torch.dtype, body: ir.Expr, strides: tuple[int, ...] | None, origin: str
    ) -> TensorArg:
        buf = self._new_buffer(sizes, dtype, strides)
        self.nodes.append(ir.Pointwise(buf, ir.cast(body, dtype), origin))
        return self._tensor_arg(buf, self.meta(buf))

    def pointwise(
        self,
        sizes: Sequence[int],
        dtype: torch.dtype,
        body: Callable[[LoweringContext], ir.Expr],
        strides: Sequence[int] | None = None,
    ) -> TensorArg:
        """Add a pointwise node of ``sizes``; ``body(ctx)`` builds it with ``ctx.load``/``ctx.value``."""
        expr = body(LoweringContext(self._contiguous_meta(sizes, dtype), self.device, sizes=sizes))
        return self._add_pointwise(tuple(sizes), dtype, expr, None if strides is None else tuple(strides), self.origin)

    def new_buffer(self, sizes: Sequence[int], dtype: torch.dtype, strides: Sequence[int] | None = None) -> ir.Buffer:
        """A fresh buffer for a node a composite lowering builds itself (contiguous unless
        ``strides`` are given and dense)."""
        return self._new_buffer(tuple(sizes), dtype, None if strides is None else tuple(strides))

    def add_node(self, node: ir.Scan | ir.Scatter) -> TensorArg:
        """Append a node a composite lowering built (a scan, a scatter); its buffer as a tensor."""
        self.nodes.append(node)
        buf = node.buffer
        return self._tensor_arg(buf, self.meta(buf))

    def reduce(
        self,
        src: TensorArg,
        dims: Sequence[int],
        keepdim: bool,
        reduction_type: str,
        out_dtype: torch.dtype,
        body: Callable[[LoweringContext], ir.Expr],
        strides: Sequence[int] | None = None,
    ) -> TensorArg:
        """Add a reduction of ``src`` over ``dims``.

        ``body(ctx)`` gives the value to reduce at one element of ``src``'s shape: ``ctx.load``
        reads any tensor broadcast to that shape. With too few output rows to fill a GPU and long
        rows, the reduction is split in two phases (partial results, then their reduction).
        """
        parts = self._reduction_parts(src, dims, keepdim, body, in_memory_order=reduction_type not in ("argmax", "argmin"))
        sizes, out_sizes, rranges, source_index, value, column, _ = parts
        xnumel, rnumel = math.prod(out_sizes), math.prod(rranges)
        if rnumel == 0:  # reducing nothing: every output is the neutral element (eager's answer)
            if reduction_type in ("max", "min", "argmax", "argmin"):
                raise Unsupported(f"{reduction_type} over an empty dim")
            acc = _accumulator_dtype(reduction_type, value.dtype)
            neutral = ir.Constant(ir._convert_scalar(_neutral(reduction_type, acc), acc), acc)
            return self._add_pointwise(out_sizes, out_dtype, neutral, None if strides is None else tuple(strides), self.origin)
        partials = self._interleaved_partials(parts, reduction_type)
        if partials is not None:  # phase 2: the partials of each row, [chunks, run]
            buf = self._new_buffer(out_sizes, out_dtype, None if strides is None else tuple(strides))
            index = indexing.loop_vars("i", len(out_sizes)) + indexing.loop_vars("r", 2)
            phase2 = ir.Reduction(buf, ir.Load(partials[0].view, index), partials[0].sizes[-2:], reduction_type, (), (),
                                  self.origin + " (split, phase 2)")
            self.nodes.append(phase2)
            return self._tensor_arg(buf, self.meta(buf))
        nsplit = self._split_count(xnumel, rnumel, column) if reduction_type not in ("argmax", "argmin") else 1
        if nsplit > 1:
            return self._split_reduce(value, out_sizes, rranges, reduction_type, out_dtype, nsplit, strides, column,
                                      (sizes, source_index))
        buf = self._new_buffer(out_sizes, out_dtype, None if strides is None else tuple(strides))
        if reduction_type not in ("argmax", "argmin"):
            value = ir.cast(value, _accumulator_dtype(reduction_type, value.dtype))
        node = ir.Reduction(buf, value, rranges, reduction_type, sizes, source_index, self.origin)
        self.nodes.append(node)
        return self._tensor_arg(buf, self.meta(buf))

    def _split_count(self, xnumel: int, rnumel: int, column: bool) -> int:
        """``split_count``; no split over symbolic sizes (a chunk's length would be
        symbolic), and a note where the sizes being compiled would split (``sizevars.decline``)."""
        if not sizevars.symbolic((xnumel, rnumel)):
            return split_count(xnumel, rnumel, column)
        hints = sizevars.size_hint(xnumel), sizevars.size_hint(rnumel)
        if split_count(*hints, column) > 1:
            sizevars.decline(f"a split {'column' if column else 'row'} reduction ({hints[0]} outputs of {hints[1]} "
                             "elements each)")
        return 1

    def _reduction_parts(
        self, src: TensorArg, dims: Sequence[int], keepdim: bool, body: Callable[[LoweringContext], ir.Expr],
        in_memory_order: bool = True,
    ) -> ReductionParts:
        """The parts of a reduction of ``src`` over ``dims`` (``ReductionParts``).

        With ``in_memory_order`` (a reduction whose result does not depend on the order it
        visits its elements: not argmax and argmin, which return a position), the reduced dims
        run in the order of the memory the reduction reads (``_read_strides``, else ``src``'s
        layout; ``memory_order``), so that consecutive positions of a row are neighbours in
        memory wherever the reduced dims are dense together."""
        sizes = tuple(src.sizes)
        dims = sorted({d % len(sizes) for d in dims}) if sizes else []
        kept = [d for d in range(len(sizes)) if d not in dims]
        out_sizes = tuple(1 if d in dims else sizes[d] for d in range(len(sizes))) if keepdim else tuple(sizes[d] for d in kept)
        ivars = indexing.loop_vars("i", len(out_sizes))
        rvars = indexing.loop_vars("r", len(dims))

        def index_of(order: Sequence[int]) -> tuple[sympy.Expr, ...]:
            return tuple(rvars[order.index(d)] if d in dims else (ivars[d] if keepdim else ivars[kept.index(d)])
                         for d in range(len(sizes)))

        source_index = index_of(dims)
        interleave = None
        value = body(LoweringContext(self._contiguous_meta(sizes, src.dtype), self.device, index=source_index,
                                     sizes=sizes))
        strides = dict(zip(dims, (src.view.strides[d] for d in dims)))
        if in_memory_order and len(dims) > 1 and not sizevars.symbolic(sizes) and not sizevars.symbolic(tuple(strides.values())):
            ranges = dict(zip(ivars, out_sizes)) | dict(zip(rvars, (sizes[d] for d in dims)))
            read = self._read_strides(value, rvars, ranges, ivars)
            if read is not None:
                strides = dict(zip(dims, read[0]))
            order = memory_order(dims, sizes, strides)
            if order != dims:  # rename the reduction variables: position k runs along dim order[k]
                value = ir.substitute_index(value, {rvars[dims.index(d)]: rvars[k] for k, d in enumerate(order)})
                dims, source_index = order, index_of(order)
            if read is not None:
                interleave = _interleave([(sizes[d], strides[d]) for d in dims], list(zip(out_sizes, read[1])),
                                         read[2])
        rranges = tuple(sizes[d] for d in dims)
        column = bool(dims) and strides[dims[-1]] != 1 and sizes[dims[-1]] not in (0, 1)
        return ReductionParts(sizes, out_sizes, rranges, source_index, value, column, interleave)

    def _read_strides(self, value: ir.Expr, rvars: Sequence[sympy.Symbol], ranges: dict[sympy.Symbol, int],
                      ivars: Sequence[sympy.Symbol] = ()) -> tuple[list[int], list[int], int] | None:
        """The stride, in elements of memory, of each of ``rvars`` (and of ``ivars``) in the
        largest tensor that ``value`` reads from memory, and that tensor's element size, looking
        through the pointwise nodes it loads (a copy, a cast: the scheduler fuses them into the
        reduction, which then reads what they read). A reduction over a contiguous copy of
        channels-last activations (the GroupNorm of torch 2.11's decomposition) reads the
        activations, so it takes their memory order. The stride is the step of the address from
        position 0 to position 1 along each variable, the other indices 0; None where nothing
        read moves with ``rvars``."""
        best: tuple[int, list[int], list[int], int] | None = None
        zero = {v: 0 for v in ranges}
        for view, index in self._memory_reads(value, ranges, depth=_READ_DEPTH):
            address = indexing.ravel(index, view.strides, view.offset)
            try:
                origin = int(address.xreplace(zero))
                steps = [int(address.xreplace(zero | {v: 1})) - origin for v in (*rvars, *ivars)]
            except (TypeError, ValueError):  # a symbol left (a size): no stride to compare
                continue
            size = view.buffer.numel * view.buffer.dtype.itemsize
            if any(steps[:len(rvars)]) and (best is None or size > best[0]):
                best = (size, steps[:len(rvars)], steps[len(rvars):], view.buffer.dtype.itemsize)
        return None if best is None else best[1:]

    def _memory_reads(self, value: ir.Expr, ranges: dict[sympy.Symbol, int],
                      depth: int) -> list[tuple[ir.View, list[sympy.Expr]]]:
        """The (view, index) of each load in ``value`` from memory, a pointwise node's loads in
        place of a load of its buffer, ``depth`` levels down. Past that depth a pointwise node
        stands for itself, in the layout it was given: the sum of a long chain of full-size
        nodes (the gradient of a layer norm's input, added to the residual's) must not be
        judged by the per-row statistics alone that the chain reaches within ``depth`` (Swin's
        patch-norm bias gradient, split in 4 chunks of 50176 rows as if its rows ran along
        memory, ran 6 programs: 2.1 ms, 0% of its floor on an H200)."""
        producers = self._pointwise_producers()
        out = []
        for load in ir.loads(value)[:_READ_LOADS]:
            if not isinstance(load, ir.Load):
                continue
            index = [sympy.sympify(i) for i in load.index]
            producer = producers.get(load.view.buffer.name)
            if producer is None:  # in memory: an input, a constant, an ATen result, a reduction's
                out.append((load.view, index))
                continue
            if depth == 0:
                out.append((load.view, index))
                continue
            pindex = producer_index(producer, load.view, index, ranges)
            pvars = indexing.loop_vars("i", len(producer.buffer.sizes))
            body = ir.substitute_index(producer.body, dict(zip(pvars, pindex)))
            out += self._memory_reads(body, ranges, depth - 1)
        return out

    def _pointwise_producers(self) -> dict[str, ir.Pointwise]:
        """Buffer name -> the pointwise node that writes it, among the nodes built so far."""
        known = self._producers
        for node in self.nodes[self._producers_seen:]:
            if isinstance(node, ir.Pointwise):
                known[node.buffer.name] = node
        self._producers_seen = len(self.nodes)
        return known

    def split_partials(
        self, src: TensorArg, dims: Sequence[int], reduction_type: str, body: Callable[[LoweringContext], ir.Expr],
    ) -> tuple[TensorArg, int, list[int]] | None:
        """Phase 1 alone of the split ``reduce`` would make (keepdim off), where it would split
        the rows into parts of equal length: (the partial results, the length of a part, the
        partials' dims that phase 2 reduces). None where ``reduce`` would not split. For
        reductions whose phase 2 is not the same reduction of the partials (the variance's,
        which combines sums and m2s)."""
        parts = self._reduction_parts(src, dims, False, body, in_memory_order=reduction_type not in ("argmax", "argmin"))
        n_out = len(parts.out_sizes)
        interleaved = self._interleaved_partials(parts, reduction_type)
        if interleaved is not None:
            return interleaved[0], interleaved[1], [n_out, n_out + 1]
        rnumel = math.prod(parts.rranges)
        nsplit = self._split_count(math.prod(parts.out_sizes), rnumel, parts.column) if rnumel else 1
        if nsplit <= 1 or rnumel % nsplit:
            return None
        part, chunk = self._split_phase1(parts.value, parts.out_sizes, parts.rranges, reduction_type, nsplit,
                                         parts.column, (parts.sizes, parts.source_index))
        return part, chunk, [0] if parts.column else [n_out]

    def _interleaved_partials(self, parts: ReductionParts, reduction_type: str) -> tuple[TensorArg, int] | None:
        """Phase 1 of a reduction split over interleaved rows (``Interleave``), where it has one:
        (the partial results viewed as [*out_sizes, chunks, run], the positions each reduces).

        Each partial reduces one element of a run over a chunk of the positions along the
        other reduced dims. Phase 1 is then a column reduction whose neighbouring columns are
        neighbours in memory (a block of runs read whole, the partials stored as [outer,
        chunk, block]), and phase 2 reduces each row's chunks x run partials. The chunks split
        the positions where the columns alone are too few to fill a GPU (``split_count``); they
        divide the positions exactly (an m2 has no neutral value to pad with)."""
        il = parts.interleave
        sizes, out_sizes, rranges = parts.sizes, parts.out_sizes, parts.rranges
        if il is None or math.prod(out_sizes) * math.prod(rranges) < _INTERLEAVE_MIN_ELEMENTS:
            return None
        n_out, n_r = len(out_sizes), len(rranges)
        outer_r, inner_r = rranges[:n_r - il.inner], rranges[n_r - il.inner:]
        positions = math.prod(outer_r)
        if positions < _INTERLEAVE_MIN_RUNS:
            return None
        chunks = split_count(math.prod(out_sizes) * il.run, positions, column=True)
        while chunks > 1 and positions % chunks:
            chunks -= 1
        chunk = positions // chunks
        outer_sizes = [out_sizes[d] for d in il.outer]
        mid_sizes = [out_sizes[d] for d in il.mid]
        contiguous = indexing.contiguous_strides
        j0, j1, j2 = indexing.loop_vars("i", 3)
        pos = indexing.loop_vars("r", 1)[0]
        old_i, old_r = indexing.loop_vars("i", n_out), indexing.loop_vars("r", n_r)
        renamed = dict(zip([old_i[d] for d in il.outer], indexing.unravel(j0, outer_sizes, contiguous(outer_sizes))))
        renamed |= dict(zip([old_i[d] for d in il.mid],
                            indexing.unravel(j2, mid_sizes, [il.run * s for s in contiguous(mid_sizes)])))
        renamed |= dict(zip(old_r, indexing.unravel(j1 * chunk + pos, outer_r, contiguous(outer_r))
                            + indexing.unravel(j2, inner_r, contiguous(inner_r))))
        acc = _accumulator_dtype(reduction_type, parts.value.dtype)
        part = self._new_buffer((math.prod(outer_sizes), chunks, il.block), acc, None)
        source_index = tuple(sympy.sympify(e).xreplace(renamed) for e in parts.source_index)
        self.nodes.append(ir.Reduction(part, ir.substitute_index(ir.cast(parts.value, acc), renamed), (chunk,),
                                       reduction_type, sizes, source_index,
                                       self.origin + " (split over interleaved rows, phase 1)"))
        self._tensor_arg(part, self.meta(part))
        strides = [0] * n_out
        for d, stride in zip(il.outer, contiguous(outer_sizes)):
            strides[d] = stride * chunks * il.block
        for d, stride in zip(il.mid, contiguous(mid_sizes)):
            strides[d] = stride * il.run
        view_sizes, view_strides = tuple(out_sizes) + (chunks, il.run), tuple(strides) + (il.block, 1)
        view = ir.View(part, view_sizes, view_strides, 0)
        return TensorArg(view, torch.empty_strided(view_sizes, view_strides, dtype=acc, device="meta")), chunk

    def _split_reduce(
        self, value: ir.Expr, out_sizes: tuple[int, ...], rranges: tuple[int, ...], reduction_type: str,
        out_dtype: torch.dtype, nsplit: int, strides: Sequence[int] | None, column: bool,
        source: tuple[tuple[int, ...], tuple[sympy.Expr, ...]],
    ) -> TensorArg:
        """Phase 1 reduces ``nsplit`` chunks of every row; phase 2 reduces the partial results.

        For a column reduction the split index is the partial buffer's outer dim, so that the
        rows of one phase-1 block are neighbouring columns (coalesced loads); otherwise it is the
        inner dim, so that each row's partials are contiguous for phase 2. ``source``: the
        reduced tensor's sizes and index; phase 1 keeps them (in its own variables), so that a
        producer of that tensor fuses into it as its prologue even when it must be stored too
        (where the chunks overrun the rows, the positions past the end store nothing).
        """
        part_arg, _ = self._split_phase1(value, out_sizes, rranges, reduction_type, nsplit, column, source)
        n_out = len(out_sizes)
        pos = indexing.loop_vars("r", 1)[0]
        old_i = indexing.loop_vars("i", n_out)
        buf = self._new_buffer(out_sizes, out_dtype, None if strides is None else tuple(strides))
        if column:
            body = ir.Load(part_arg.view, (pos,) + tuple(old_i))
        else:
            body = ir.Load(part_arg.view, tuple(old_i) + (pos,))
        self.nodes.append(ir.Reduction(buf, body, (nsplit,), reduction_type, (), (), self.origin + " (split, phase 2)"))
        return self._tensor_arg(buf, self.meta(buf))

    def _split_phase1(
        self, value: ir.Expr, out_sizes: tuple[int, ...], rranges: tuple[int, ...], reduction_type: str,
        nsplit: int, column: bool, source: tuple[tuple[int, ...], tuple[sympy.Expr, ...]],
    ) -> tuple[TensorArg, int]:
        """The partial results of ``nsplit`` chunks of every row (see ``_split_reduce``), and the
        chunk length."""
        acc = _accumulator_dtype(reduction_type, value.dtype)
        rnumel = math.prod(rranges)
        chunk = -(-rnumel // nsplit)
        n_out = len(out_sizes)
        ivars = indexing.loop_vars("i", n_out + 1)
        pos = indexing.loop_vars("r", 1)[0]
        if column:
            split, out_vars = ivars[0], ivars[1:]
            part_sizes = (nsplit,) + out_sizes
        else:
            split, out_vars = ivars[-1], ivars[:-1]
            part_sizes = out_sizes + (nsplit,)
        flat = split * chunk + pos
        old_r = indexing.loop_vars("r", len(rranges))
        unravelled = indexing.unravel(flat, rranges, indexing.contiguous_strides(rranges))
        old_i = indexing.loop_vars("i", n_out)
        renamed = {
            **{r: e for r, e in zip(old_r, unravelled)},
            **({i: v for i, v in zip(old_i, out_vars)} if column else {}),
        }
        moved = ir.substitute_index(ir.cast(value, acc), renamed)
        source_sizes, source_index = source[0], tuple(sympy.sympify(e).xreplace(renamed) for e in source[1])
        inside = None
        if nsplit * chunk != rnumel:  # padded: the neutral element stands in past the end
            assert reduction_type != "m2", "an m2 has no neutral value: only exact chunks"
            inside = ir.op("lt", ir.IndexValue(flat, torch.int64), ir.Constant(rnumel, torch.int64), dtype=torch.bool)
            moved = ir.op("where", inside, moved, ir.Constant(_neutral(reduction_type, acc), acc), dtype=acc)
        part = self._new_buffer(part_sizes, acc, None)
        self.nodes.append(ir.Reduction(part, moved, (chunk,), reduction_type, source_sizes, source_index,
                                       self.origin + " (split, phase 1)", source_valid=inside))
        part_arg = self._tensor_arg(part, self.meta(part))
        return part_arg, chunk
