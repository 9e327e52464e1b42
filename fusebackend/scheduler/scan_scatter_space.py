"""Iteration spaces of scan and scatter kernels, and which nodes may share one.

A scan kernel iterates like a reduction's: ``xindex`` over rows (every index of the other dims,
in the anchor's memory order) and ``rindex`` over positions along the scanned dim; the anchor is
the group's first scan. A scan's value exists for the block being scanned only, so:

- every scan of the group has the anchor's sizes and dim (scans of one tensor, cummax's values
  and indices, a scan of a scan);
- a stored pointwise node has one element per element of the anchor (its shape, or as many
  elements in another shape, matched in row-major order) and is computed in the same
  iteration: a prologue that must be stored too, or an epilogue;
- every in-kernel load of a scan's result addresses the element being computed;
- no reductions or scatters.

A scatter kernel iterates ``xindex`` over the scattered elements. It holds one scatter and the
pointwise producers of its positions and values, inlined; it stores nothing else. The node
that writes the scatter's target is never in it: the target must be complete before the first
value is scattered into it, and the programs of one kernel run in no order. Nothing in it reads
the scatter's result either: the kernels after it do, once every value is in.
"""

from __future__ import annotations

from typing import Sequence

import sympy

from fusebackend import indexing, ir
from fusebackend.inlining import producer_index
from fusebackend.scheduler.space_types import R, X, KernelSpace, SpaceError


def scan_mapping(scan: ir.Scan, ranges: dict[sympy.Symbol, int]) -> dict[sympy.Symbol, sympy.Expr]:
    """The scan's loop variables in terms of xindex (its rows) and rindex (positions)."""
    sizes, strides = scan.buffer.sizes, scan.buffer.strides
    others = sorted((k for k in range(len(sizes)) if k != scan.dim), key=lambda k: (-strides[k], k))
    row_sizes = [sizes[k] for k in others]
    rows = indexing.unravel(X, row_sizes, indexing.contiguous_strides(row_sizes))
    ivars = indexing.loop_vars("i", len(sizes))
    mapping = {ivars[k]: indexing.simplify(e, ranges) for k, e in zip(others, rows)}
    # a length 1 scans at 0 (a symbolic size is never 1: Dynamo's size symbols are at least 2)
    mapping[ivars[scan.dim]] = R if sizes[scan.dim] != 1 else sympy.Integer(0)
    return mapping


def plan_scan_space(nodes: Sequence[ir.Node], stored: set[str]) -> KernelSpace:
    if any(isinstance(n, (ir.Reduction, ir.Scatter, ir.Extern)) for n in nodes):
        raise SpaceError("a scan shares its kernel with scans and pointwise nodes only")
    scans = [n for n in nodes if isinstance(n, ir.Scan)]
    anchor = scans[0]
    sizes, dim = anchor.buffer.sizes, anchor.dim
    rnumel = sizes[dim]
    xnumel = anchor.buffer.numel // max(rnumel, 1)
    ranges = {X: max(xnumel, 1), R: max(rnumel, 1)}
    base = scan_mapping(anchor, ranges)
    ivars = indexing.loop_vars("i", len(sizes))
    mapping: dict[str, dict[sympy.Symbol, sympy.Expr]] = {}
    for node in nodes:
        if isinstance(node, ir.Scan):
            if node.buffer.sizes != sizes or node.dim != dim:
                raise SpaceError(f"scans differ: {node.name} along dim {node.dim} of {list(node.buffer.sizes)}, "
                                 f"{anchor.name} along dim {dim} of {list(sizes)}")
            mapping[node.name] = base
        elif node.name in stored:
            if node.buffer.numel != anchor.buffer.numel:
                raise SpaceError(f"{node.name} has {node.buffer.numel} elements, not one per element of "
                                 f"scan {anchor.name} ({anchor.buffer.numel})")
            if node.buffer.sizes == sizes:
                mapping[node.name] = base
                continue
            flat = indexing.ravel([base[v] for v in ivars], indexing.contiguous_strides(sizes))
            nsizes = node.buffer.sizes
            index = indexing.unravel(flat, nsizes, indexing.contiguous_strides(nsizes))
            nvars = indexing.loop_vars("i", len(nsizes))
            mapping[node.name] = {v: indexing.simplify(e, ranges) for v, e in zip(nvars, index)}
    space = KernelSpace(xnumel, rnumel, anchor, mapping)
    _check_loads(nodes, space, [n.name for n in nodes if n.name in mapping])
    return space


def plan_scatter_space(nodes: Sequence[ir.Node], stored: set[str]) -> KernelSpace:
    scatters = [n for n in nodes if isinstance(n, ir.Scatter)]
    if len(scatters) > 1:
        raise SpaceError("one scatter per kernel")
    scatter = scatters[0]
    for node in nodes:
        if node is scatter:
            continue
        if not isinstance(node, ir.Pointwise):
            raise SpaceError(f"a scatter kernel holds pointwise producers only, not {node.name}")
        if node.name == scatter.target.name:
            raise SpaceError(f"{scatter.name} writes into {node.name}, which must be complete before it starts")
        if node.name in stored:
            raise SpaceError(f"{node.name} must be stored; a scatter kernel stores its scatter only")
        if any(v.buffer.name == scatter.name for v in node.reads()):
            raise SpaceError(f"{node.name} reads {scatter.name}, which is complete only after its kernel")
    xnumel = scatter.numel
    ranges = {X: max(xnumel, 1)}
    ivars = indexing.loop_vars("i", len(scatter.ranges))
    flat = indexing.unravel(X, scatter.ranges, indexing.contiguous_strides(scatter.ranges))
    mapping = {scatter.name: {v: indexing.simplify(e, ranges) for v, e in zip(ivars, flat)}}
    space = KernelSpace(xnumel, 1, None, mapping)
    _check_loads(nodes, space, [scatter.name])
    return space


def _check_loads(nodes: Sequence[ir.Node], space: KernelSpace, roots: list[str]) -> None:
    """Every in-kernel load of a scan's result is of the element being computed; nothing gathers
    from a node of the kernel (a gather reads memory; a concatenation's parts, at positions
    computed from the index, may be computed in it)."""
    producers = {n.name: n for n in nodes}
    ranges = space.ranges
    seen: set[tuple[str, tuple[sympy.Expr, ...]]] = set()

    def walk(node: ir.Node, subst: dict[sympy.Symbol, sympy.Expr]) -> None:
        exprs = node.exprs() if isinstance(node, ir.Scatter) else (node.body,)
        for load in (ld for e in exprs for ld in ir.loads(e)):
            producer = producers.get(load.view.buffer.name)
            if producer is None:
                continue
            index = load.index if isinstance(load, ir.Load) else load.computed_index()
            if index is None:
                raise SpaceError(f"{node.name} gathers from {producer.name}, which must be in memory")
            # a concatenation's part reads at positions computed from the index: inlined like a load
            idx = tuple(indexing.simplify_at(i, subst, ranges) for i in index)
            pidx = producer_index(producer, load.view, idx, ranges)
            pvars = indexing.loop_vars("i", len(producer.buffer.sizes))
            if isinstance(producer, ir.Scan):
                want = space.mapping[producer.name]
                for v, e, size in zip(pvars, pidx, producer.buffer.sizes):
                    if size != 1 and e != want[v] and sympy.expand(e - want[v]) != 0:
                        raise SpaceError(f"{node.name} reads scan {producer.name} at another element")
                continue
            key = (producer.name, tuple(pidx))
            if key not in seen:
                seen.add(key)
                walk(producer, dict(zip(pvars, pidx)))

    for name in roots:
        walk(producers[name], space.mapping[name])
