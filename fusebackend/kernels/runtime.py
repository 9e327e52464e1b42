"""Runtime for generated code: load kernel modules, choose launch configs, launch kernels (what a
wrapper calls besides them is ``wrapper_calls.py``).

Triton compiles a ``@triton.jit`` function from its source file, so every generated kernel is
written to ``<cache_dir>/kernels/<name>_<hash>.py`` (atomically: a temporary file renamed into
place; a temporary folder where the cache folder cannot be written: ``cache.folder``) and
imported from there. Loaded kernels are kept in memory by the hash of their source,
so a kernel shared by two graphs or two shape specializations is loaded and compiled once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import math
import os
import sys
import types
from typing import Any, Iterator

import torch

from fusebackend import cache, metrics
from fusebackend.config import config, environment_kept, use_interpreter
# current_stream: generated wrappers import it from here
from fusebackend.kernels.direct_launch import current_stream, direct_launch, direct_launcher  # noqa: F401

_loaded: dict[str, Any] = {}


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def _write_source(path: str, text: str) -> None:
    """Write a module's source where it is not already (atomically: ``cache.write_atomic``)."""
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    if not cache.write_atomic(path, text.encode()):
        raise OSError(f"fusebackend: could not write the kernel module {path}")


@contextlib.contextmanager
def _decorating() -> Iterator[None]:
    """Decorate ``@triton.jit`` functions in the mode the config asks for.

    Triton fixes a function's mode (compiled or interpreted) when it is decorated. Generated
    kernels and ``triton_helpers`` use only Triton builtins, never Triton's own ``@jit`` library
    functions, so they can be interpreted even when Triton was imported in compiled mode.
    """
    import triton

    knobs = getattr(triton, "knobs", None)  # absent in older Tritons: TRITON_INTERPRET decided
    saved = knobs.runtime.interpret if knobs is not None else None
    # setting the knob writes TRITON_INTERPRET too: left so, TRITON_INTERPRET=0 would reach every
    # process the user starts after (one that picks the interpreter where it is unset)
    with environment_kept("TRITON_INTERPRET"):
        if knobs is not None:
            knobs.runtime.interpret = use_interpreter()
        try:
            import fusebackend.kernels.triton_helpers  # noqa: F401  (decorated in this mode once)

            yield
        finally:
            if knobs is not None:
                knobs.runtime.interpret = saved


def load_module(source: str, stem: str, shared: bool = True) -> types.ModuleType:
    """Import generated source from a file named by its hash.

    With ``shared`` (kernels), a module already loaded from the same source is returned; without
    it (wrappers, which get kernels bound into them) every call makes a new module object.
    """
    key = f"{stem}_{source_hash(source)}"
    if shared and key in _loaded:
        return _loaded[key]
    folder = cache.folder("kernels") or cache.temporary_folder("kernels")
    path = os.path.join(folder, f"{key}.py")
    _write_source(path, source)
    spec = importlib.util.spec_from_file_location(f"fusebackend_generated.{key}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    with _decorating():
        spec.loader.exec_module(module)
    if shared:
        _loaded[key] = module
    return module


_kernels: dict[tuple[str, str], Any] = {}  # (source_hash of a kernel's source less its name, suffix) -> function


def kernel_identity(name: str, source: str) -> str:
    """What two kernels share when ``load_kernel`` serves both with one function: their source
    but for the kernel's name and the comments."""
    body = [line for line in source.replace(name, "kernel").splitlines() if not line.lstrip().startswith("#")]
    return source_hash("\n".join(body))


def load_kernel(name: str, source: str, suffix: str = "") -> Any:
    """The ``@triton.jit`` function ``name`` of ``source``, or the one already loaded from the same
    source under another name.

    Kernels are named after their place in the graph (``fused_red3_...``) and comment on the
    buffers they compute (``# buf50 ...``), so the same fused block of each layer of a model
    (twelve in BERT-base) is the same source but for its name and its comments; one function
    then serves them all, and Triton compiles each specialization of it once. The dumps keep
    each kernel's own source, and profilers show the first one's name. ``suffix``: the function
    ``name + suffix`` of the same module instead (a reduction's persistent kernel for short rows).
    """
    same = (kernel_identity(name, source), suffix)
    kernel = _kernels.get(same)
    if kernel is None:
        kernel = _kernels[same] = getattr(load_module(source, name), name + suffix)
    return kernel


# Entries of a kernel's launch dict that are Triton compile options, not constexpr parameters.
COMPILE_OPTIONS = ("num_warps", "num_stages", "launch_pdl", "debug", "sanitize_overflow", "enable_fp_fusion")

# The compile options of a kernel that asserts (a gather that checks its indices). Triton drops
# ``tl.device_assert`` unless the kernel is compiled with ``debug`` (Triton 3.6 and 3.9 alike);
# debug alone would also check every int32 add, sub and mul for overflow, which
# ``sanitize_overflow`` turns off. In the interpreter, which takes no compile options, the
# Launcher switches its asserts on around the launch (``_interpreter_asserts``).
ASSERT_OPTIONS = {"debug": True, "sanitize_overflow": False}


def use_pdl(device: torch.device) -> bool:
    """Whether kernels for ``device`` may be launched with programmatic dependent launch (PDL).

    With PDL a kernel is launched while the kernel ahead of it in the stream still runs and
    waits for it on the GPU (``gdc_wait``, its first statement), which hides the launch gap
    between dependent kernels: on an H200 (2026-11-23) a column sum of 8192x8192 bf16 (two
    kernels) went from 43.8 to 42.0 us. It needs compute capability 9.0 or later and a Triton
    with grid-dependency control, and ``config.pdl`` (FUSE_PDL=1). Which kernels use it is
    ``codegen.generate_all``'s choice.

    Off by default. With every kernel launched early, including those after cuBLAS and cuDNN
    calls, two models ran slower in one run on the same H200 (convnet.forward 0.822 against
    0.567 ms, transformer.train 2.70 against 2.30 ms). Launching early only after our own
    kernels, the rule now, gained nothing beyond the run-to-run spread in one run of the models
    (same GPU and versions, 2026-11-23: mlp.train 2.50 against 2.45 ms, transformer.train 2.03
    against 2.06).
    """
    if not config.pdl or use_interpreter() or device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _pdl_capable(index)


@functools.cache
def _pdl_capable(index: int) -> bool:
    try:
        from triton.language.extra import cuda as triton_cuda
    except ImportError:
        return False
    return hasattr(triton_cuda, "gdc_wait") and torch.cuda.get_device_capability(index) >= (9, 0)


class Launcher:
    """Launches one generated kernel with its grid and block config fixed at compile time.

    The first call goes through Triton's ``kernel[grid](...)``, which binds and specializes the
    arguments (pointer alignment, integer values), compiles, and returns the compiled kernel.
    Later calls launch that compiled kernel directly (``direct_launch``), skipping the per-call
    binding that costs tens of microseconds in Python, as long as every pointer has the 16-byte
    alignment it had at the first call; the sizes are constants of the compiled graph. Otherwise,
    and always in the interpreter (where no compiled kernel comes back), calls take Triton's own
    path.

    A direct launch is a function written for the kernel at its first call
    (``direct_launch.direct_launcher``): each tensor's address read once (the alignment check
    uses it, and the C launcher takes it as is: given a tensor, it would call ``data_ptr()``
    again and ask the driver whether the address is a device pointer, for every pointer of every
    launch), one alignment test for all pointers, the launch hooks looked at, the C call.

    Calls take the stream first: the wrapper reads the current stream once per graph call
    (``current_stream``), not once per launch; Triton's path reads it itself. With ``home`` (the
    wrapper module's namespace, where the wrapper finds the kernel by ``name``), the direct
    launch, once built, replaces the Launcher there, so that later launches are one Python call.
    """

    def __init__(self, kernel: Any, grid: int | None, launch: dict[str, int],
                 home: dict[str, Any] | None = None, name: str = "") -> None:
        """``grid`` None: each call gives its grid after the stream (a kernel over symbolic
        sizes, whose int arguments Triton does not specialize: ``codegen.kernel_header.header``)."""
        self.kernel = kernel
        self.per_call = grid is None
        self.grid = (grid or 0, 1, 1)
        self.launch = launch
        self.constexprs = tuple(v for k, v in launch.items() if k not in COMPILE_OPTIONS)
        self.fast: Any = None  # direct_launcher's function, once the kernel is compiled
        self.home, self.name = home, name
        self.first = True  # the first call's time goes to metrics.stage_seconds["launch"]

    def __call__(self, stream: int | None, *args: Any) -> None:
        fast = self.fast
        if fast is not None:
            fast(stream, *args)
            return
        self._through_triton(stream, *args)

    def _through_triton(self, stream: int | None, *args: Any) -> None:
        """Triton's own path: binds, specializes and compiles on the first call (and again for
        pointers of another alignment); the first call also builds the direct launch."""
        # the first call: Triton's binding and launch, and its compile where the kernel was not
        # compiled when its graph was loaded (``precompile``); in the interpreter, the run
        first = metrics.timed("launch") if self.first else contextlib.nullcontext()
        self.first = False
        grid = self.grid
        if self.per_call:
            grid, args = (args[0], 1, 1), args[1:]
        with first:
            if self.launch.get("debug") and use_interpreter():
                with _interpreter_asserts():
                    self.kernel[grid](*args, **self.launch)
                return
            compiled = self.kernel[grid](*args, **self.launch)
        if self.fast is None and not use_interpreter() and hasattr(compiled, "__getitem__"):
            direct = direct_launch(compiled, grid)
            self.fast = direct_launcher(direct, args, self.constexprs, self._through_triton, self.per_call)
            if self.home is not None:
                self.home[self.name] = self.fast


@contextlib.contextmanager
def _interpreter_asserts() -> Iterator[None]:
    """Triton's interpreter runs ``tl.device_assert`` only when its builder's options say debug
    (one module-level builder in Triton 3.6 and 3.9): on for one launch, overflow checks off."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    saved = builder.options
    builder.options = dataclasses.replace(saved, debug=True, sanitize_overflow=False)
    try:
        yield
    finally:
        builder.options = saved


SMALL_POINTWISE = 1 << 20  # elements under which a pointwise kernel is bound by latency, not bandwidth


def interpreter_blocks() -> bool:
    """Whether launch configs are the interpreter's (few, large blocks), not a GPU's: kernels run
    in the interpreter, and ``config.gpu_blocks`` is off."""
    return use_interpreter() and not config.gpu_blocks


def pointwise_config(numel: int, itemsize: int = 2, window: int = 0) -> dict[str, int]:
    """Block size and warps for a flat kernel over ``numel`` elements.

    ``itemsize``: the widest element the kernel loads or stores, in bytes. ``window``: the most
    positions the kernel loads one tensor at (a depthwise convolution's ``kh * kw``); from
    ``WINDOW_TILES`` on, blocks of at most ``WINDOW_BLOCK`` elements (see there).
    """
    if interpreter_blocks():
        # The interpreter runs each program in Python: few, large blocks are fastest.
        return {"XBLOCK": min(_next_pow2(numel), 1 << 16)}
    # Measured on an H200 (benchmarks/studies/sweep.py): 32 bytes of each tensor per thread. bf16 in
    # blocks of 2048 by 4 warps reached 100% of the copy floor on batch-norm + relu (1024: 87%,
    # 2026-11-22); fp32 in blocks of 1024 by 4 warps 99.8% on silu(a) * b + 1 (2048: 98.8%,
    # 2026-11-23).
    # A small kernel (under SMALL_POINTWISE elements, such as batch 1's activations) is bound by
    # the latency of its one wave, not by bandwidth: in blocks of 512 by 4 warps (4 elements a
    # thread) a flat batch norm + ReLU over channels-last ResNet-50 activations of 25K to 200K
    # bf16 elements ran in 1.43 to 1.61 us, against 1.65 to 1.77 us in blocks of 2048 (H100,
    # replayed in CUDA graphs, benchmarks/studies/tile_study.py, 2026-11-25). With one rsqrt for
    # 1 / sqrt (codegen/body.py), ResNet-50's replay at batch 1 went from 0.497 to 0.456 ms.
    if numel < SMALL_POINTWISE and itemsize <= 4:
        block = min(_next_pow2(numel), 512)
    else:
        block = min(_next_pow2(numel), 4096 // max(itemsize, 1))
    if window >= WINDOW_TILES:
        block = min(block, WINDOW_BLOCK)
    return flat_launch(block)


# A flat kernel that reads a window (one tensor at WINDOW_TILES positions or more: a depthwise
# convolution over channels-first activations, a pad before it) loads each position element by
# element: a position at an odd offset, or under a mask that changes from element to element,
# cannot be a vector. Triton gives such a load the elements a thread of the kernel's widest
# access (the store's 16-byte vector: 8 bf16 elements), so the lanes of one warp-wide load sit 16
# bytes apart and touch four or five 128-byte lines for 64 bytes. In blocks of 512 by 4 warps (4
# elements a thread) they sit 8 bytes apart. The padded depthwise layers of transformers'
# MobileNetV2 at b64, bf16, each kernel alone replayed in a CUDA graph, us in blocks of 2048 /
# 1024 / 512 / 256 by 4 warps (H200, torch 2.11, Triton 3.6, 2026-12-03,
# benchmarks/studies/flat_configs_study.py): 32x112x112 168.0 / 128.3 / 113.1 / 137.6;
# 96x112x112 stride 2 234.9 / 215.4 / 137.7 / 157.2; 144x56x56 188.1 / 142.5 / 128.2 / 155.4;
# 384x14x14 30.7 / 26.9 / 24.6 / 27.1; 960x7x7 30.2 / 22.5 / 18.8 / 19.6 (1024 by 8 warps, also
# 4 elements a thread, within 5% of 512 by 4). The same layers' batch-norm kernels, without a
# window, were fastest at 1024 or 2048 (26.1 us at 1024 against 32.4 at 512). The whole layers
# after the change (benchmarks/studies/padded_window_study.py, same day): 192.3 -> 136.8 us,
# 235.0 -> 137.8, 217.5 -> 157.8, 58.5 -> 56.5, 37.1 -> 31.1, 37.6 -> 26.0 (Inductor's 132.7 to
# 235.3 us). Column-tiled windows (channels-last) are chosen apart (column_tile_config).
WINDOW_BLOCK = 512


def flat_launch(block: int) -> dict[str, int]:
    """A flat kernel's launch in blocks of ``block``: 4 warps from 512 elements, fewer below."""
    return {"XBLOCK": block, "num_warps": 4 if block >= 512 else max(1, block // 128)}


THIN_TILE_ELEMENTS = 1024  # a transposing tile thin along one extent is widened to this many (tile_config)


def tile_config(ysize: int, inner: int) -> dict[str, int]:
    """Blocks for a tiled (transposing) pointwise kernel over ``ysize`` by ``inner`` elements.

    Along each extent, the largest power of two up to 64 that divides it, where that is 8 or
    more. Else (196 positions of a 14x14 map: 4 divides it) a block that does not divide it
    (``ragged_tile_block``), whose last block the kernel shifts back to end at the extent's end.
    The caller keeps the flat kernel when either block is under 8 (an extent under 8).

    A tile thin along one extent (a block of 8: a 3x3 convolution's 9 kernel positions,
    ``pointwise._merged_rows``) is widened along the other, doubling a block that still divides
    its extent, up to ``THIN_TILE_ELEMENTS`` elements and blocks of 256: a 3x3 weight of 1280 by
    2560 channels made channels-last took 63 us in tiles of 8 by 64, 42 us in 8 by 128, against
    a floor of 28 us (H200, bf16, 2026-11-27, ``benchmarks/studies/tile_study.py``).
    """
    blocks = {"XBLOCK": _tile_block(inner), "YBLOCK": _tile_block(ysize)}
    for wide, thin, extent in (("XBLOCK", "YBLOCK", inner), ("YBLOCK", "XBLOCK", ysize)):
        while (blocks[wide] * blocks[thin] < THIN_TILE_ELEMENTS and blocks[wide] < 256
               and extent % (2 * blocks[wide]) == 0):
            blocks[wide] *= 2
    if interpreter_blocks():
        return blocks
    return {**blocks, "num_warps": 4}


def _tile_block(extent: int) -> int:
    exact = math.gcd(extent, 64)
    return exact if exact >= 8 or extent < 8 else ragged_tile_block(extent)


def ragged_tile_block(extent: int) -> int:
    """A block along an extent of 8 or more that no block of 8 to 64 divides: of 64, 32, 16 and
    8 (those not above the extent), the one that covers it with the fewest positions, a
    block's fixed work (its indices, its share of the shared memory it transposes through)
    counted as 8 more: 196 takes 32 (7 blocks over 224 positions, against 256 for 64 and 208
    in 13 blocks of 16); 49 takes 32 (2 blocks over 64 positions)."""
    return min((b for b in (64, 32, 16, 8) if b <= extent), key=lambda b: -(-extent // b) * (b + 8))


WINDOW_TILES = 4  # from this many positions of one tensor, column_tile_config's window blocks


def column_tile_config(rows: int, inner: int, window: int = 1) -> dict[str, int] | None:
    """Blocks for a column-tiled pointwise kernel (``codegen/pointwise.column_tile``): ``rows``
    rows of ``inner`` contiguous elements, each block dividing its extent (no masks). None where
    no such blocks are worth it: under 16 columns (a block must cover 32 contiguous bytes) or
    under 4 rows a block (what is computed once per column would be shared by too few rows).

    A block holds 4096 elements (1024 in the interpreter); with 4 warps a thread holds 32 of
    them, 8 columns by 4 rows, so a value computed from the columns alone is computed once for
    four elements.

    ``window``: the most positions the kernel loads one tensor at (a depthwise convolution's
    ``kh * kw``). From ``WINDOW_TILES`` on, a block holds 1024 elements (each position's load is
    a block of registers, and Triton issues them together), and 8 columns are enough: per-row
    work, an index and a mask for each position, outweighs half-used 32-byte sectors (MobileNetV3
    has 72, 120, 184 and 200 channels).
    """
    windowed = window >= WINDOW_TILES
    total = 1024 if interpreter_blocks() or windowed else 4096
    xblock = math.gcd(inner, 256)
    yblock = math.gcd(rows, total // xblock) if xblock >= (8 if windowed else 16) else 0
    if yblock < 4:
        return None
    blocks = {"XBLOCK": xblock, "YBLOCK": yblock}
    return blocks if interpreter_blocks() else {**blocks, "num_warps": 4}


# A GPU reduction over rows longer than this loops over each row in blocks (reduction_config);
# rows up to it sit in one block.
LONGEST_PERSISTENT_ROW = 8192
# A looped reduction over rows of at least TAIL_BLOCKS whole blocks runs them without a mask and
# the row's last, partial block masked after them (codegen/reduction.py); shorter loops mask
# every block. GroupNorm(32) and SiLU over NCHW bf16 activations, then a log-softmax over a
# vocabulary of 50257, 2048 rows each, blocks of 4096 (H100, benchmarks/studies/long_rows.py,
# 2026-11-27): rows of 12544 (3 whole blocks) 81 -> 93 us with the tail, 25088 (6) 140 -> 145,
# 50176 (12) 291 -> 268, 50257 (12) 361 -> 321. The partial block's loads wait for the loop's
# to drain, where a masked loop's last step overlaps them: a cost that long loops amortize.
TAIL_BLOCKS = 8
ROWS_ACROSS = 8  # rows a block takes where a row's positions are read across tensor rows (below)
# Rows of 33 to 64 positions that start at odd offsets (Swin's 7x7 windows: 49 positions), in a
# block of 64 positions a row: no vector divides the rows' starts, so each lane loads one
# element, and a block of two warps or more lays a row over two warps. One warp a block, 8 rows:
# H200, bf16, a softmax over 602112 rows of 49 (the copy of its input 32.8 us;
# benchmarks/studies/odd_rows_study.py, 2026-12-02): 16 rows by 2 warps 96.1 us, 8 by 2 103.9,
# 8 by 4 108.0, 8 by 1 warp 54.7, 16 by 1 55.2. Swin-T's first-stage attention softmax as fuse
# fuses it (its relative-position bias gathered, its shifted-window mask added): 193.0 -> 143.1
# us (16 rows by 1 warp: 182.0). Giving each row to one warp's lanes with more warps a block did
# not help (101-186 us), so the row's split alone does not explain it. Rows of 197 (256 a row)
# gained nothing (4 rows by 2 warps 47.3 us, by 1 warp 45.5, 2 rows by 1 warp 51.2), nor rows of
# 9 (101.7 against 103.8): only this block takes it.
UNALIGNED_ROW = 64


def reduction_config(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1,
                     across_rows: bool = False, row_bytes: float = 0, row_vector: int = 0) -> dict[str, int]:
    """Block sizes for a reduction kernel; RBLOCK >= rnumel means persistent (one pass per row).

    ``passes``: how many times a looped kernel reads each row (one per level of dependent
    reductions, one more for full-size outputs); a persistent kernel reads it once.
    ``across_rows``: a row's positions are read at a stride (a tensor read transposed, or
    gathered along another axis) where the next row reads the next element: a block of
    ``ROWS_ACROSS`` rows uses more of each 32-byte sector it loads, from the L1 cache. DeBERTa's
    attention softmax over rows of 512 with its position terms gathered transposed (b16, 12
    heads, bf16, H100, a scratch study, 2026-11-27): 340-400 us at 4-16 rows a block, 1128 at
    32; about 490 us at the 2 rows below (the zoo's profile).
    ``row_bytes``: bytes a kernel reads at each (row, position), over all its inputs (0: not
    known); a looped kernel that reads its rows again takes blocks whose rows in flight fit L2.
    ``row_vector``: the elements a lane can load at once along the largest input's rows (the
    largest power of two, up to 16 bytes, that divides where each row starts; 0: not known). At
    1 (rows of an odd length) see ``UNALIGNED_ROW``.
    """
    r = _next_pow2(max(rnumel, 1))
    if interpreter_blocks():
        # Programs run one after another in Python: big blocks, and rows up to 16K in one block
        # (longer rows take the looped path, which the tests then exercise).
        rblock = min(r, 1 << 14)
        xblock = max(1, min(_next_pow2(max(xnumel, 1)), (1 << 15) // rblock))
        return {"XBLOCK": xblock, "RBLOCK": rblock}
    # Measured on an H200 (benchmarks/studies/sweep.py and hand-written kernels, 2026-11-22/23):
    # - rows of 1024 run best one per program with 2 warps (95.7% of the floor against 89% with
    #   two rows and 4 warps): about 16 to 32 elements per thread;
    # - rows of 8192 in one block: 16 warps is as fast as 8 or faster (softmax 90.5% vs 90.0%);
    # - rows of 8192 read twice (a reduction, then outputs over the row): two loops of 4096 by
    #   16 warps, the second re-reading the row from L2, reach 93.8% on RMS norm against 89%
    #   persistent; softmax (three passes) is faster persistent. Only rows that blocks of 4096
    #   tile exactly loop (a row of 4097 would take a second, almost empty, block per pass);
    # - column sums of 8192x8192 bf16 with 64 columns by 16 rows per step and 4 warps;
    # - short columns (up to 1024) of at most 8192 columns, such as a split's second phase over
    #   its partial sums, in one block each: a loop of 16 rows a step runs its steps one after
    #   another on few programs. 512 x 128 fp32 partials: 8.1 -> 1.9 us; 1024 x 512: 16.7 ->
    #   3.0 us; 256 x 2048: 6.2 -> 2.8 us (benchmarks/studies/short_columns_study.py, 2026-11-23).
    #   More columns of up to 1024 rows too, where the loop's blocks of 64 columns make fewer than
    #   four programs an SM, or where a step of 64 rows holds the whole column (the same programs,
    #   no loop). H200, bf16 in, fp32 sums, us (benchmarks/studies/column_configs_study.py,
    #   2026-11-28): a sum of squares over each channel's positions, channels last, b64 28x28x192
    #   (12288 columns of 784) 14.6 -> 9.9, 14x14x384 6.2 -> 5.8, 7x7x768 4.8 -> 4.3; a LayerNorm
    #   weight's gradient over 4096 rows
    #   of 768 (a split's first phase, 192 programs) 12.6 -> 6.9. With 768 programs or more of
    #   longer columns the loop stays: a bias gradient over 4096 rows of 3072 11.4 against 12.1.
    if not row_contiguous:
        if r <= 1024 and (xnumel <= 8192 or r <= 64 or cdiv(xnumel, 64) < 4 * gpu_shape()[0]):
            xblock = max(16, min(64, 8192 // r))
            return {"XBLOCK": xblock, "RBLOCK": r, "num_warps": 8 if r * xblock >= 8192 else 4}
        return {"XBLOCK": 64, "RBLOCK": min(r, 16), "num_warps": 4}
    if rnumel in (4096, 8192) and passes == 2:
        return {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    if row_vector == 1 and r == UNALIGNED_ROW:
        return {"XBLOCK": max(1, min(_next_pow2(max(xnumel, 1)), 8)), "RBLOCK": r, "num_warps": 1}
    if r <= LONGEST_PERSISTENT_ROW:
        xblock = max(1, min(_next_pow2(max(xnumel, 1)), 1024 // r))
        if across_rows and xnumel >= ROWS_ACROSS * 1024:  # (and still a thousand blocks or more)
            xblock = max(xblock, min(ROWS_ACROSS, 8192 // r))
        warps = max(1, min(16, xblock * r // 512))
        return {"XBLOCK": xblock, "RBLOCK": r, "num_warps": warps}
    if passes >= 2 and row_bytes:
        return _rows_in_l2(rnumel * row_bytes)
    return {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}


def _rows_in_l2(row_bytes: float) -> dict[str, int]:
    """Blocks for a looped reduction that reads each row again in a later pass: that pass finds
    the row in L2 while the rows of the programs in flight fit it. Fewer warps a program (a block
    of 256 elements a warp) put more programs on each SM (64 warps an SM), so more rows in
    flight: the fewest warps whose rows fit, or 16.

    Measured on an H100 (50 MiB of L2, 132 SMs; benchmarks/studies/long_rows.py, 2026-11-27),
    2048 rows of bf16 read twice or three times, us: rows of 12544 (a GroupNorm(32) of 512
    channels of 28x28) 1024 by 4 warps 70, 2048 by 8 69, 4096 by 16 81 (Inductor's two kernels
    61); 25088: 2048 by 8 132, 4096 by 16 140; 50176: 2048 by 8 297, 4096 by 16 268; a
    log-softmax over 50257: 2048 by 8 390, 4096 by 16 321 (by 32 in one block of 16384: 312).
    The rows in flight of the best config take up to 1.1x the L2 (their programs start and end
    at different times, so not every row is whole in L2 at once)."""
    sms, l2_bytes = gpu_shape()
    for warps in (4, 8):
        if sms * (64 // warps) * row_bytes <= 1.1 * l2_bytes:
            return {"XBLOCK": 1, "RBLOCK": 256 * warps, "num_warps": warps}
    return {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}


@functools.lru_cache(maxsize=None)
def gpu_shape(index: int | None = None) -> tuple[int, int]:
    """GPU ``index``'s (default: the current one's) SMs and L2 bytes; an H100's where no GPU is
    visible (kernels generated for a GPU on a machine without one, as the tests do)."""
    if not torch.cuda.is_available():
        return 132, 50 << 20
    props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    return props.multi_processor_count, getattr(props, "L2_cache_size", 0) or 50 << 20


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scan_config(xnumel: int, rnumel: int, row_contiguous: bool) -> dict[str, int]:
    """Block sizes for a scan kernel: RBLOCK >= rnumel scans each row in one block; shorter
    blocks loop along the row, carrying the running total from one block to the next.

    Measured on an H100 (torch 2.11, Triton 3.6, 2026-11-23, do_bench, a few runs), fp32 cumsum:
    blocks of up to 1024 positions, rows packed up to 1024 elements a program: 4096x4096 in 55 to
    74 us (eager 182 us), looping over each row of 4096. A looped row pays a scan and a reduction
    (the carry) per block, one after another, so fewer rows than a GPU has SMs loop in blocks of
    4096 by 16 warps: 16 rows of 262144 in 105 us against 246 us in blocks of 1024 (eager 410 us,
    Inductor 39 to 112 us), 64 rows of 65536 in 73 against 79 us. A scan along a strided dim takes
    32 neighbouring columns (coalesced) by up to 64 positions a step: 4096x4096 along dim 0 in 138
    us (eager 1530 us, Inductor 420 us). Under the interpreter blocks hold at most 32 positions, so
    that tests exercise the loop with small tensors (its scans cost a Python call per element
    either way).
    """
    r = _next_pow2(max(rnumel, 1))
    x = _next_pow2(max(xnumel, 1))
    if interpreter_blocks():
        rblock = min(r, 32)
        return {"XBLOCK": max(1, min(x, 256 // rblock)), "RBLOCK": rblock}
    if not row_contiguous:
        return {"XBLOCK": min(32, x), "RBLOCK": min(r, 64), "num_warps": 4}
    if rnumel > 1024 and xnumel < 128:
        return {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    rblock = min(r, 1024)
    xblock = max(1, min(x, 1024 // rblock))
    return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": max(1, min(8, xblock * rblock // 256))}
