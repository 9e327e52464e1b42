"""Weight-only int8 products of one row: where the time of a dequantizing reduction goes.

A decode step at batch 1 over weights stored as int8 with a scale per output channel
(``benchmarks.generate --weights int8``: ``w_int8.to(bf16) * scale`` then the product) reads half
the bytes of bf16 weights, but its reductions convert every weight: int8 to float, times the
scale, rounded to bf16 as eager rounds the dequantized weight, times the row. This study times
hand-written Triton kernels of that reduction (the layout fuse generates: one row of K whole in a
program, ``XBLOCK`` output channels a program) that convert the weights in different ways, and a
bf16-weight kernel of the same layout, at Llama 3.2 1B's shapes:

- ``casts``: int8 -> fp32 -> bf16 -> fp32, times the scale, rounded to bf16 (fuse's code as
  generated on 2026-11-28: a cast and the rounding of the value it produced);
- ``exact``: int8 -> fp32 (exact: every int8 is a bf16), times the scale, rounded;
- ``bits``: int8 -> fp32 by integer operations (``(q + 128) | 0x4B000000`` read as a float, less
  2**23 + 128), times the scale, rounded;
- ``scale_after``: no rounding of the dequantized weight; the sum of the row times int8 values,
  then times the scale once (not eager's rounding: within bf16's tolerance, not equal);
- ``to_bf16``: int8 -> bf16 directly, times the scale, rounded;
- ``bits_scale_after``: both.

Measured on an H100 (torch 2.11, Triton 3.6, 2026-11-28, one row, one output channel a program
by 4 warps; the variants in the order above), us: gate and up projections (16384 x 2048) 20.1,
22.4, 23.0, 18.1, 20.6, 20.6, bf16 weights 28.9; the LM head (128256 x 2048) 117.8, 137.2, 138.0,
95.2, 116.9, 116.8, bf16 182.6; the down projection (2048 x 8192) 41.6 (once; 13.1-17.1 at other
launch shapes), 15.2, 12.9, 13.0, 12.4, 13.1, bf16 18.9. The int8
kernels read half the bytes of the bf16 ones and take 0.55-0.84 of their time: the conversions,
not the memory, set it. ``python -m benchmarks.studies.int8_rows`` (a GPU; ``--check`` on a CPU
checks the variants but ``to_bf16`` against a float64 product in Triton's interpreter, at small
sizes, as ``tests/test_benchmark_check.py`` does).
"""

from __future__ import annotations

import argparse
import os

import torch

VARIANTS = ("casts", "exact", "bits", "scale_after", "to_bf16", "bits_scale_after")
SHAPES = ((16384, 2048), (128256, 2048), (2048, 8192))  # gate+up, LM head, down projection


def _kernels():  # built on first use: the interpreter must be chosen before Triton decorates them
    import triton
    import triton.language as tl

    @triton.jit
    def int8_rows(x_ptr, w_ptr, s_ptr, out_ptr, K: tl.constexpr, XBLOCK: tl.constexpr, MODE: tl.constexpr):
        rows = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        k = tl.arange(0, K)[None, :]
        x = tl.load(x_ptr + k).to(tl.float32)
        q = tl.load(w_ptr + (k + K * rows), eviction_policy="evict_first")
        scale = tl.load(s_ptr + rows).to(tl.float32)
        if MODE == 0:
            w = q.to(tl.float32).to(tl.bfloat16).to(tl.float32).to(tl.bfloat16).to(tl.float32)
        elif MODE == 1 or MODE == 3:
            w = q.to(tl.float32)
        elif MODE == 2 or MODE == 5:
            w = ((q.to(tl.int32) + 128) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
        else:
            w = q.to(tl.bfloat16).to(tl.float32)
        if MODE == 3 or MODE == 5:
            acc = tl.sum(x * w, 1)[:, None] * scale
        else:
            acc = tl.sum(x * (w * scale).to(tl.bfloat16).to(tl.float32), 1)[:, None]
        tl.store(out_ptr + rows, acc.to(tl.bfloat16))

    @triton.jit
    def bf16_rows(x_ptr, w_ptr, out_ptr, K: tl.constexpr, XBLOCK: tl.constexpr):
        rows = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        k = tl.arange(0, K)[None, :]
        x = tl.load(x_ptr + k).to(tl.float32)
        w = tl.load(w_ptr + (k + K * rows), eviction_policy="evict_first").to(tl.float32)
        tl.store(out_ptr + rows, tl.sum(x * w, 1)[:, None].to(tl.bfloat16))

    return int8_rows, bf16_rows


_MODE = {"casts": 0, "exact": 1, "bits": 2, "scale_after": 3, "to_bf16": 4, "bits_scale_after": 5}


def run_variant(variant: str, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, warps: int = 4) -> torch.Tensor:
    """``x @ (q * scale).T`` for one row ``x``, by the kernel of ``variant``."""
    int8_rows, _ = _kernels()
    out = torch.empty(q.shape[0], dtype=torch.bfloat16, device=x.device)
    launch = {} if x.device.type == "cpu" else {"num_warps": warps}
    int8_rows[(q.shape[0],)](x, q, scale, out, K=q.shape[1], XBLOCK=1, MODE=_MODE[variant], **launch)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check every variant (CPU: Triton's interpreter)")
    args = parser.parse_args(argv)
    if args.check and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = ((24, 64), (8, 256)) if device.type == "cpu" else SHAPES
    torch.manual_seed(0)
    for n, k in shapes:
        x = torch.randn(1, k, dtype=torch.bfloat16, device=device)
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=device)
        scale = (torch.rand(n, device=device) / 50).to(torch.bfloat16)
        want = (x.double() @ (q.double() * scale.double()[:, None]).t()).flatten()
        for variant in VARIANTS:
            if variant == "to_bf16" and device.type == "cpu":
                continue  # Triton's interpreter casts int8 to bf16 wrong (NaNs); the GPU does not
            got = run_variant(variant, x, q, scale).double()
            error = float((got - want).abs().max() / want.abs().max())
            line = f"N{n} K{k} {variant:18s} error {error:.1e}"
            if device.type == "cuda" and not args.check:
                from triton.testing import do_bench

                us = do_bench(lambda: run_variant(variant, x, q, scale), warmup=25, rep=100) * 1e3
                line += f"  {us:8.1f} us  {n * k / us / 1e3:6.0f} GB/s of int8"
            print(line, flush=True)
        if device.type == "cuda" and not args.check:
            from triton.testing import do_bench

            _, bf16_rows = _kernels()
            w = (q.to(torch.bfloat16) * scale[:, None]).contiguous()
            out = torch.empty(n, dtype=torch.bfloat16, device=device)
            us = do_bench(lambda: bf16_rows[(n,)](x, w, out, K=k, XBLOCK=1, num_warps=4), warmup=25, rep=100) * 1e3
            print(f"N{n} K{k} bf16 weights        {us:8.1f} us  {2 * n * k / us / 1e3:6.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
