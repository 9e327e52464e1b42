"""Every option of fusebackend, in one place.

Each field is typed and backed by exactly one ``FUSE_*`` environment variable, read once when this
module is imported. Nothing else in the package reads the environment. ``config.patch(...)``
overrides fields for the duration of a ``with`` block (tests and benchmarks use it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator


def _env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if raw in (None, "") else int(raw)


def _env_symbolic() -> str:
    raw = os.environ.get("FUSE_SYMBOLIC", "auto").lower()
    value = {"1": "on", "0": "off", "": "auto"}.get(raw, raw)
    if value not in ("auto", "on", "off"):
        raise ValueError(f"FUSE_SYMBOLIC={raw!r}: auto, on (1) or off (0)")
    return value


def _env_interpret() -> bool | None:
    raw = os.environ.get("FUSE_INTERPRET", "auto").lower()
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no"):
        return False
    return None  # decided from the machine: no CUDA device -> interpreter


@dataclasses.dataclass
class Config:
    # FUSE_DUMP_DIR: when set, every compiled graph writes a folder of dumps under it.
    dump_dir: str = dataclasses.field(default_factory=lambda: _env_str("FUSE_DUMP_DIR", ""))
    # FUSE_CACHE_DIR: where compiled graphs and generated kernel modules are written (Triton
    # imports kernels from files); ``python -m fusebackend.cache`` shows and clears it.
    cache_dir: str = dataclasses.field(
        default_factory=lambda: _env_str(
            "FUSE_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "fusebackend")
        )
    )
    # FUSE_GRAPH_CACHE: 0 turns off the on-disk cache of compiled graphs (``cache.py``): every
    # process lowers, schedules and generates each graph anew.
    graph_cache: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_GRAPH_CACHE", 1) != 0)
    # FUSE_COMPILE_THREADS: threads that compile a loaded graph's kernels to binaries at once
    # (``runtime.precompile``); 0 or 1 compiles each kernel at its first launch instead.
    compile_threads: int = dataclasses.field(
        default_factory=lambda: _env_int("FUSE_COMPILE_THREADS", min(16, os.cpu_count() or 1))
    )
    # FUSE_INTERPRET: 1 runs kernels through Triton's interpreter on CPU tensors, 0 on the GPU,
    # auto (default) picks the interpreter when torch sees no CUDA device or TRITON_INTERPRET=1.
    interpret: bool | None = dataclasses.field(default_factory=_env_interpret)
    # FUSE_GPU_BLOCKS: 1 gives kernels that run in Triton's interpreter the launch configs a GPU's
    # would take (its blocks and warps: ``runtime.interpreter_blocks``), so that the CPU runs the
    # code that only a GPU's blocks reach. Slow: small blocks make many programs, each a Python loop.
    gpu_blocks: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_GPU_BLOCKS", 0) != 0)
    # FUSE_SPECIALIZATION_WARNING: warn once when one graph has been compiled for this many input
    # shapes (a graph with symbolic sizes is compiled once per shape: ``metrics.specialized``);
    # 0 never warns.
    specialization_warning: int = dataclasses.field(
        default_factory=lambda: _env_int("FUSE_SPECIALIZATION_WARNING", 8)
    )
    # FUSE_SYMBOLIC: how a graph whose sizes Dynamo made symbolic is compiled (see
    # ``symbolic.py``, ``sizevars.py``). "auto" (the default): once for all of its sizes, where
    # fuse can and where its kernels are those a compile for the first call's sizes would make
    # (not where that compile would split a reduction, or lower into kernels an op that the
    # compile for every size leaves to ATen: ``sizevars.decline``); "on" (or 1): once for all sizes wherever fuse can;
    # "off" (or 0): once per shape. Where a graph is compiled per shape, ``metrics.not_symbolic``
    # says why.
    symbolic: str = dataclasses.field(default_factory=lambda: _env_symbolic())
    # FUSE_MAX_FUSION_SIZE: most IR nodes one kernel may hold.
    max_fusion_size: int = dataclasses.field(
        default_factory=lambda: _env_int("FUSE_MAX_FUSION_SIZE", 64)
    )
    # FUSE_FUSION: 0 turns fusion off (one kernel per node), for comparisons and debugging.
    fusion: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_FUSION", 1) != 0)
    # FUSE_PDL: 1 turns on programmatic dependent launch (a kernel that follows another of its
    # graph's kernels is launched before that one ends and waits for it on the GPU; compute
    # capability 9.0 and later). Off by default until measured on whole models: see
    # ``runtime.use_pdl``.
    pdl: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_PDL", 0) != 0)
    # FUSE_CONV_LAYOUT: the memory format of 2-d convolutions' inputs (lowering/layouts.py):
    # "auto" makes them channels-last on a GPU, where cuDNN's fast kernels want it; "channels_last"
    # does so on every device; "keep" leaves every tensor in the layout eager gives it.
    conv_layout: str = dataclasses.field(default_factory=lambda: _env_str("FUSE_CONV_LAYOUT", "auto"))
    # FUSE_GROUPED_CONV1D: grouped 1-d convolutions of many taps (lowering/convolutions.py,
    # ``gemm_taps``): "auto" makes them batched products over gathered windows on a GPU, where
    # cuDNN's kernels for them are slow; "gemm" does so on every device and at any tap count (for
    # the tests on the CPU); "cudnn" leaves every one to ATen.
    grouped_conv1d: str = dataclasses.field(default_factory=lambda: _env_str("FUSE_GROUPED_CONV1D", "auto"))
    # FUSE_PAD_MM: matrix products whose output rows are not 16-byte aligned (lowering/matmuls.py):
    # "auto" pads them on a GPU in half precision where the product is large; "always" pads every
    # one (any device, dtype, size); "never" leaves them to cuBLAS as they are.
    pad_mm: str = dataclasses.field(default_factory=lambda: _env_str("FUSE_PAD_MM", "auto"))
    # FUSE_PRODUCT_EPILOGUES: a product whose output only a ReLU or a tanh-approximated GELU reads
    # (an MLP's) as one call to cuBLASLt with that epilogue, ``aten._addmm_activation``
    # (lowering/product_epilogues.py): "auto" on a GPU in half precision; "always" on every device
    # and dtype (for the tests); "never" leaves them as traced. Zoo, H200, 2026-11-28: GPU time a
    # step 4-7% lower on GPT-2, OPT and Phi inference (benchmarks/RESULTS.md).
    product_epilogues: str = dataclasses.field(default_factory=lambda: _env_str("FUSE_PRODUCT_EPILOGUES", "auto"))
    # FUSE_ROW_PRODUCTS: matrix products of at most this many rows (a decode step's, whose M is
    # the batch) generated as sum reductions over K, their casts and epilogues fused
    # (lowering/matmuls.py, ``_row_product``); 0 leaves every product to cuBLAS. 1 by default:
    # a batch-1 decode step of Llama 3.2 1B shapes took 1.28 ms against 1.70 with cuBLAS's
    # products (H100, 2026-11-28); at 4 and 16 rows it reads the weight once a row and loses (the
    # 2048x8192 down projection 50 and 182 us against cuBLAS's 23, H100, 2026-11-27).
    row_products: int = dataclasses.field(default_factory=lambda: _env_int("FUSE_ROW_PRODUCTS", 1))
    # FUSE_COLUMN_PRODUCTS: 1 generates matrix products of one column (a matrix times a vector,
    # mm, addmm and bmm) as sum reductions over K, fused with what makes and reads them
    # (lowering/matmuls.py, ``_column_product``); 0 leaves them to cuBLAS.
    column_products: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_COLUMN_PRODUCTS", 1) != 0)
    # FUSE_FOREACH_LISTS: 1 generates each run of foreach calls left whole (an optimizer step over
    # more than foreach.MAX_TENSORS tensors) as one kernel over every tensor of the lists
    # (lowering/foreach_lists.py); 0 leaves them ATen calls, in place where they can be.
    foreach_lists: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_FOREACH_LISTS", 1) != 0)
    # FUSE_COLUMN_TILES: 0 keeps pointwise kernels that read per-channel values of channels-last
    # tensors flat (codegen/pointwise.py, ``column_tile``), for comparisons.
    column_tiles: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_COLUMN_TILES", 1) != 0)
    # FUSE_PRODUCT_TEMPLATES: matrix products (mm, addmm, bmm) as generated Triton kernels that take
    # their pointwise epilogues (lowering/matmuls.py, codegen/product.py): auto (under
    # mode="max-autotune" in Triton's interpreter; on a GPU the library's call stays until a timed
    # choice between the two is made), always, never.
    product_templates: str = dataclasses.field(default_factory=lambda: _env_str("FUSE_PRODUCT_TEMPLATES", "auto"))
    # FUSE_UNROLLED_REDUCTION: the most positions a reduction unrolls into a pointwise node
    # (lowering/unrolled.py); 1 unrolls none.
    unrolled_reduction: int = dataclasses.field(default_factory=lambda: _env_int("FUSE_UNROLLED_REDUCTION", 8))
    # FUSE_REUSE_BUFFERS: 0 allocates every kernel output new, where the wrapper's memory plan
    # would hand it the memory of a buffer that died before it, or of the input its kernel
    # reads for the last time (codegen/memory.py).
    reuse_buffers: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_REUSE_BUFFERS", 1) != 0)
    # FUSE_CHECK_KERNELS: 1 compiles graphs that, on every call, compare each buffer a kernel or
    # ATen call stores with the value eager computes for the same ATen node, and record the
    # comparisons (``fusebackend.checking``). Slow: for finding the first wrong kernel.
    check_kernels: bool = dataclasses.field(default_factory=lambda: _env_int("FUSE_CHECK_KERNELS", 0) != 0)

    @contextlib.contextmanager
    def patch(self, **overrides: Any) -> Iterator[None]:
        """Override fields inside a ``with`` block; unknown names raise."""
        saved = {}
        for key, value in overrides.items():
            if not hasattr(self, key):
                raise AttributeError(f"fusebackend.config has no option {key!r}")
            saved[key] = getattr(self, key)
            setattr(self, key, value)
        try:
            yield
        finally:
            for key, value in saved.items():
                setattr(self, key, value)


config = Config()


def use_interpreter() -> bool:
    """Whether generated kernels run in Triton's interpreter (on CPU tensors).

    FUSE_INTERPRET decides when set; on auto, a TRITON_INTERPRET=1 environment or a machine
    without a CUDA device means the interpreter. Kernels are decorated in that mode whenever
    Triton was imported (``kernels/runtime.py``), so no import order is required.
    """
    if config.interpret is not None:
        return config.interpret
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return True
    import torch

    return not torch.cuda.is_available()


@contextlib.contextmanager
def environment_kept(name: str) -> Iterator[None]:
    """Leave environment variable ``name`` as it was on entry, whatever the block sets (Triton's
    knobs write the variables they stand for)."""
    before = os.environ.get(name)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
