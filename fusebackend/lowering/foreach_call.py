"""The ``fusebackend::foreach_lists`` op at run time: the tables a call's kernel reads, kept while
its lists' sizes and addresses stay, and one launch. The kernels and the op's schema are made by
``foreach_lists.py`` (a run of an optimizer's ``_foreach_*`` calls in a graph, one kernel).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch

from fusebackend.kernels import wrapper_calls
from fusebackend.lowering.foreach_lists import _LIBRARY, CALL, KERNEL_NAME

BLOCK = 1024  # elements a program takes (one block of one tensor)

_blocks: dict[tuple[torch.device, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor, Any]] = {}
_tables: dict[tuple[torch.device, tuple[int, ...]], tuple[torch.Tensor, Any]] = {}
_launchers: dict[tuple[str, int, bool], Any] = {}  # (source, n, aligned) -> its runtime.Launcher
_TABLES_KEPT = 16  # pointer tables kept (a step's lists keep their memory from one step to the next)
_captured: list[Any] = []  # the host tables whose copies a captured CUDA graph replays: kept for good


def _fill(out: torch.Tensor, values: list[int]) -> Any:
    """Writes ``values`` into ``out``; returns what must live as long as the copy is read. On a
    GPU, copied from pinned host memory without a wait: allowed while a CUDA graph is captured
    (the graph then copies the same values at each replay, from the host tensor kept with it)."""
    host = torch.tensor(values, dtype=out.dtype, device="cpu")  # (CUDA graph trees set a default device)
    if out.device.type != "cuda":
        out.copy_(host)
        return None
    host = host.pin_memory()
    out.copy_(host, non_blocking=True)
    return host


def _on_device(values: list[int], device: torch.device, dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, Any]:
    """``values`` in a tensor on ``device``, and what must live as long as it is read."""
    out = torch.empty(len(values), dtype=dtype, device=device)
    return out, _fill(out, values)


def _pointer_table(tensors: list[torch.Tensor], pointers: tuple[int, ...],
                   device: torch.device) -> tuple[torch.Tensor, Any, bool]:
    """The lists' table: each tensor's address as its distance from the table's own in elements of
    its dtype (the kernel adds it to the table's pointer, whose alignment Triton knows, so that
    the alignment of the tensors' addresses can be told to it: a pointer loaded from memory has
    none); what keeps its host copy; whether every tensor that is not a scalar lies at a multiple
    of 16 bytes (the kernel's ``ALIGNED``)."""
    out = torch.empty(len(pointers), dtype=torch.int64, device=device)
    base = out.data_ptr()
    values = []
    for tensor, pointer in zip(tensors, pointers):
        step, rest = divmod(pointer - base, tensor.element_size())
        if rest:
            raise RuntimeError(f"foreach_lists: a tensor at {pointer:#x} is not aligned to its {tensor.dtype}")
        values.append(step)
    aligned = all(pointer % 16 == 0 for tensor, pointer in zip(tensors, pointers) if tensor.dim())
    return out, _fill(out, values), aligned


def _block_tables(device: torch.device, sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Each block's (tensor, first element), each tensor's size, and what keeps their host copies."""
    starts = [x for k, size in enumerate(sizes) for first in range(0, size, BLOCK) for x in (k, first)]
    table, keep = _on_device(starts, device)
    numels, keep_numels = _on_device(list(sizes), device)
    return table, numels, (keep, keep_numels)


def _trees_warming_up(device: torch.device) -> bool:
    """Whether CUDA graph trees are warming a graph up on ``device``: its CUDA allocations then go
    to the graph's private pool, which may hold nothing beyond the graph's own tensors (the trees
    check it). Asked only when a table must be made (the trees' lookup takes a lock)."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    manager = trees.get_manager(device.index, create_if_none_exists=False) if trees is not None else None
    return manager is not None and bool(manager.in_warmup)


_numel, _data_ptr = torch.Tensor.numel, torch.Tensor.data_ptr


@torch.library.impl(_LIBRARY, "foreach_lists", "CompositeExplicitAutograd")
def _foreach_lists(source: str, n: int, written: list[torch.Tensor], read: list[torch.Tensor]) -> None:
    """The call: the lists' blocks and pointers (kept while the sizes and the addresses stay),
    and one launch. The wrapper calls this function itself (``wrapper_calls.PYTHON_IMPLS``)."""
    from fusebackend.kernels import runtime

    device = written[0].device
    sizes = tuple(map(_numel, written[:n]))
    pointers = tuple(map(_data_ptr, written + read))
    # a captured graph takes tables of its own (the cache may free or evict its tables before a
    # replay); a call in a graph's pool (captured, or warmed up by the trees) makes them for
    # itself alone, and keeps none
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    blocks = None if capturing else _blocks.get((device, sizes))
    entry = None if capturing else _tables.get((device, pointers))
    if blocks is None or entry is None:
        alone = capturing or (device.type == "cuda" and _trees_warming_up(device))
        if blocks is None:
            blocks = _block_tables(device, sizes)
            if not alone:
                _blocks[(device, sizes)] = blocks
        if entry is None:
            entry = _pointer_table(written + read, pointers, device)
            if not alone:
                if len(_tables) >= _TABLES_KEPT:
                    _tables.pop(next(iter(_tables)))
                _tables[(device, pointers)] = entry
        if capturing:  # replays copy from these host tensors
            _captured.append((blocks[2], entry[1]))
    # one launcher per (source, n, aligned): Triton specializes the int N (1, a multiple of 16),
    # and the launcher's direct path reuses the first call's compiled kernel
    aligned = entry[2]
    launcher = _launchers.get((source, n, aligned))
    if launcher is None:
        launcher = _launchers[(source, n, aligned)] = runtime.Launcher(
            runtime.load_kernel(KERNEL_NAME, source), None, {"BLOCK": BLOCK, "ALIGNED": aligned})
    if device.type != "cuda":
        launcher(None, blocks[0].numel() // 2, entry[0], blocks[0], blocks[1], n)
        return
    with contextlib.nullcontext() if device.index == torch._C._cuda_getDevice() else torch.cuda.device(device):
        launcher(runtime.current_stream(), blocks[0].numel() // 2, entry[0], blocks[0], blocks[1], n)


wrapper_calls.PYTHON_IMPLS[CALL] = _foreach_lists


@torch.library.impl(_LIBRARY, "foreach_lists", "Meta")
def _foreach_lists_meta(source: str, n: int, written: list[torch.Tensor], read: list[torch.Tensor]) -> None:
    return None
