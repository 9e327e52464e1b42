"""Buffers and the strided views of them that loads read: the floor under ``expr.py`` and ``ir.py``.

A ``Load`` (``expr.py``) reads a ``View``; IR nodes (``ir.py``) write ``Buffer``s. Both modules
import these from here (``ir`` re-exports them: ``ir.Buffer``, ``ir.View``), so that ``expr`` need
not import ``ir``, which imports ``expr``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from fusebackend import sizevars


def dtype_name(dtype: torch.dtype) -> str:
    return {
        torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
        torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
        torch.uint8: "u8", torch.bool: "b1",
    }.get(dtype, str(dtype).replace("torch.", ""))


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A named allocation: a graph input, a node's output, or an extern's output."""

    name: str
    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    @functools.cached_property
    def numel(self) -> int:  # found once: the cost model asks at every candidate fusion
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def whole(self) -> "View":
        return View(self, self.sizes, self.strides, 0)

    def __str__(self) -> str:
        return f"{self.name}: {dtype_name(self.dtype)}{list(self.sizes)} strides {list(self.strides)}"


@dataclasses.dataclass(frozen=True)
class View:
    """A strided window over a buffer's storage (offset in elements from the buffer's start)."""

    buffer: Buffer
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def dtype(self) -> torch.dtype:
        return self.buffer.dtype

    @functools.cached_property
    def numel(self) -> int:  # found once: the cost model asks at every candidate fusion
        return math.prod(self.sizes)

    def is_whole(self) -> bool:
        b = self.buffer
        return self.offset == 0 and self.sizes == b.sizes and self.strides == b.strides

    def distinct_elements(self) -> int:
        """Elements of storage this view touches (broadcast dims count once)."""
        n = math.prod(s for s, st in zip(self.sizes, self.strides) if st != 0)
        # with symbolic sizes, at the hints: a figure for the cost model (sizevars.size_hint)
        return min(sizevars.size_hint(n), sizevars.size_hint(self.buffer.numel)) if self.numel else 0

    def __str__(self) -> str:
        if self.is_whole():
            return self.buffer.name
        return (
            f"{self.buffer.name}.view({list(self.sizes)}, strides={list(self.strides)},"
            f" offset={self.offset})"
        )
