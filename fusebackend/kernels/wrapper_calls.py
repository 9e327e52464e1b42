"""What a generated wrapper calls besides its kernels: allocators, strided views of buffers,
ATen ops through PyTorch's Python bindings, and the check of an ATen result's layout.

The wrapper imports these by name (``codegen/wrapper.py``); the kernels' launches and streams are
``runtime.py``'s.
"""

from __future__ import annotations

from typing import Any

import torch

from fusebackend import metrics


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


# ATen ops the wrapper calls through PyTorch's Python bindings (``torch.convolution``...) rather
# than through the OpOverload: the same native function, reached by PyTorch's C++ argument parser
# instead of the TorchScript schema matcher. Host time per call on an H200 machine's host (torch
# 2.11, 2026-11-24, launches queued behind a busy GPU): a 1x1 convolution of ResNet-50 31.9 us
# through ``torch.ops.aten.convolution.default``, 15.0 us through ``torch.convolution``; a 3x3
# one 44.6 against 24.8 us. Only the ``default`` overloads of ops whose binding takes the schema's
# arguments in the schema's order, names and defaults (one native function, no Python-only
# signature ahead of it) and returns what the schema says; ``tests/test_codegen_choices.py`` runs
# each against its OpOverload. Not the flash and cuDNN attention kernels: their bindings return
# the ``SymInt`` results (the longest sequences) as tensors, which their backward ops refuse.
PYTHON_BINDINGS = (
    "convolution", "mm", "addmm", "bmm", "baddbmm",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
)


# fusebackend's own ops (``torch.library``) whose wrapper call is their Python function itself:
# the dispatcher would turn each list of tensors into C++ values and back (an optimizer step's
# list call passes 700 tensors). Filled by the op's module (lowering/foreach_lists.py).
PYTHON_IMPLS: dict[Any, Any] = {}


def aten_call(op: Any) -> Any:
    """What the wrapper calls for the ATen op ``op``: its Python binding where it is in
    ``PYTHON_BINDINGS`` and this torch has it, fusebackend's own function where it is in
    ``PYTHON_IMPLS``, else the OpOverload itself."""
    if op in PYTHON_IMPLS:
        return PYTHON_IMPLS[op]
    name = getattr(op, "_overloadname", None)
    packet = op.overloadpacket.__name__ if name is not None else None
    if name == "default" and op.namespace == "aten" and packet in PYTHON_BINDINGS:
        binding = getattr(torch._C._VariableFunctions, packet, None)
        if binding is not None:
            return binding
    return op


def expect_layout(t: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    """An extern's result in the layout its meta function promised (copied if it differs).

    Generated kernels index buffers with the strides known at compile time; an ATen kernel whose
    real output strides differ from its meta function would otherwise be read wrongly. The
    wrapper compares the strides itself and calls this only where they differ.
    """
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(f"extern returned shape {tuple(t.shape)}, expected {tuple(size)}")
    if t.stride() == tuple(stride) or t.numel() <= 1:
        return t
    if all(a == b for n, a, b in zip(size, t.stride(), stride) if n != 1):
        # the same elements at the same places: a dim of size 1 is never stepped along (cuDNN
        # returns [N, C, 1, 1] results contiguous where the graph declared them channels-last)
        return t
    metrics.layout_copies += 1
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
