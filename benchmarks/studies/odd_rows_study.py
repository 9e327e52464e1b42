"""Softmax over short rows of an odd length (Swin's 7x7 windows: rows of 49), by block shape.

Rows whose length no vector divides start at odd offsets, so a lane of a block [rows, RBLOCK]
loads one element at a time. ``runtime.reduction_config`` gives rows of 33 to 64 such positions
8 rows a block by one warp (``UNALIGNED_ROW``); other short rows 1024 elements a block by 2 warps
or more. This study times hand-written softmax kernels over 602112 rows of 49 positions' worth of
bf16 elements, for rows of 49, 197, 9 and (aligned, for comparison) 64, 100 and 144 positions:
the [rows, RBLOCK] block as fuse generates it under several rows a block and warps, and a block
[RBLOCK / 32, rows, 32] that gives each row to the 32 lanes of one warp whatever the warps. Each
variant is checked against ``torch.softmax`` in float32 first; times are ``do_bench`` medians.

Measured on an H200 (torch 2.11, Triton 3.6, 2026-12-02; these kernels in a scratch copy of this
script, run before it landed), us (the copy of the input 32.8-36.6):
- rows of 49: 16 rows by 2 warps (the config before) 96.1; 8 by 1 warp 54.7, 16 by 1 55.2, 32 by
  1 85.4, 4 by 1 95.1; 8 by 2 103.9, 8 by 4 108.0; the warp-a-row block 101-186 with 2-8 warps
  (so a row laid over two warps is not the whole story: blocks of more than one warp lose here
  either way); eager 84.2.
- rows of 197: 4 by 2 warps (the config) 47.3; 4 by 1 45.5, 2 by 1 51.2; the warp-a-row block
  79-118; eager 60.5.
- rows of 9: 64 by 2 warps (the config) 101.7, 32 by 1 103.8; eager 148.0.
- aligned rows (vectors of 8 or 4 elements): 64 at 16 by 2 warps 33.2 (the copy 33.6), 100 at 8
  by 2 41.5, 144 at 4 by 2 46.0: the number of warps moves them by under 10%.

    PYTHONPATH=. python -m benchmarks.studies.odd_rows_study            # on a GPU
    PYTHONPATH=. python -m benchmarks.studies.odd_rows_study --check    # outputs only, any device
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.timing import study_parser, study_setup  # noqa: E402

LENGTHS = (49, 197, 9, 64, 100, 144)
ELEMENTS = 602112 * 49  # Swin-T's first-stage attention scores at b64
# (rows a block, warps) for the [rows, RBLOCK] block, and for the warp-a-row block
ROW_BLOCKS = ((2, 1), (4, 1), (8, 1), (16, 1), (32, 1), (4, 2), (8, 2), (16, 2), (8, 4))
WARP_ROW_BLOCKS = ((2, 2), (4, 2), (8, 2), (4, 4), (8, 4), (16, 4), (16, 8), (32, 8))


@triton.jit
def softmax_rows(x, y, rows, N: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    row = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    col = tl.arange(0, RBLOCK)[None, :]
    mask = (col < N) & (row < rows)
    v = tl.load(x + row * N + col, mask, other=float("-inf")).to(tl.float32)
    e = tl.where(mask, tl.exp(v - tl.max(v, 1, keep_dims=True)), 0.0)
    tl.store(y + row * N + col, (e / tl.sum(e, 1, keep_dims=True)).to(y.dtype.element_ty), mask)


@triton.jit
def softmax_warp_rows(x, y, rows, N: tl.constexpr, XBLOCK: tl.constexpr, H: tl.constexpr):
    # a row's 32 * H positions as [H, 1, 32]: a warp's 32 lanes along the row, H in registers
    h = tl.arange(0, H)[:, None, None]
    row = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[None, :, None]
    col = h * 32 + tl.arange(0, 32)[None, None, :]
    mask = (col < N) & (row < rows)
    v = tl.load(x + row * N + col, mask, other=float("-inf")).to(tl.float32)
    top = tl.max(tl.max(v, 2, keep_dims=True), 0, keep_dims=True)
    e = tl.where(mask, tl.exp(v - top), 0.0)
    total = tl.sum(tl.sum(e, 2, keep_dims=True), 0, keep_dims=True)
    tl.store(y + row * N + col, (e / total).to(y.dtype.element_ty), mask)


def variants(x: torch.Tensor, y: torch.Tensor) -> dict[str, Callable[[], Any]]:
    rows, n = x.shape
    block = triton.next_power_of_2(n)
    out: dict[str, Callable[[], Any]] = {}
    for xb, warps in ROW_BLOCKS:
        out[f"{xb} rows by {warps} warps"] = (
            lambda xb=xb, warps=warps: softmax_rows[(triton.cdiv(rows, xb),)](x, y, rows, n, xb, block, num_warps=warps))
    if block >= 32:
        for xb, warps in WARP_ROW_BLOCKS:
            out[f"{xb} rows by {warps} warps, a warp a row"] = (
                lambda xb=xb, warps=warps: softmax_warp_rows[(triton.cdiv(rows, xb),)](x, y, rows, n, xb, block // 32,
                                                                                         num_warps=warps))
    return out


def main() -> None:
    args, device, _ = study_setup(study_parser(__doc__))
    timed = device.type == "cuda" and not args.check
    scale = 1 if timed else 4096  # the interpreter: a few hundred rows
    for n in LENGTHS:
        torch.manual_seed(0)
        x = torch.randn(ELEMENTS // n // scale, n, device=device, dtype=torch.bfloat16)
        expected = torch.softmax(x.float(), -1)
        print(f"rows of {n} ({x.shape[0]} rows)")
        results = {}
        for label, run in variants(x, y := torch.empty_like(x)).items():
            y.zero_()
            run()
            error = (y.float() - expected).abs().max().item()
            assert error < 1e-2, (n, label, error)
            us = triton.testing.do_bench(run, warmup=25, rep=100) * 1e3 if timed else None
            results[label] = (error, us)
        if timed:
            copy = torch.empty_like(x)
            results["copy of the input"] = (0.0, triton.testing.do_bench(lambda: copy.copy_(x), warmup=25, rep=100) * 1e3)
            results["eager softmax"] = (0.0, triton.testing.do_bench(lambda: torch.softmax(x, -1), warmup=25, rep=100) * 1e3)
        for label, (error, us) in results.items():
            print(f"  {label:34s} " + (f"{us:8.1f} us" if us is not None else f"ok, error {error:.1e}"))


if __name__ == "__main__":
    main()
