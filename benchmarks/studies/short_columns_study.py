"""Short columns, few of them: the second phase of a split column reduction, under two configs.

A split column reduction (batch norm's statistics over N*H*W rows, a bias gradient) leaves
partial sums of shape (chunks, columns), e.g. 512 x 128 in fp32, and its second phase sums them
over the chunks. ``runtime.reduction_config`` gives such a reduction one block per column block
(``RBLOCK`` = the column's length, ``XBLOCK`` 16 to 64): this study times that against the loop
of 16 rows a step (64 columns a program) that column reductions use otherwise. The partial sums
are in L2, as after the first phase; each variant runs 20 times in one CUDA graph, so launches
cost nothing, and is checked against ``torch.sum`` first.

Measured on an H200 (torch 2.11, Triton 3.6, 2026-11-23), us per call, loop / one block:
512 x 128: 8.14 / 1.87; 512 x 256: 8.92 / 2.28; 512 x 64: 9.22 / 2.12; 1024 x 512: 16.72 /
3.01; 256 x 2048: 6.24 / 2.84; 64 x 4096: 2.67 / 2.23; 8 x 8192 (the same config either way):
1.81 / 1.82. A scratch version of this script, run once before, gave the same within 0.4 us
where it ran the same config, and also tried 8 and 32 columns a block: 8 was level with 16 on
512 rows and faster on 1024 x 512 (2.5 against 3.0 us); 32 was slower on columns of 512 or
more.

    PYTHONPATH=. python -m benchmarks.studies.short_columns_study            # on a GPU
    PYTHONPATH=. python -m benchmarks.studies.short_columns_study --check    # outputs only, any device
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusebackend  # noqa: E402
from benchmarks.timing import graph_replay_us  # noqa: E402
from fusebackend.kernels import runtime  # noqa: E402

SHAPES = [(512, 128), (512, 256), (512, 64), (1024, 512), (256, 2048), (64, 4096), (8, 8192)]
CONFIG = runtime.reduction_config  # today's, before any patch below


def looped(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1, **kw: Any) -> dict[str, int]:
    """The config column reductions had before: 64 columns a program, 16 rows a step."""
    config = CONFIG(xnumel, rnumel, row_contiguous, passes, **kw)
    if row_contiguous or runtime.use_interpreter():
        return config
    return {"XBLOCK": 64, "RBLOCK": min(1 << max(rnumel - 1, 0).bit_length(), 16), "num_warps": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="check outputs only (no timing)")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not fusebackend.use_interpreter()
    device = "cuda" if gpu else "cpu"
    print(f"{'partials':>12s}  {'loop us':>8s}  {'one block us':>12s}")
    for rows, cols in SHAPES:
        p = torch.randn(rows, cols, device=device)
        times = []
        for config in (looped, CONFIG):
            runtime.reduction_config = config  # the kernel is generated at the first call
            try:
                torch._dynamo.reset()
                fn = torch.compile(lambda t: t.sum(0), backend=fusebackend.fuse)
                out = fn(p)
            finally:
                runtime.reduction_config = CONFIG
            torch.testing.assert_close(out, p.sum(0), rtol=1e-4, atol=1e-3)
            times.append(graph_replay_us(lambda: fn(p)) if gpu and not args.check else float("nan"))
        print(f"{rows:5d} x {cols:5d}  {times[0]:8.2f}  {times[1]:12.2f}", flush=True)


if __name__ == "__main__":
    main()
