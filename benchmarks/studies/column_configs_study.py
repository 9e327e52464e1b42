"""Column reductions: today's blocks against four others.

A column reduction (its rows lie across memory, one element a row at the column's stride)
gets 64 columns a program and loops over 16 rows a step (``runtime.reduction_config``), except
columns of up to 1024 rows, which sit in one block each where there are at most 8192 columns,
where the loop would make fewer than four programs an SM, or where 64 rows hold the column.
The zoo's audit finds such reductions far from their floor: ConvNeXt V2's GRN sums the squares
of each sample's channels over its positions (b64, channels last, 4x the block's channels: 768
programs of 64 columns by 784 rows at 28x28x768, 1536 of 196 rows at 14x14x1536; 915 us, 28%
of their floor, 17% of the step, H200, 2026-11-28): a program of the loop holds 64 x 16
elements at a time, so the GPU has few bytes in flight. A split column sum's first phase (a
LayerNorm weight's gradient over 4096 rows of 768) made 192 programs under the rule before.

Variants (each a ``runtime.reduction_config`` in place of today's while the kernel is generated):

- ``today``: ``runtime.reduction_config`` as it is;
- ``8192 columns``: the rule before 2026-11-28: one block only where there are at most 8192
  columns (the first run of this study, which took it as today's, led to today's rule);
- ``one block``: columns of up to 1024 rows in one block each, however many columns there are
  (the rule for at most 8192 columns, extended);
- ``64 rows``, ``128 rows``: 64 columns by 64 or 128 rows a step, 8 warps, where today's loops.

Each case is compiled by fuse under each variant, checked against eager (bf16 inputs, fp32
sums), and timed as 20 calls replayed in one CUDA graph (the kernels alone, launches free), in
us a call and % of the floor: the bytes the compiled graph reads and writes over the copy
bandwidth measured in the same run.

    PYTHONPATH=. python -m benchmarks.studies.column_configs_study            # on a GPU
    PYTHONPATH=. python -m benchmarks.studies.column_configs_study --check    # outputs only, any device
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

import torch

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusebackend  # noqa: E402
from benchmarks.timing import graph_replay_us, study_parser, study_setup  # noqa: E402
from fusebackend.kernels import runtime  # noqa: E402

TODAY = runtime.reduction_config


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def at_most_8192(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1, **kw: Any) -> dict[str, int]:
    r = _pow2(rnumel)
    if row_contiguous or r > 1024 or xnumel <= 8192:
        return TODAY(xnumel, rnumel, row_contiguous, passes, **kw)
    return {"XBLOCK": 64, "RBLOCK": min(r, 16), "num_warps": 4}


def one_block(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1, **kw: Any) -> dict[str, int]:
    r = _pow2(rnumel)
    if row_contiguous or r > 1024:
        return TODAY(xnumel, rnumel, row_contiguous, passes, **kw)
    xblock = max(16, min(64, 8192 // r))
    return {"XBLOCK": xblock, "RBLOCK": r, "num_warps": 8 if r * xblock >= 8192 else 4}


def rows_a_step(rows: int, warps: int) -> Callable[..., dict[str, int]]:
    def config(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1, **kw: Any) -> dict[str, int]:
        today = TODAY(xnumel, rnumel, row_contiguous, passes, **kw)
        if row_contiguous or today.get("RBLOCK", 0) >= rnumel:
            return today
        return {"XBLOCK": 64, "RBLOCK": min(_pow2(rnumel), rows), "num_warps": warps}

    return config


VARIANTS: dict[str, Callable[..., dict[str, int]]] = {
    "today": TODAY, "8192 columns": at_most_8192, "one block": one_block,
    "64 rows": rows_a_step(64, 8), "128 rows": rows_a_step(128, 8)}


def cases(small: bool) -> list[tuple[str, Callable[..., torch.Tensor], list[torch.Tensor]]]:
    """(name, function, bf16 inputs); ``small``: shapes for the interpreter."""
    n = 2 if small else 64
    rows = 64 if small else 4096
    out = []
    for h, c in ((56, 384), (28, 768), (14, 1536), (7, 3072)):  # (GRN follows the 4x expansion)
        if small:
            h = max(h // 7, 3)  # (a sum over 2x2 positions would be unrolled: lowering/unrolled.py)
        x = torch.randn(n, h, h, c, dtype=torch.bfloat16)  # ConvNeXt's blocks are channels last

        def grn(x: torch.Tensor) -> torch.Tensor:
            return x.float().pow(2).sum((1, 2), keepdim=True).sqrt()

        out.append((f"GRN sum of squares b{n} {h}x{h}x{c}", grn, [x]))

    def weight_grad(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (g.float() * y.float()).sum(0)

    out.append((f"LayerNorm weight grad {rows}x768", weight_grad,
                [torch.randn(rows, 768, dtype=torch.bfloat16), torch.randn(rows, 768, dtype=torch.bfloat16)]))

    def bias_grad(g: torch.Tensor) -> torch.Tensor:
        return g.float().sum(0)

    out.append((f"bias grad {rows}x3072", bias_grad, [torch.randn(rows, 3072, dtype=torch.bfloat16)]))
    return out


def main() -> None:
    args, device, bandwidth = study_setup(study_parser(__doc__))
    gpu, timed = device.type == "cuda", bandwidth > 0
    print(f"{'case':40s}" + "".join(f"  {v + ' us (floor)':>22s}" for v in VARIANTS))
    for name, fn, inputs in cases(small=not gpu):
        inputs = [t.to(device) for t in inputs]
        want = fn(*inputs)
        floor_us = (sum(t.numel() * t.element_size() for t in inputs) + want.numel() * want.element_size()) / bandwidth * 1e6 \
            if bandwidth else 0.0
        cells, launches = [], []
        for variant in VARIANTS.values():
            runtime.reduction_config = variant  # the kernels are generated at the first call
            try:  # (not taken from fuse's cache, where another variant's blocks would be)
                torch._dynamo.reset()
                compiled = torch.compile(fn, backend=fusebackend.fuse)
                with fusebackend.config.patch(graph_cache=False):
                    got = compiled(*inputs)
                blocks = re.findall(r"# grid \(([^)]*)\), (XBLOCK=.*)", fusebackend.history()[-1].wrapper)
            finally:
                runtime.reduction_config = TODAY
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
            launches.append("; ".join(f"grid ({g}) {b}" for g, b in blocks))
            if timed:
                us = graph_replay_us(lambda: compiled(*inputs))
                cells.append(f"{us:10.2f} ({floor_us / us:4.0%})")
            else:
                cells.append(f"{'ok':>22s}")
        print(f"{name:40s}" + "".join(f"  {c:>22s}" for c in cells), flush=True)
        for variant, launch in zip(VARIANTS, launches):
            print(f"    {variant}: {launch}")


if __name__ == "__main__":
    main()
