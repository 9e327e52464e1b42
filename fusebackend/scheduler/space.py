"""Iteration spaces: how the nodes of one kernel map onto its loop indices.

A kernel iterates over ``xindex`` (rows; every element for a pointwise kernel) and, when it
holds a reduction, ``rindex`` (positions along the reduced dims). The first reduction of the
group, the anchor, defines both: rows are its output elements in its buffer's memory order and
``rindex`` runs row-major over its reduction ranges. Every other node maps onto that space:

- a reduction with as many rows and the same reduction ranges, the same way;
- a *row* node (a pointwise node with one element per row) by unravelling ``xindex`` over its
  buffer;
- a *full* node (one element per (row, position)) through a reduction of the group whose source
  has the node's shape, or its element count in another shape (matched in row-major order):
  element ``source_index`` of that reduction is the node's element. Where
  that reduction is a split whose chunks overrun the rows, it has more (row, position) pairs
  than the node has elements; the node is stored only where the reduction's ``source_valid``
  holds (``KernelSpace.guards``).

Only stored nodes need a mapping: the others are evaluated wherever they are loaded (inlined),
a node with fewer elements than (row, position) pairs and more than rows (a group norm's scale
per sample and channel) too.
A row value (a reduction or row node) exists only for the current row, so every load of one
inside the kernel must address exactly the current row; ``plan_space`` walks the loads to prove
it, and returns the reason when it cannot.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import sympy

from fusebackend import indexing, ir, sizevars
from fusebackend.inlining import loop_ranges, producer_index
from fusebackend.scheduler.scan_scatter_space import plan_scan_space, plan_scatter_space
from fusebackend.scheduler.space_types import R, X, KernelSpace, SpaceError  # also imported as space.X and so on
from fusebackend.sizevars import size_hint


def _row_mapping(buffer: ir.Buffer, ranges: dict[sympy.Symbol, int]) -> dict[sympy.Symbol, sympy.Expr]:
    return dict(_layout_mapping(buffer.sizes, buffer.strides, (), tuple(ranges.items())))


def _reduction_mapping(node: ir.Reduction, ranges: dict[sympy.Symbol, int]) -> dict[sympy.Symbol, sympy.Expr]:
    buffer = node.buffer
    return dict(_layout_mapping(buffer.sizes, buffer.strides, node.reduction_ranges, tuple(ranges.items())))


# ``plan_space`` runs for every candidate fusion, and maps each node of the candidate again; the
# mapping depends on the layout and the kernel's ranges only. Kept as tuples (immutable): the
# callers get a dict of their own.
@functools.lru_cache(maxsize=1 << 14)
def _layout_mapping(sizes: tuple[int, ...], strides: tuple[int, ...], reduction_ranges: tuple[int, ...],
                    range_items: tuple[tuple[sympy.Symbol, int], ...]) -> tuple[tuple[sympy.Symbol, sympy.Expr], ...]:
    """A buffer's loop variables in terms of xindex (its elements in memory order) and, for a
    reduction over ``reduction_ranges``, its reduction variables in terms of rindex (row-major)."""
    ranges = dict(range_items)
    ivars = indexing.loop_vars("i", len(sizes))
    idx = indexing.unravel(X, sizes, strides)
    out = [(v, indexing.simplify(e, ranges)) for v, e in zip(ivars, idx)]
    if reduction_ranges:
        rvars = indexing.loop_vars("r", len(reduction_ranges))
        ridx = indexing.unravel(R, reduction_ranges, indexing.contiguous_strides(reduction_ranges))
        out += [(v, indexing.simplify(e, ranges)) for v, e in zip(rvars, ridx)]
    return tuple(out)


def plan_space(nodes: Sequence[ir.Node], stored: set[str]) -> KernelSpace:
    """The space these nodes share as one kernel; raises SpaceError with the reason if none."""
    if any(isinstance(n, (ir.Scan, ir.Scatter)) for n in nodes):
        scatter = any(isinstance(n, ir.Scatter) for n in nodes)
        return plan_scatter_space(nodes, stored) if scatter else plan_scan_space(nodes, stored)
    reductions = [n for n in nodes if isinstance(n, ir.Reduction)]
    if not reductions:
        # Only stored nodes iterate; the others are inlined wherever they are loaded, so a
        # broadcast producer (a per-channel scale, a scalar) is recomputed per element instead
        # of being a kernel of its own.
        numels = {n.buffer.numel for n in nodes if n.name in stored}
        if len(numels) > 1:
            raise SpaceError(f"iteration spaces differ ({' vs '.join(map(str, sorted(numels, key=size_hint)))} elements)")
        numel = numels.pop() if numels else max((n.buffer.numel for n in nodes), key=size_hint)
        ranges = {X: max(numel, 1)}
        mapping = {n.name: _row_mapping(n.buffer, ranges) for n in nodes if n.name in stored}
        space = KernelSpace(numel, 1, None, mapping)
        _check_gathers(nodes)  # no row values here, but gathers must read from memory
        return space

    anchor = reductions[0]
    xnumel, rnumel = anchor.buffer.numel, anchor.reduction_numel
    ranges = {X: max(xnumel, 1), R: max(rnumel, 1)}
    mapping: dict[str, dict[sympy.Symbol, sympy.Expr]] = {}
    guards: dict[str, ir.Expr] = {}
    for node in nodes:
        if isinstance(node, ir.Reduction):
            if node.buffer.numel != xnumel or node.reduction_ranges != anchor.reduction_ranges:
                raise SpaceError(
                    f"reductions differ: {node.name} has {node.buffer.numel} rows of "
                    f"{list(node.reduction_ranges)}, {anchor.name} {xnumel} rows of {list(anchor.reduction_ranges)}"
                )
            mapping[node.name] = _reduction_mapping(node, ranges)
        elif node.buffer.numel == xnumel and (node.name in stored or _reads_group(node, nodes)):
            mapping[node.name] = _row_mapping(node.buffer, ranges)
        elif node.name not in stored and not _reads_group(node, nodes):
            continue  # inlined where loaded, like any pointwise producer
        elif node.buffer.numel == xnumel * rnumel or _overrun_source(node, reductions) is not None:
            if node.name in stored:
                read = _read_by(node, reductions, nodes)
                source = read[0] if read is not None else _source_of(node, reductions)
                if source is None:
                    raise SpaceError(
                        f"{node.name} {list(node.buffer.sizes)} must be stored but matches no reduction's input shape"
                    )
                rmap = _reduction_mapping(source, ranges)
                ivars = indexing.loop_vars("i", len(node.buffer.sizes))
                index = source.source_index
                if read is not None:
                    index = read[1]
                elif source.source_sizes != node.buffer.sizes:  # the same elements in another shape
                    flat = indexing.ravel(index, indexing.contiguous_strides(source.source_sizes))
                    index = tuple(indexing.unravel(flat, node.buffer.sizes, indexing.contiguous_strides(node.buffer.sizes)))
                mapping[node.name] = {
                    v: indexing.simplify(sympy.sympify(e).xreplace(rmap), ranges)
                    for v, e in zip(ivars, index)
                }
                if source.source_valid is not None:
                    guards[node.name] = ir.substitute_index(source.source_valid, rmap)
        elif node.name not in stored:
            # between a row and a position: a group norm's scale per (sample, channel), from its
            # (sample, group) statistics and the channel's weight. Inlined where loaded, like a
            # full node, and as a pointwise kernel evaluates a per-channel producer at each
            # element; ``_check_rows`` proves that each of its reads of a row value, at the index
            # its readers read it at, is of the current row.
            continue
        else:
            raise SpaceError(
                f"{node.name} has {node.buffer.numel} elements: neither one per row ({xnumel}) "
                f"nor one per row and position ({xnumel * rnumel})"
            )
    space = KernelSpace(xnumel, rnumel, anchor, mapping, guards)
    _check_rows(nodes, space)
    return space


def _read_by(node: ir.Node, reductions: Sequence[ir.Reduction],
             nodes: Sequence[ir.Node]) -> tuple[ir.Reduction, tuple[sympy.Expr, ...]] | None:
    """A reduction of the group that reads each of ``node``'s elements once, at one (row,
    position) pair each, and ``node``'s index there (in the reduction's variables); None where
    none is found.

    The reduction loads its source at ``source_index``, through a view of the whole source,
    directly from ``node`` or through pointwise nodes of the group that load their producers at
    their own index, each through a dense view of a whole dense buffer: every step is one to
    one, so the pairs map one to one onto ``node``'s elements. Storing ``node`` where it is
    read shares the loads and keeps the store in the read's order. A layer norm over the
    channels of a channels-last activation reads the activation as [N*H*W, C], which is its
    memory order; matched by logical row-major order instead (``_source_of``), the stored
    activation, logically [N, C, H, W], would be reloaded and stored at scrambled addresses
    (ConvNeXt V2's training step, b64, bf16, H100, 2026-11-27: such kernels at 4-10% of their
    floor, 8 ms of a 29 ms step)."""
    group = {n.name: n for n in nodes}

    def one_to_one(view: ir.View, sizes: tuple, producer: ir.Node) -> bool:
        # the view spans ``sizes`` (the index space read one to one) and every element of a dense buffer once
        buf = producer.buffer
        return (tuple(view.sizes) == tuple(sizes) and view.offset == 0 and view.numel == buf.numel
                and indexing.is_dense(view.sizes, view.strides) and indexing.is_dense(buf.sizes, buf.strides))

    def walk(consumer: ir.Node, own: tuple[sympy.Expr, ...], sizes: tuple, at: tuple[sympy.Expr, ...],
             red_ranges: dict[sympy.Symbol, int], depth: int) -> tuple[sympy.Expr, ...] | None:
        # ``own``: the index (over ``sizes``, in ``consumer``'s variables) at which its body reads
        # its elements one to one; ``at``: that index in the reduction's variables
        ones = {v: 0 for v, size in loop_ranges(consumer).items() if size == 1}  # a size-1 dim's index reads as 0
        own = tuple(sympy.sympify(e).xreplace(ones) for e in own)
        for load in ir.loads(consumer.body):
            if not isinstance(load, ir.Load) or tuple(sympy.sympify(e).xreplace(ones) for e in load.index) != own:
                continue
            producer = group.get(load.view.buffer.name)
            if producer is None or isinstance(producer, ir.Reduction) or not one_to_one(load.view, sizes, producer):
                continue
            pidx = tuple(producer_index(producer, load.view, at, red_ranges))
            if producer is node:
                return pidx
            if depth and isinstance(producer, ir.Pointwise):
                own_vars = tuple(indexing.loop_vars("i", len(producer.buffer.sizes)))
                found = walk(producer, own_vars, tuple(producer.buffer.sizes), pidx, red_ranges, depth - 1)
                if found is not None:
                    return found
        return None

    for red in reductions:
        if not red.source_index or sizevars.symbolic(tuple(red.source_sizes) + tuple(node.buffer.sizes)):
            continue
        index = tuple(sympy.sympify(e) for e in red.source_index)
        found = walk(red, index, tuple(red.source_sizes), index, loop_ranges(red), 4)
        if found is not None:
            return red, found
    return None


def _source_of(node: ir.Node, reductions: Sequence[ir.Reduction]) -> ir.Reduction | None:
    """The reduction of the group whose (row, position) pairs give ``node``'s elements: one over
    a tensor of ``node``'s shape, else one over as many elements in another shape (a reshape of
    it, such as [8192, 1024] for [8, 1024, 1024]), matched in row-major order. Any one-to-one
    match is correct, since the node computes each element from its own body; row-major order
    keeps the loads the two share at the same addresses."""
    same = next((r for r in reductions if r.source_index and r.source_sizes == node.buffer.sizes), None)
    if same is not None:
        return same
    return next((r for r in reductions if r.source_index and math.prod(r.source_sizes) == node.buffer.numel), None)


def _overrun_source(node: ir.Node, reductions: Sequence[ir.Reduction]) -> ir.Reduction | None:
    """A reduction of the group over ``node``'s elements whose (row, position) pairs overrun them
    (a split in unequal chunks): ``node`` then maps onto its pairs where they are valid."""
    source = _source_of(node, reductions)
    return source if source is not None and source.source_valid is not None else None


def _reads_group(node: ir.Node, nodes: Sequence[ir.Node]) -> bool:
    """Whether ``node`` reads a buffer written in this kernel (so it depends on the rows)."""
    names = {n.name for n in nodes}
    return any(v.buffer.name in names for v in node.reads())


def is_row_value(node: ir.Node, space: KernelSpace) -> bool:
    """A value that exists once per row of a reduction kernel (reductions and what follows them)."""
    return isinstance(node, ir.Reduction) or (
        space.anchor is not None and node.buffer.numel == space.xnumel and node.name in space.mapping
    )


def _check_gathers(nodes: Sequence[ir.Node]) -> None:
    """No gather reads the kernel: ``_check_rows`` for a kernel without row values, where what
    it finds does not depend on the indices. Every node of a group that is not stored is read by
    another of the group, so looking at each node's loads once finds what walking the loads from
    the stored nodes would, without walking a producer again for each index it is read at."""
    names = {n.name for n in nodes}
    for node in nodes:
        for load in node.body_loads:
            if load.view.buffer.name in names and not isinstance(load, ir.Load) and load.computed_index() is None:
                raise SpaceError(f"{node.name} gathers from {load.view.buffer.name}, which must be in memory")


def _check_rows(nodes: Sequence[ir.Node], space: KernelSpace) -> None:
    """Every in-kernel load of a row value addresses the current row; no gather reads the kernel
    (a concatenation's parts, at positions computed from the index, may)."""
    producers = {n.name: n for n in nodes}
    ranges = space.ranges
    seen: set[tuple[str, tuple[sympy.Expr, ...]]] = set()

    def walk(node: ir.Node, subst: dict[sympy.Symbol, sympy.Expr]) -> None:
        for load in node.body_loads:
            producer = producers.get(load.view.buffer.name)
            if producer is None:
                continue
            index = load.index if isinstance(load, ir.Load) else load.computed_index()
            if index is None:
                raise SpaceError(f"{node.name} gathers from {producer.name}, which must be in memory")
            # a concatenation's part reads at computed positions: inlined like a load
            idx = tuple(indexing.simplify_at(i, subst, ranges) for i in index)
            pidx = producer_index(producer, load.view, idx, ranges)
            if is_row_value(producer, space):
                want = space.mapping[producer.name]
                ivars = indexing.loop_vars("i", len(producer.buffer.sizes))
                for v, e, size in zip(ivars, pidx, producer.buffer.sizes):
                    if size != 1 and e != want[v] and sympy.expand(e - want[v]) != 0:
                        raise SpaceError(
                            f"{node.name} reads {producer.name} at another row than the current one"
                        )
                continue
            key = (producer.name, tuple(pidx))
            if key not in seen:
                seen.add(key)
                ivars = indexing.loop_vars("i", len(producer.buffer.sizes))
                walk(producer, dict(zip(ivars, pidx)))

    for node in nodes:
        if node.name in space.mapping:
            walk(node, space.mapping[node.name])


def step_along(offset: sympy.Expr, var: sympy.Symbol) -> int:
    """How far ``offset`` (in a kernel's ``xindex`` and ``rindex``) moves as ``var`` goes from 0 to
    1, the other index at 0 (over symbolic sizes, at the sizes being compiled)."""
    others = {v: sympy.Integer(0) for v in offset.free_symbols if v in (X, R) and v != var}
    at = offset.xreplace(others)
    return size_hint(at.xreplace({var: sympy.Integer(1)}) - at.xreplace({var: sympy.Integer(0)}))


def row_contiguous_reduction(red: ir.Reduction, body: ir.Expr | None = None) -> bool:
    """Whether the reduction's largest input is contiguous along the reduced positions; with
    ``body``, its largest input in that body (``red``'s with producers inlined) instead."""
    rvars = indexing.loop_vars("r", len(red.reduction_ranges))
    if not rvars:
        return True
    best = None
    for load in ir.loads(red.body if body is None else body):
        offset = sympy.sympify(indexing.ravel(load.index, load.view.strides, load.view.offset))
        # the step in memory between positions 0 and 1 of the innermost reduced dim, the other
        # loop variables at 0 (size symbols stay: a step of s77 is a column's)
        zero = {v: 0 for v in offset.free_symbols if v.is_positive is not True}
        step = sympy.expand(offset.xreplace({**zero, rvars[-1]: 1}) - offset.xreplace(zero))
        size = size_hint(load.view.buffer.numel)
        if best is None or size > best[0]:
            best = (size, step)
    return best is None or best[1] in (0, 1)


def numel(node: ir.Node) -> int:
    if isinstance(node, ir.Reduction):
        return node.buffer.numel * math.prod(node.reduction_ranges)
    return node.buffer.numel
