"""Depthwise convolutions after a zero pad (TensorFlow's "same" padding, as transformers'
MobileNetV2 and EfficientNet write it): the batch norm and ReLU6 before the pad kept apart
from the window, or evaluated again at each of its taps.

The window rule (``cost_model.window_recompute``) weighs the instructions a window adds by
evaluating its producer at each position. A pad has a few more elements than the activation it
pads, and the rule counted only tensors of at least the pad's size as varying with it, so it
found the batch norm and activation free to evaluate 9 times (``cost_model._one_to_one``: a
tensor with more than half a node's elements now varies with it). torchvision's layers, whose
convolutions pad themselves, were already kept apart (H200, 2026-12-01: MobileNetV3-L's GPU
step 1.65 -> 1.55 ms).

Variants:

- ``default``: as fuse generates it (the activation stored, the window reading it);
- ``at each tap``: the rule before (``ONE_TO_ONE`` = 1: the pad hides its producer), the
  activation evaluated at each of the window's positions;
- ``inductor``; ``eager``.

Each is checked against the module in float32, then timed as 20 calls replayed in one CUDA
graph (the kernels alone), us a call and % of the floor: the input read once and the output
written once over the copy bandwidth measured in the same run.

On an H200 (torch 2.11.0+cu130, Triton 3.6.0, 2026-12-03; copy bandwidth 4243-4247 GB/s), us a
call (% of the floor); "default" at code 6e4994f and at bcc9d22 (a flat window kernel in blocks of
512, ``runtime.WINDOW_BLOCK``) and at 2a3f871 (a zero pad's where over its masked load
dropped), "at each tap" at bcc9d22; kernels default / at each tap:

| case (b64, 3x3) | eager | default 6e4994f | default bcc9d22 | default 2a3f871 | at each tap | inductor | kernels |
|---|---|---|---|---|---|---|---|
| 32x112x112 /1 | 493.7 (5%) | 192.3 (13%) | 136.8 (18%) | 117.5 (21%) | 198.8 (12%) | 132.7 (18%) | 2 / 1 |
| 96x112x112 /2 | 744.7 (6%) | 235.0 (19%) | 137.8 (33%) | 137.7 (33%) | 137.7 (33%) | 235.3 (19%) | 1 / 1 |
| 144x56x56 /1 | 583.3 (5%) | 217.5 (13%) | 157.8 (17%) | 136.4 (20%) | 225.9 (12%) | 152.5 (18%) | 3 / 2 |
| 144x56x56 /2 | 304.6 (6%) | 58.5 (29%) | 56.5 (30%) | 56.5 (30%) | 56.6 (30%) | 98.8 (17%) | 2 / 2 |
| 384x14x14 /1 | 114.1 (4%) | 37.1 (12%) | 31.1 (15%) | 25.8 (18%) | 41.2 (11%) | 35.8 (13%) | 3 / 2 |
| 960x7x7 /1 | 135.7 (2%) | 37.6 (8%) | 26.0 (11%) | 25.1 (11%) | 33.1 (9%) | 31.7 (9%) | 3 / 2 |

(eager and Inductor from bcc9d22's run; 6e4994f's gave eager within 0.3% and Inductor 130.3,
233.7, 156.0, 101.1, 34.7 and 29.0.) Keeping the activation apart is as fast or faster in every
case; with the window's blocks, fuse was within 4% of Inductor at 32x112x112 and 144x56x56 and
ahead in the other four; without the pad's where, it is ahead in all six (Inductor 130.1 and
153.8 in 2a3f871's run).

    PYTHONPATH=. python -m benchmarks.studies.padded_window_study            # on a GPU
    PYTHONPATH=. python -m benchmarks.studies.padded_window_study --check    # outputs only, any device
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusebackend  # noqa: E402
from benchmarks.studies.variants import bf16_with_float32_answer, spread_batch_norms, variant_cell  # noqa: E402
from benchmarks.timing import study_parser, study_setup  # noqa: E402
from fusebackend.scheduler import cost_model  # noqa: E402

# (channels, positions, stride, pad (left, right, top, bottom)): transformers' MobileNetV2's
# depthwise layers at batch 64 (stride 2 pads one position at the right and the bottom)
CASES = (
    (32, 112, 1, (1, 1, 1, 1)), (96, 112, 2, (0, 1, 0, 1)), (144, 56, 1, (1, 1, 1, 1)),
    (144, 56, 2, (0, 1, 0, 1)), (384, 14, 1, (1, 1, 1, 1)), (960, 7, 1, (1, 1, 1, 1)),
)


class PaddedDepthwise(nn.Module):
    """Batch norm and ReLU6 over a 1x1 convolution's output, a zero pad, a 3x3 depthwise
    convolution without padding of its own, batch norm and ReLU6."""

    def __init__(self, c: int, stride: int, pad: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.pad = pad
        self.bn1, self.bn2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        self.conv = nn.Conv2d(c, c, 3, stride, 0, groups=c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(F.relu6(self.bn1(x)), self.pad)
        return F.relu6(self.bn2(self.conv(y)))


@contextlib.contextmanager
def one_to_one(ratio: float) -> Iterator[None]:
    today = cost_model.ONE_TO_ONE
    cost_model.ONE_TO_ONE = ratio
    try:
        yield
    finally:
        cost_model.ONE_TO_ONE = today


def main() -> None:
    args, device, bandwidth = study_setup(study_parser(__doc__))
    gpu, timed = device.type == "cuda", bandwidth > 0
    variants: dict[str, tuple[Any, Callable[[], Any]]] = {
        "eager": (None, contextlib.nullcontext),
        "default": (fusebackend.fuse, contextlib.nullcontext),
        "at each tap": (fusebackend.fuse, lambda: one_to_one(1)),
        "inductor": ("inductor", contextlib.nullcontext),
    }
    if not gpu:
        del variants["inductor"]  # (its CPU kernels are C++, not what the study compares)
    print(f"{'case':34s}" + "".join(f"  {v + ' us (floor)':>20s}" for v in variants) + "  kernels d / t")
    for c, h, stride, pad in CASES if gpu else CASES[:2]:
        n = 64 if gpu else 2
        if not gpu:
            h, c = 9, 8
        torch.manual_seed(0)
        module = PaddedDepthwise(c, stride, pad).to(device).eval()
        spread_batch_norms(module.bn1, module.bn2)
        module, x, want, nbytes = bf16_with_float32_answer(module, torch.randn(n, c, h, h, device=device))
        floor_us = nbytes / bandwidth * 1e6 if bandwidth else 0.0
        cells: list[str] = []
        kernels: list[int] = []
        for variant, (backend, context) in variants.items():
            cell, count = variant_cell(variant, backend, context, module, x, want, floor_us, timed,
                                       f"{c}x{h}x{h} /{stride}")
            cells.append(cell)
            if count is not None:
                kernels.append(count)
        name = f"b{n} {c}x{h}x{h} 3x3 /{stride} pad {pad}"
        print(f"{name:34s}" + "".join(f"  {cell:>20s}" for cell in cells) + f"  {kernels[0]} / {kernels[1]}",
              flush=True)


if __name__ == "__main__":
    main()
