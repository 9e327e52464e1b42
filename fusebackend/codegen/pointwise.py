"""Pointwise kernels: one flat index ``xindex`` over the plan's common number of elements.

Each stored node gets its loop variables by unravelling ``xindex`` in its buffer's memory order,
so stores are contiguous; loads of other layouts index accordingly.

A load that is contiguous along another output dim than the fastest one (a transpose: the
output's rows are the input's columns) would read one element per 32-byte sector in that order.
Such a kernel is generated *tiled* instead: each program covers a ``[YBLOCK, XBLOCK]`` tile, y
along the output dim the load is contiguous in and x along the output's fastest dims, so the
load is coalesced along y and the stores along x (Triton moves the tile between the two thread
layouts through shared memory). ``xindex`` then stands for ``x_outer * (ny * nx) + y_index *
nx + x_inner``, and the index arithmetic simplifies to the three tile variables.
"""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Mapping

import sympy

from fusebackend import indexing, ir
from fusebackend.config import config, use_interpreter
from fusebackend.codegen.body import KernelBody, KernelSource
from fusebackend.codegen.memory import in_place_pairs
from fusebackend.codegen.kernel_header import GRID_WAIT, HEADER, describe, header, kernel_name, sizes_in
from fusebackend.codegen.writer import LineWriter
from fusebackend.kernels import runtime
from fusebackend.sizevars import ceil_div, size_hint
from fusebackend.scheduler import KernelPlan
from fusebackend.scheduler.space import X

XDIMS = frozenset("x")
X_OUTER, Y_INDEX, X_INNER = indexing.var("x_outer"), indexing.var("y_index"), indexing.var("x_inner")


@dataclasses.dataclass(frozen=True)
class Tile:
    """Tiling of the flat index: ``outer`` blocks of ``ysize`` (y) by ``inner`` (x) elements."""

    # over symbolic sizes any of the three may be symbolic; y and x are then masked
    # (``_generate_tiled``)
    outer: int | sympy.Expr
    ysize: int | sympy.Expr
    inner: int | sympy.Expr
    launch: dict[str, int]  # XBLOCK (along x), YBLOCK (along y), num_warps
    load: str  # the buffer whose transposed load asked for the tiles (or whose per-column one)
    columns: bool = False  # column_tile's: rows (y) by the fastest dim (x), for per-column loads

    def substitute(self) -> sympy.Expr:
        outer = X_OUTER * (self.ysize * self.inner) if sizes_in(self.outer) or self.outer > 1 else sympy.Integer(0)
        return outer + Y_INDEX * self.inner + X_INNER


def generate_pointwise(plan: KernelPlan, index: int, pdl: bool = False,
                       launch: dict[str, int] | None = None) -> KernelSource | None:
    """The kernel: flat or tiled as the plan asks.

    ``launch``: an autotuning candidate's blocks and warps. With XBLOCK alone, the flat kernel
    in those; with YBLOCK too, the tiled kernel the plan asks for in those, or None where the
    plan is not tiled or the blocks do not tile it as its heuristic's must (dividing both
    extents, at least ``_MIN_TILE`` each).
    """
    tiled = launch is not None and "YBLOCK" in launch
    flat = _generate_flat(plan, index, pdl, None if tiled else launch)
    if launch is not None and not tiled:
        return flat[0]
    if sizes_in(plan.space.xnumel):  # over symbolic sizes: no autotuning candidates
        tile = None if tiled else transpose_tile(plan, flat[1]) or column_tile(plan, flat[1])
        if tile is not None:
            return _generate_tiled(plan, index, tile, pdl)
        return None if tiled else _flat_choice(plan, index, pdl, flat)
    tile = transpose_tile(plan, flat[1]) or column_tile(plan, flat[1])
    if tile is None:
        return None if tiled else _flat_choice(plan, index, pdl, flat)
    if launch is not None:
        least = _MIN_TILE[tile.columns]
        if (launch["XBLOCK"] < least[0] or launch["YBLOCK"] < least[1]
                or tile.inner % launch["XBLOCK"] or tile.ysize % launch["YBLOCK"]):
            return None
        tile = dataclasses.replace(tile, launch=launch)
    return _generate_tiled(plan, index, tile, pdl)


# the least (XBLOCK, YBLOCK) of a transposing tile (False) and of a column tile (True), as their
# heuristics choose them (runtime.tile_config, runtime.column_tile_config)
_MIN_TILE = {False: (8, 8), True: (8, 4)}


def kernel_stores(plan: KernelPlan, body: KernelBody, subst_of: dict[str, dict[sympy.Symbol, sympy.Expr]],
                  shape: str, values: Mapping[str, ir.Expr] = MappingProxyType({})
                  ) -> tuple[list[tuple[str, str, str]], dict[str, str], tuple[tuple[str, str], ...]]:
    """The stores (pointer, offset, value), the output pointers, and the (output, input) pairs
    that may share memory (``in_place_pairs``); ``values``: what a node stores where it is not
    its body (a product kernel's product: its accumulator)."""
    stores: list[tuple[str, str, str]] = []
    outputs: dict[str, str] = {}
    offsets: dict[str, sympy.Expr] = {}
    for node in plan.nodes:
        if node.buffer not in plan.stored:
            continue
        buf = node.buffer
        subst = subst_of[node.name]
        value = body.broadcast(body.value(values.get(node.name, node.body), subst), buf.dtype, shape, XDIMS)
        nvars = indexing.loop_vars("i", len(buf.sizes))
        offset = body.index(indexing.ravel([subst[v] for v in nvars], buf.strides))
        ptr = f"out_ptr{len(outputs)}"
        outputs[buf.name] = ptr
        offsets[buf.name] = offset
        stores.append((ptr, body.offset_text(offset, XDIMS), value))
    return stores, outputs, in_place_pairs(body, offsets)


def _generate_flat(plan: KernelPlan, index: int, pdl: bool,
                   launch: dict[str, int] | None = None) -> tuple[KernelSource, KernelBody]:
    space = plan.space
    numel = space.xnumel
    launch = launch or runtime.pointwise_config(size_hint(numel), _widest(plan))
    # a symbolic extent is a multiple of the block only where proven (its Mod is 0): else masked
    body = KernelBody(plan, space, XDIMS if numel % launch["XBLOCK"] == 0 else frozenset())
    body.lanes = (X, launch["XBLOCK"])  # blocks start at multiples of XBLOCK (codegen.pairs.pair_load)
    stores, outputs, in_place = kernel_stores(plan, body, space.mapping, "[XBLOCK]")
    name = kernel_name(plan, index)
    symbols = body.size_params()
    w = LineWriter()
    w.lines(header({"xnumel": numel, **{str(s): s for s in symbols}}))
    params = list(body.inputs.values()) + list(outputs.values()) + ["xnumel", *map(str, symbols), "XBLOCK: tl.constexpr"]
    w.line(f"def {name}({', '.join(params)}):")
    with w.indent():
        w.lines(describe(plan))
        if pdl:
            w.line(GRID_WAIT)
        if body.uses_int64(numel):
            w.line("xoffset = tl.program_id(0).to(tl.int64) * XBLOCK")
            w.line("xindex = xoffset + tl.arange(0, XBLOCK).to(tl.int64)")
        else:
            w.line("xoffset = tl.program_id(0) * XBLOCK")
            w.line("xindex = xoffset + tl.arange(0, XBLOCK)")
        mask = body.mask(XDIMS)
        if mask is not None:
            w.line("xmask = xindex < xnumel")
        w.lines(body.lines)
        for ptr, offset, value in stores:
            w.line(f"tl.store({ptr} + ({offset}), {value}" + (f", {mask})" if mask else ")"))
    grid = ceil_div(numel, launch["XBLOCK"])  # over symbolic sizes: computed at each call
    source = KernelSource(name, w.source(), tuple(body.inputs) + tuple(outputs), (numel, *symbols), grid, launch, plan,
                          body.asserts, in_place=in_place)
    return source, body


def _widest(plan: KernelPlan) -> int:
    """The widest element of the tensors a kernel reads from memory and stores, in bytes."""
    produced = {n.name for n in plan.nodes}  # in-kernel values are never in memory
    read = [v.buffer for n in plan.nodes for v in n.reads() if v.buffer.name not in produced]
    return max((b.dtype.itemsize for b in [*plan.stored, *read]), default=4)


def _flat_choice(plan: KernelPlan, index: int, pdl: bool, flat: tuple[KernelSource, KernelBody]) -> KernelSource:
    """The flat kernel at its heuristic's launch, or generated again in smaller blocks where it
    loads a window element by element (``scalar_window``, ``runtime.WINDOW_BLOCK``)."""
    source, body = flat
    window = scalar_window(body)
    if window < runtime.WINDOW_TILES:
        return source
    windowed = runtime.pointwise_config(size_hint(plan.space.xnumel), _widest(plan), window)
    return source if windowed == source.launch else _generate_flat(plan, index, pdl, windowed)[0]


def transpose_tile(plan: KernelPlan, body: KernelBody) -> Tile | None:
    """Tiles for a kernel with a transposed load (see the module docstring), or None.

    ``body`` is the flat kernel's, which recorded every load's offset as a function of xindex.
    The output dims are the first stored buffer's, in memory order; the load chosen is the
    largest one whose step along the fastest output dim is neither 0 (broadcast) nor 1. An
    extent that no block of 8 or more divides (196 positions of a 14x14 map) takes a block
    that does not divide it (``runtime.tile_config``), its last block shifted back
    (``_generate_tiled``): flat, the kernel would read one element per 32-byte sector.

    Over symbolic sizes, decided at the sizes being compiled; the tile keeps the
    dims' own sizes, and along an extent of symbolic size a block of the hint's next power of
    two up to 64, masked (``_generate_tiled``).
    """
    out = _output_dims(plan)
    if out is None:
        return None
    buf, dims = out

    strided = [(b, off) for b, off in body.load_offsets
               if X in off.free_symbols and _step(off, 1) not in (0, 1)]
    if not strided:
        return None
    load, offset = max(strided, key=lambda bo: size_hint(bo[0].numel) * bo[0].dtype.itemsize)
    for j in range(len(dims) - 2, -1, -1):
        inner = math.prod(dims[j + 1:])
        if _step(offset, inner) != 1:
            continue
        if not sizes_in(buf.numel):
            ysize = _merged_rows(offset, dims, j, inner)
            launch = runtime.tile_config(ysize, inner)
            if min(launch["XBLOCK"], launch["YBLOCK"]) < 8:
                return None  # too thin a tile to coalesce either side
            return Tile(size_hint(buf.numel) // (ysize * inner), ysize, inner, launch, load.name)
        own = _own_dims(buf)
        ysize, own_inner = own[j], math.prod(own[j + 1:])
        launch = runtime.tile_config(_masked_block(dims[j]) if sizes_in(ysize) else dims[j],
                                     _masked_block(inner) if sizes_in(own_inner) else inner)
        if min(launch["XBLOCK"], launch["YBLOCK"]) < 8 or (not sizes_in(ysize) and dims[j] % launch["YBLOCK"]) or (
                not sizes_in(own_inner) and inner % launch["XBLOCK"]):
            return None
        return Tile(sympy.sympify(buf.numel) / (ysize * own_inner), ysize, own_inner, launch, load.name)
    return None


def _merged_rows(offset: sympy.Expr, dims: list[int], j: int, inner: int) -> int:
    """The y extent of a transposing tile whose load is contiguous along output dim ``j``: that
    dim's, and where it is under 8, merged with the output dims before it for as long as the load
    stays contiguous across them. A 3x3 convolution's weight made channels-last, ``(K, C, 3, 3)``
    read into ``(K, 3, 3, C)``, is per output channel a ``C x 9`` block read into ``9 x C``: its
    load is contiguous along the 3 of the kernel's width alone, and along the 9 positions of both
    kernel dims together. Flat, such copies took 2.0 ms of Stable Diffusion's UNet's 8.4 ms
    inference step on the GPU, at 28-39% of their floor (H100, bf16, 2026-11-27); every call of
    a graph that takes the weights as inputs makes them (``lowering/layouts.py``)."""
    ysize = dims[j]
    for i in range(j - 1, -1, -1):
        if ysize >= 8 or _step(offset, inner * ysize) != ysize:
            break
        ysize *= dims[i]
    return ysize


def column_tile(plan: KernelPlan, body: KernelBody) -> Tile | None:
    """Tiles for a kernel that reads small tensors along its output's fastest dim alone, or None.

    A channels-last activation's batch norm reads the channel's mean, variance, weight and bias
    at ``xindex % C``, and computes ``1 / sqrt(var + eps)`` (correctly rounded: two long
    instruction sequences) for every element: in a flat kernel over ResNet-50's first bottleneck
    (H200, bf16, 51M elements, 2026-11-24) that work made the kernel 215 us against 121 us for
    Inductor's. Tiled ``[YBLOCK, XBLOCK]`` with x along the fastest dim, such a load is a
    ``[1, XBLOCK]`` block, and Triton computes what depends on it alone at that shape: once per
    column of the tile, not once per element. Taken where at least two tensors are read
    per column (one bias add gains nothing, nor do the two halves of a concatenation reading one
    tensor at two offsets), or one is and the kernel reads a window (below), and where blocks
    divide both extents (``runtime.column_tile_config``). A small kernel (under
    ``runtime.SMALL_POINTWISE`` elements) without a window stays flat on a GPU (the interpreter,
    where the tests run, tiles it at any size): at batch 1 fuse's tiled batch norm over 50K
    channels-last elements took 1.67 us at its best blocks and warps, a flat one in blocks of 512
    1.46 to 1.52 us (H100, bf16, replayed in a CUDA graph, benchmarks/studies/tile_study.py, 2026-11-25).

    A window over a channels-last tensor (a depthwise convolution: its weights are per-column
    loads, ``kh * kw`` of them) gains most: each of its ``kh * kw`` positions needs its row's
    spatial index, bounds and mask, which tiled are computed once per row of the block. A window
    is one tensor read at ``runtime.WINDOW_TILES`` positions or more.
    """
    if not config.column_tiles:
        return None
    out = _output_dims(plan)
    if out is None:
        return None
    buf, dims = out
    inner = dims[-1]
    offsets = _moving_offsets(body)
    per_column = sorted({name for name, offs in offsets.items() for off in offs
                         if _step(off, 1) != 0 and _step(off, inner) == 0})
    window = window_positions(body)
    if not per_column or (len(per_column) < 2 and window < runtime.WINDOW_TILES):
        return None
    numel = size_hint(buf.numel)
    gpu = not use_interpreter() or config.gpu_blocks  # (a GPU's blocks)
    if window < runtime.WINDOW_TILES and numel < runtime.SMALL_POINTWISE and gpu:
        return None  # a small kernel's one wave: flat blocks of 512 finish sooner (pointwise_config)
    launch = runtime.column_tile_config(numel // inner, inner, window)
    if launch is None:
        return None
    if not sizes_in(buf.numel):
        return Tile(1, numel // inner, inner, launch, per_column[0], columns=True)
    # over symbolic sizes: the blocks chosen at the hints, masked where an extent is symbolic
    fastest = _own_dims(buf)[-1]
    return Tile(1, sympy.sympify(buf.numel) / fastest, fastest, launch, per_column[0], columns=True)


def _moving_offsets(body: KernelBody) -> dict[str, set[sympy.Expr]]:
    """Each loaded tensor's offsets that move with x, by the tensor's name."""
    offsets: dict[str, set[sympy.Expr]] = {}
    for b, off in body.load_offsets:
        if X in off.free_symbols:
            offsets.setdefault(b.name, set()).add(off)
    return offsets


def window_positions(body: KernelBody) -> int:
    """The most positions a kernel loads one tensor at (its window: a depthwise convolution's
    ``kh * kw``), of the offsets that move with x."""
    return max((len(offs) for offs in _moving_offsets(body).values()), default=0)


def scalar_window(body: KernelBody) -> int:
    """The most positions a kernel loads one tensor at where none of those loads can be a
    16-byte vector: a window whose positions are all a fixed number of elements apart, some not
    a multiple of a vector (a depthwise convolution over channels-first activations: its taps
    one element apart), or whose positions all step across x by more than one element (read
    across a transposed layout: a channels-last input into a channels-first output). A tensor
    read at one position an element of x (a per-channel weight's taps, constant along x) is no
    such window, nor one whose positions differ by more than a constant (the halves a rotation
    or a concatenation reads, each of which may be contiguous)."""
    sizes = {b.name: b.dtype.itemsize for b, _ in body.load_offsets}
    most = 0
    for name, offsets in _moving_offsets(body).items():
        moving = sorted((off for off in offsets if _step(off, 1) != 0), key=str)
        if len(moving) <= most:
            continue
        lanes = max(1, 16 // sizes[name])
        apart = [off - moving[0] for off in moving]
        strided = all(abs(_step(off, 1)) > 1 for off in moving)
        odd = all(d.is_Integer for d in apart) and any(int(d) % lanes for d in apart)
        if strided or odd:
            most = len(moving)
    return most


def _output_dims(plan: KernelPlan) -> tuple[ir.Buffer, list[int]] | None:
    """The first stored buffer and its dims of more than one element in memory order (fastest
    last), where it is dense and has two such dims; else None. Over symbolic sizes, the dims at
    the sizes being compiled (``size_hint``), by which the tiles are chosen (``_own_dims``: the
    dims' own sizes)."""
    stored = [n.buffer for n in plan.nodes if n.buffer in plan.stored]
    if not stored:
        return None
    buf = stored[0]
    sizes, strides = [size_hint(n) for n in buf.sizes], [size_hint(n) for n in buf.strides]
    if not indexing.is_dense(sizes, strides):
        return None
    dims = [sizes[d] for d in indexing.dense_order(sizes, strides) if sizes[d] > 1]
    return (buf, dims) if len(dims) >= 2 else None


def _masked_block(hint: int) -> int:
    """A tile's block along an extent of a symbolic size: the next power of two of its hint,
    up to 64 (the extent is masked; ``_generate_tiled``)."""
    return min(64, 1 << max(hint - 1, 0).bit_length())


def _own_dims(buf: ir.Buffer) -> list[int | sympy.Expr]:
    """``_output_dims``' dims of ``buf`` with their own sizes, symbolic ones included."""
    sizes, strides = [size_hint(n) for n in buf.sizes], [size_hint(n) for n in buf.strides]
    return [buf.sizes[d] for d in indexing.dense_order(sizes, strides) if sizes[d] > 1]


def _step(offset: sympy.Expr, by: int) -> int:
    """How far ``offset`` moves from flat position 0 to ``by`` (over symbolic sizes, at the sizes
    being compiled)."""
    return size_hint(offset.xreplace({X: sympy.Integer(by)}) - offset.xreplace({X: sympy.Integer(0)}))


def _generate_tiled(plan: KernelPlan, index: int, tile: Tile, pdl: bool) -> KernelSource:
    """The tiled kernel. Its blocks divide both extents (no masks), but for two kinds of extent:

    - one of a symbolic size is masked at the stores, and its positions past the end read its
      last one again (``tl.minimum``), so that every load stays in range unmasked and a
      per-column load stays one ``[1, XBLOCK]`` block;
    - a static one its block does not divide (``runtime.ragged_tile_block``) has its last block
      shifted back to end where the extent ends, over part of the block before it: both write
      the same values there, so the kernel writes no output over its inputs. Its indices stay
      a start plus ``tl.arange``, which Triton coalesces; clamped ones (``tl.minimum``) would not
      be, and a GroupNorm's transposing output kernel over 14x14 maps (b64, 1024 channels, bf16,
      H100) took 211 us clamped and masked, against 53 us flat.

    Over symbolic sizes the kernel takes both extents and the symbols its indices use as
    arguments, and its grid is computed at each call."""
    space = plan.space
    numel = space.xnumel
    launch = tile.launch
    rows, columns = sizes_in(tile.ysize), sizes_in(tile.inner)
    # static extents their blocks do not divide: (extent, block) of each, else None
    y_ragged = None if rows or tile.ysize % launch["YBLOCK"] == 0 else (tile.ysize, launch["YBLOCK"])
    x_ragged = None if columns or tile.inner % launch["XBLOCK"] == 0 else (tile.inner, launch["XBLOCK"])
    outer = tile.outer if sizes_in(tile.outer) else max(tile.outer, 1)
    body = tile_body(plan, {X_OUTER: outer, Y_INDEX: tile.ysize, X_INNER: tile.inner})  # blocks divide both extents
    if x_ragged is None or tile.inner % 2 == 0:  # every block starts at an even column
        body.lanes = (X_INNER, launch["XBLOCK"])
    tiled = {X: tile.substitute()}
    subst_of = {name: {v: e.xreplace(tiled) for v, e in m.items()} for name, m in space.mapping.items()}
    stores, outputs, in_place = kernel_stores(plan, body, subst_of, "[YBLOCK, XBLOCK]")
    if y_ragged or x_ragged:
        in_place = ()  # overlapping blocks: one's stores would change what the other reads
    name = kernel_name(plan, index)
    symbols = body.size_params()
    symbolic = bool(rows or columns or sizes_in(tile.outer) or symbols)
    w = LineWriter()
    params = list(body.inputs.values()) + list(outputs.values())
    if symbolic:
        w.lines(header({"xnumel": numel, "ysize": tile.ysize, "xsize": tile.inner, **{str(s): s for s in symbols}}))
        params += ["xnumel", "ysize", "xsize", *map(str, symbols), "XBLOCK: tl.constexpr", "YBLOCK: tl.constexpr"]
    else:
        w.lines(HEADER)
        params += ["xnumel", "XBLOCK: tl.constexpr", "YBLOCK: tl.constexpr"]
    w.line(f"def {name}({', '.join(params)}):")
    with w.indent():
        w.lines(describe(plan))
        if tile.columns:
            w.line(f"# tiled: {tile.ysize} rows (y) of {tile.inner} columns (x), so that what is computed from "
                   f"per-column loads ({tile.load}...) is computed once per column of a block; "
                   + ("masked at the stores" if rows or columns else _ragged_note(y_ragged, x_ragged)))
        else:
            w.line(f"# tiled: {tile.ysize} (y) by {tile.inner} (x) elements per {tile.outer} outer block(s), so "
                   f"that {tile.load} is read along y and the outputs written along x; "
                   + ("masked at the stores" if rows or columns else _ragged_note(y_ragged, x_ragged)
                      or "blocks tile exactly: no masks"))
        if pdl:
            w.line(GRID_WAIT)
        pid = "tl.program_id(0).to(tl.int64)" if body.uses_int64(numel) else "tl.program_id(0)"
        w.line(f"pid = {pid}")
        w.line("x_tiles = (xsize + XBLOCK - 1) // XBLOCK" if columns else f"x_tiles = {ceil_div(tile.inner, launch['XBLOCK'])}"
               if x_ragged else f"x_tiles = {tile.inner} // XBLOCK")
        w.line("y_tiles = (ysize + YBLOCK - 1) // YBLOCK" if rows else f"y_tiles = {ceil_div(tile.ysize, launch['YBLOCK'])}"
               if y_ragged else f"y_tiles = {'ysize' if symbolic else tile.ysize} // YBLOCK")
        tile_axis(w, "x_inner", "(pid % x_tiles) * XBLOCK", "[None, :]", "XBLOCK", "xcmask", "xsize", columns, x_ragged)
        tile_axis(w, "y_index", "((pid // x_tiles) % y_tiles) * YBLOCK", "[:, None]", "YBLOCK", "ymask", "ysize", rows,
                   y_ragged)
        w.line("x_outer = pid // (x_tiles * y_tiles)")
        w.lines(body.lines)
        mask = " & ".join(m for m, on in (("ymask", rows), ("xcmask", columns)) if on)
        for ptr, offset, value in stores:
            w.line(f"tl.store({ptr} + ({offset}), {value}" + (f", {mask})" if mask else ")"))
    if symbolic:
        grid = outer * ceil_div(tile.inner, launch["XBLOCK"]) * ceil_div(tile.ysize, launch["YBLOCK"])
        return KernelSource(name, w.source(), tuple(body.inputs) + tuple(outputs), (numel, tile.ysize, tile.inner, *symbols),
                            grid, launch, plan, body.asserts, in_place=in_place)
    grid = tile.outer * ceil_div(tile.inner, launch["XBLOCK"]) * ceil_div(tile.ysize, launch["YBLOCK"])
    return KernelSource(name, w.source(), tuple(body.inputs) + tuple(outputs), (numel,), grid, launch, plan,
                        body.asserts, in_place=in_place)


def tile_body(plan: KernelPlan, ranges: dict[sympy.Symbol, int | sympy.Expr]) -> KernelBody:
    """The body of a kernel over ``[YBLOCK, XBLOCK]`` tiles, unmasked: ``ranges`` gives the
    extent of each index the tiles vary along (``x_outer``, one value a program; ``y_index``;
    ``x_inner``; and any a kernel adds, a product's positions along K)."""
    body = KernelBody(plan, plan.space, XDIMS)
    body.ranges = dict(ranges)
    body.x_symbols = frozenset(ranges)
    body.program_scalars = frozenset({X_OUTER})
    body.rank = 2
    body.element_loads = False
    body.x_zero = "0 * y_index + 0 * x_inner"
    return body


def _ragged_note(y_ragged: tuple[int, int] | None, x_ragged: tuple[int, int] | None) -> str:
    axes = [a for a, r in (("y", y_ragged), ("x", x_ragged)) if r]
    return (f"the last block along {' and '.join(axes)} shifted back to end at the extent's end: no masks"
            if axes else "")


def tile_axis(w: LineWriter, index: str, start: str, axis: str, block: str, mask: str, size: str, masked: bool,
               ragged: tuple[int, int] | None = None) -> None:
    """A tile's index along one axis: ``start``, the block's first position, plus its lanes;
    along an extent of symbolic ``size`` (``masked``), past its end the last position again, and
    ``mask`` for the stores; along a static extent its block does not divide (``ragged``: the
    extent and the block), the last block shifted back to end at the extent's end, its start
    still a multiple of what both the block and the shifted start are."""
    lanes = f"tl.arange(0, {block}){axis}"
    if ragged is not None:
        extent, size_of_block = ragged
        last = extent - size_of_block
        shifted = f"tl.minimum({start}, {last})"
        multiple = math.gcd(size_of_block, last)
        w.line(f"{index}_start = " + (f"tl.multiple_of({shifted}, {multiple})" if multiple > 1 else shifted))
        w.line(f"{index} = {index}_start + {lanes}")
        return
    if not masked:
        w.line(f"{index} = {start} + {lanes}")
        return
    w.line(f"{index}_raw = {start} + {lanes}")
    w.line(f"{mask} = {index}_raw < {size}")
    w.line(f"{index} = tl.minimum({index}_raw, {size} - 1)  # past the end: the last position again, not stored")
