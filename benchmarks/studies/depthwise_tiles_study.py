"""Depthwise convolutions with their batch norm and activation, as fuse's tiled kernel at several
block sizes, against Inductor and eager (cuDNN).

A depthwise convolution of at most ``lowering/convolutions.MAX_DEPTHWISE_TAPS`` positions is a
pointwise node of ours over the channels-last input, tiled rows (positions) by columns
(channels) by ``runtime.column_tile_config``: blocks of 1024 elements with 4 warps where the
kernel reads a window. The zoo's audit gave these kernels 13.6% of their floor in
EfficientNet-B0's step (H200, b64, bf16, 2026-12-01: 975 us of a 2.57 ms step) and 22% in
EfficientNetV2-S's. This study times the same layers alone at other blocks, to tell whether the
blocks or the kernel's form bind it.

Variants (``default`` as fuse chooses; the others change only the window's blocks):

- ``default``: 1024 elements a block, 4 warps;
- ``2048``, ``4096``: 2048 or 4096 elements a block, 4 warps;
- ``2 warps``: 1024 elements, 2 warps; ``8 warps``: 4096 elements, 8 warps;
- ``inductor``; ``eager``.

Each is checked against the module in float32, then timed as 20 calls replayed in one CUDA graph
(the kernels alone), us a call and % of the floor: the input read once and the output written
once over the copy bandwidth measured in the same run.

    PYTHONPATH=. python -m benchmarks.studies.depthwise_tiles_study            # on a GPU
    PYTHONPATH=. python -m benchmarks.studies.depthwise_tiles_study --check    # outputs only, any device
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusebackend  # noqa: E402
from benchmarks.studies.variants import bf16_with_float32_answer, spread_batch_norms, variant_cell  # noqa: E402
from benchmarks.timing import study_parser, study_setup  # noqa: E402
from fusebackend.kernels import runtime  # noqa: E402

# (channels, positions, kernel, stride, activation): EfficientNet-B0's depthwise layers and two of
# MobileNetV3-Large's, at batch 64
CASES = (
    (32, 112, 3, 1, "silu"), (96, 112, 3, 2, "silu"), (144, 56, 3, 1, "silu"), (144, 56, 5, 2, "silu"),
    (240, 28, 5, 1, "silu"), (240, 28, 3, 2, "silu"), (480, 14, 3, 1, "silu"), (672, 14, 5, 1, "silu"),
    (1152, 7, 5, 1, "silu"), (72, 56, 5, 2, "relu"), (200, 14, 3, 1, "hardswish"),
)


class Depthwise(nn.Module):
    def __init__(self, c: int, k: int, stride: int, act: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = {"silu": nn.SiLU(), "relu": nn.ReLU(), "hardswish": nn.Hardswish()}[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


@contextlib.contextmanager
def window_blocks(elements: int, warps: int) -> Iterator[None]:
    """``column_tile_config`` with a window's blocks of ``elements`` and ``warps`` warps."""
    today = runtime.column_tile_config

    def config(rows: int, inner: int, window: int = 1) -> dict[str, int] | None:
        blocks = today(rows, inner, window)
        if blocks is None or window < runtime.WINDOW_TILES or runtime.use_interpreter():
            return blocks
        yblock = math.gcd(rows, max(elements // blocks["XBLOCK"], 1))
        return {**blocks, "YBLOCK": yblock, "num_warps": warps} if yblock >= 4 else blocks

    runtime.column_tile_config = config
    try:
        yield
    finally:
        runtime.column_tile_config = today


def main() -> None:
    args, device, bandwidth = study_setup(study_parser(__doc__))
    gpu, timed = device.type == "cuda", bandwidth > 0
    variants: dict[str, tuple[Any, Callable[[], Any]]] = {
        "eager": (None, contextlib.nullcontext),
        "default": (fusebackend.fuse, contextlib.nullcontext),
        "2048": (fusebackend.fuse, lambda: window_blocks(2048, 4)),
        "4096": (fusebackend.fuse, lambda: window_blocks(4096, 4)),
        "2 warps": (fusebackend.fuse, lambda: window_blocks(1024, 2)),
        "8 warps": (fusebackend.fuse, lambda: window_blocks(4096, 8)),
        "inductor": ("inductor", contextlib.nullcontext),
    }
    if not gpu:
        del variants["inductor"]  # (its CPU kernels are C++, not what the study compares)
    print(f"{'case':30s}" + "".join(f"  {v + ' us (floor)':>20s}" for v in variants))
    for c, h, k, stride, act in CASES if gpu else CASES[:3]:
        n = 64 if gpu else 2
        if not gpu:
            h, c = 8, 16
        torch.manual_seed(0)
        module = Depthwise(c, k, stride, act).to(device).eval()
        spread_batch_norms(module.bn)
        module = module.to(memory_format=torch.channels_last)
        x = torch.randn(n, c, h, h, device=device).contiguous(memory_format=torch.channels_last)
        module, x, want, nbytes = bf16_with_float32_answer(module, x)
        floor_us = nbytes / bandwidth * 1e6 if bandwidth else 0.0
        cells = [variant_cell(variant, backend, context, module, x, want, floor_us, timed, f"{c}x{h}x{h} {k}x{k}")[0]
                 for variant, (backend, context) in variants.items()]
        name = f"b{n} {c}x{h}x{h} {k}x{k} /{stride} {act}"
        print(f"{name:30s}" + "".join(f"  {cell:>20s}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()
