"""Runtime for generated code: load kernel modules, choose launch configs, run wrappers.

Triton compiles a ``@triton.jit`` function from its source file, so every generated kernel is
written to ``<cache_dir>/kernels/<name>_<hash>.py`` (atomically: a temporary file renamed into
place) and imported from there. Loaded kernels are kept in memory by the hash of their source,
so a kernel shared by two graphs or two shape specializations is loaded and compiled once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import math
import os
import sys
import tempfile
import types
from typing import Any, Iterator

import torch

from fusebackend import metrics
from fusebackend.config import config, use_interpreter

_loaded: dict[str, Any] = {}


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def _write_atomic(path: str, text: str) -> None:
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


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
        metrics.cache_hits += 1
        return _loaded[key]
    folder = os.path.join(config.cache_dir, "kernels")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{key}.py")
    _write_atomic(path, source)
    spec = importlib.util.spec_from_file_location(f"fusebackend_generated.{key}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    with _decorating():
        spec.loader.exec_module(module)
    if shared:
        _loaded[key] = module
    return module


def load_kernel(name: str, source: str) -> Any:
    return getattr(load_module(source, name), name)


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

    A direct launch is one Python frame: each tensor's address read once (the alignment check
    uses it, and the C launcher takes it as is: given a tensor, it would call ``data_ptr()``
    again and ask the driver whether the address is a device pointer, for every pointer of
    every launch), the launch hooks looked at, the current stream, the C call.
    """

    def __init__(self, kernel: Any, grid: int, launch: dict[str, int]) -> None:
        self.kernel = kernel
        self.grid = (grid, 1, 1)
        self.launch = launch
        self.constexprs = tuple(v for k, v in launch.items() if k not in COMPILE_OPTIONS)
        self.direct: DirectLaunch | None = None
        # positions of the tensor arguments 16-byte aligned when Triton specialized, and the others
        self.aligned: tuple[int, ...] = ()
        self.unaligned: tuple[int, ...] = ()

    def __call__(self, *args: Any) -> None:
        direct = self.direct
        if direct is not None:
            addresses = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
            for i in self.aligned:
                if addresses[i] & 15:
                    break
            else:
                if not self.unaligned or all(addresses[i] & 15 for i in self.unaligned):
                    hooks = direct.hooks
                    enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
                    if direct.launch is not None and (enter is None or not getattr(enter, "calls", True)) and (
                            leave is None or not getattr(leave, "calls", True)):
                        direct.launch(*direct.grid, _current_stream(),
                                      *direct.head, *addresses, *self.constexprs)
                    else:  # a profiler's hooks, or a launcher of another kind: Triton's path
                        direct.runner(*args, *self.constexprs)
                    return
        if self.launch.get("debug") and use_interpreter():
            with _interpreter_asserts():
                self.kernel[self.grid](*args, **self.launch)
            return
        compiled = self.kernel[self.grid](*args, **self.launch)
        if not use_interpreter() and hasattr(compiled, "__getitem__"):
            pointers = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            self.aligned = tuple(i for i in pointers if args[i].data_ptr() % 16 == 0)
            self.unaligned = tuple(i for i in pointers if args[i].data_ptr() % 16 != 0)
            self.direct = direct_launch(compiled, self.grid)


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


def _current_stream() -> int:
    """The current CUDA device's current stream (the launch goes to the current device's context)."""
    return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())


@dataclasses.dataclass(frozen=True)
class DirectLaunch:
    """What a direct launch of a compiled kernel needs (``direct_launch``)."""

    runner: Any  # Triton's ``compiled[grid]``: takes the tensors, calls the hooks
    launch: Any  # the C launcher's ``launch``; None: always the runner
    head: tuple[Any, ...]  # its arguments between the stream and the kernel's own
    grid: tuple[int, int, int]
    hooks: Any  # triton.knobs.runtime: its launch hooks are looked at on every launch


def direct_launch(compiled: Any, grid: tuple[int, int, int]) -> DirectLaunch:
    """How to launch ``compiled`` from its C launcher directly.

    The launcher (``Launcher.__call__``) passes the kernel's runtime arguments with each tensor
    replaced by its address, then the constexprs (the compiled kernel takes every parameter). Triton's
    ``compiled[grid]`` looks up the device, the stream, the launch hooks and the kernel's
    scratch sizes on every call, in Python, before its C launcher. Where the launcher is the one
    this was written against (Triton 3.6's ``CudaLauncher``, whose ``__call__`` takes
    ``(gridX, gridY, gridZ, stream, function, *args)`` and needs no scratch memory for our
    kernels), its C ``launch`` is called directly, with the addresses: 4.4 us a launch of eight
    pointers on an H200 host, against 5.8 us given the tensors and 14.9 us through
    ``kernel[grid](...)`` (2026-11-23). Anything else takes ``compiled[grid]`` with the tensors.
    """
    runner = compiled[grid]  # also loads the kernel and its launcher
    launcher = getattr(compiled, "run", None)
    launch = getattr(launcher, "launch", None)
    try:
        params = list(inspect.signature(type(launcher).__call__).parameters)
    except (TypeError, ValueError):
        params = []
    known = params == ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]
    import triton

    if (launch is None or not known or getattr(launcher, "global_scratch_size", 1)
            or getattr(launcher, "profile_scratch_size", 1)):
        return DirectLaunch(runner, None, (), grid, triton.knobs.runtime)

    head = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
            compiled.packed_metadata, None, None, None)
    return DirectLaunch(runner, launch, head, grid, triton.knobs.runtime)


def pointwise_config(numel: int, itemsize: int = 2) -> dict[str, int]:
    """Block size and warps for a flat kernel over ``numel`` elements.

    ``itemsize``: the widest element the kernel loads or stores, in bytes.
    """
    if use_interpreter():
        # The interpreter runs each program in Python: few, large blocks are fastest.
        return {"XBLOCK": min(_next_pow2(numel), 1 << 16)}
    # Measured on an H200 (benchmarks/sweep.py): 32 bytes of each tensor per thread. bf16 in
    # blocks of 2048 by 4 warps reached 100% of the copy floor on batch-norm + relu (1024: 87%,
    # 2026-11-22); fp32 in blocks of 1024 by 4 warps 99.8% on silu(a) * b + 1 (2048: 98.8%,
    # 2026-11-23).
    block = min(_next_pow2(numel), 4096 // max(itemsize, 1))
    return {"XBLOCK": block, "num_warps": 4 if block >= 512 else max(1, block // 128)}


def tile_config(ysize: int, inner: int) -> dict[str, int]:
    """Blocks for a tiled (transposing) pointwise kernel over ``ysize`` by ``inner`` elements.

    Each block divides its extent (the largest power of two up to 64 that does), so the kernel
    needs no masks; the caller keeps the flat kernel when either block is under 8.
    """
    blocks = {"XBLOCK": math.gcd(inner, 64), "YBLOCK": math.gcd(ysize, 64)}
    if use_interpreter():
        return blocks
    return {**blocks, "num_warps": 4}


def reduction_config(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1) -> dict[str, int]:
    """Block sizes for a reduction kernel; RBLOCK >= rnumel means persistent (one pass per row).

    ``passes``: how many times a looped kernel reads each row (one per level of dependent
    reductions, one more for full-size outputs); a persistent kernel reads it once.
    """
    r = _next_pow2(max(rnumel, 1))
    if use_interpreter():
        # Programs run one after another in Python: big blocks, and rows up to 16K in one block
        # (longer rows take the looped path, which the tests then exercise).
        rblock = min(r, 1 << 14)
        xblock = max(1, min(_next_pow2(max(xnumel, 1)), (1 << 15) // rblock))
        return {"XBLOCK": xblock, "RBLOCK": rblock}
    # Measured on an H200 (benchmarks/sweep.py and hand-written kernels, 2026-11-22/23):
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
    #   3.0 us; 256 x 2048: 6.2 -> 2.8 us (benchmarks/short_columns_study.py, 2026-11-23).
    if not row_contiguous:
        if r <= 1024 and xnumel <= 8192:
            xblock = max(16, min(64, 8192 // r))
            return {"XBLOCK": xblock, "RBLOCK": r, "num_warps": 8 if r * xblock >= 8192 else 4}
        return {"XBLOCK": 64, "RBLOCK": min(r, 16), "num_warps": 4}
    if rnumel in (4096, 8192) and passes == 2:
        return {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    if r <= 8192:
        xblock = max(1, min(_next_pow2(max(xnumel, 1)), 1024 // r))
        warps = max(1, min(16, xblock * r // 512))
        return {"XBLOCK": xblock, "RBLOCK": r, "num_warps": warps}
    return {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def allocators(device: torch.device) -> tuple[Any, Any]:
    """(fast, general) functions ``(size, stride, dtype) -> tensor`` for buffers on ``device``.

    ``fast`` (CUDA only, where this torch has it) allocates on the *current* CUDA device without
    going through the dispatcher: about 2.6 us against 4.5 us for ``torch.empty_strided`` on an
    H200 host (2026-11-23), and a training step allocates dozens of buffers. The wrapper uses it
    only while the current device is ``device``; None where there is none.
    """
    def general(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    fast = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    fast = getattr(fast, "_empty_strided_cuda", None) if device.type == "cuda" else None
    return fast, general


def on_device(index: int | None) -> bool:
    """Whether the current CUDA device is ``index`` (the fast allocator's device)."""
    return index is not None and torch._C._cuda_getDevice() == index


def _view(t: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> torch.Tensor:
    return t.as_strided(size, stride, t.storage_offset() + offset)


_GUARDS = getattr(getattr(torch._C, "_dynamo", None), "guards", None)

# view(t, size, stride, offset): a strided view of ``t``'s storage, ``offset`` counted from ``t``'s
# first element. Where torch has it, the C++ function Inductor's wrappers use (no autograd
# history, which a wrapper run by AOTAutograd never needs): 0.55 us against 1.3 us for
# ``as_strided`` from Python on the development machine (2026-11-24).
view = getattr(_GUARDS, "_reinterpret_tensor", None) or _view


def expect_layout(t: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    """An extern's result in the layout its meta function promised (copied if it differs).

    Generated kernels index buffers with the strides known at compile time; an ATen kernel whose
    real output strides differ from its meta function would otherwise be read wrongly.
    """
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(f"extern returned shape {tuple(t.shape)}, expected {tuple(size)}")
    if t.stride() == tuple(stride) or t.numel() <= 1:
        return t
    if all(a == b for n, a, b in zip(size, t.stride(), stride) if n != 1):
        # the same elements at the same places: a dim of size 1 is never stepped along (cuDNN
        # returns [N, C, 1, 1] results contiguous where the graph declared them channels-last)
        return t
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


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
    if use_interpreter():
        rblock = min(r, 32)
        return {"XBLOCK": max(1, min(x, 256 // rblock)), "RBLOCK": rblock}
    if not row_contiguous:
        return {"XBLOCK": min(32, x), "RBLOCK": min(r, 64), "num_warps": 4}
    if rnumel > 1024 and xnumel < 128:
        return {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    rblock = min(r, 1024)
    xblock = max(1, min(x, 1024 // rblock))
    return {"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": max(1, min(8, xblock * rblock // 256))}
