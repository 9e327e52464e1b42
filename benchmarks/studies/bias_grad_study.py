"""GPU: a convolution's bias gradient, a sum over every dim but the channels of a channels-last
gradient, split into chunks of how many positions.

A channels-last gradient [N, C, H, W] summed over N, H and W is a column sum of an [N*H*W, C]
matrix: few columns (the channels), short columns (the positions). ``builder.split_count``
splits a column sum into chunks of at least ``builder.COLUMN_CHUNK`` positions (phase 1 sums each
chunk, phase 2 the chunks' partial sums); with 320 channels (five blocks of 64 columns) of 8192
positions that is 160 programs, too few to fill an H100. Here each case is compiled with the
chunk at several lengths and timed (``do_bench``, median, L2 flushed) against its floor (its
bytes over the copy bandwidth measured in the same run) and Inductor:

- ``sum``: the sum alone;
- ``clone_sum``: the sum beside a copy of the gradient (the kernels Stable Diffusion's UNet's
  training step has, a copy for a later reader stored by the sum's phase 1).

Shapes: the UNet's (b2; 320, 640 and 1280 channels at 64x64, 32x32 and 16x16) and its VAE
decoder's largest (b2, 128 channels at 256x256), bf16.

Measured (H100, torch 2.11, Triton 3.6, 2026-11-28, one run): these kernels move 1.3 to 5 MiB
and take 6 to 18 us, bound by their latency, not their bytes; shorter chunks gave 18.0 -> 13.8
us (clone_sum, 320 channels) but 6.1 -> 10.0 us (1280 channels, which then split), and the
largest case reached 98-99% of its floor at every length. Inductor's kernels for the same
functions took 10-48 us (a few runs of 120-180 us, fuse's too, were outliers of that run). The
default stays 256.

    PYTHONPATH=. python -m benchmarks.studies.bias_grad_study [--chunks 256,128,64]
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import torch
import triton

import fusebackend
from benchmarks.zoo import audit
from fusebackend.lowering import builder

SHAPES = ((2, 320, 64, 64), (2, 640, 32, 32), (2, 1280, 16, 16), (2, 128, 256, 256))


def _sum(g: torch.Tensor) -> torch.Tensor:
    return g.sum((0, 2, 3))


def _clone_sum(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return g.clone(memory_format=torch.channels_last) * 2, g.sum((0, 2, 3))


CASES: dict[str, tuple[Callable[..., Any], int]] = {"sum": (_sum, 1), "clone_sum": (_clone_sum, 3)}


def _fuse(fn: Callable[..., Any], g: torch.Tensor, chunk: int | None) -> tuple[Callable[..., Any], int]:
    """fuse's compiled ``fn`` with column chunks of ``chunk`` positions (None: the default), and
    its kernel count."""
    saved = builder.COLUMN_CHUNK
    builder.COLUMN_CHUNK = saved if chunk is None else chunk
    try:
        torch._dynamo.reset()
        fusebackend.dump.clear()
        with fusebackend.config.patch(graph_cache=False):
            compiled = torch.compile(fn, backend=fusebackend.fuse)
            compiled(g)
    finally:
        builder.COLUMN_CHUNK = saved
    return compiled, sum(a.kernel_count for a in fusebackend.history())


def _check(out: Any, expected: Any) -> None:
    outs = out if isinstance(out, tuple) else (out,)
    wanted = expected if isinstance(expected, tuple) else (expected,)
    for a, e in zip(outs, wanted):
        torch.testing.assert_close(a.float(), e.float(), atol=0.5, rtol=2e-2)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.bias_grad_study")
    parser.add_argument("--chunks", default="256,128,64,32")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    bandwidth = audit.copy_bandwidth(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}, "
          f"copy {bandwidth / 1e9:.0f} GB/s; default chunk {builder.COLUMN_CHUNK}")
    for shape in SHAPES:
        torch.manual_seed(0)
        g = torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        for name, (fn, passes) in CASES.items():
            expected = fn(g)
            floor_us = passes * g.numel() * g.element_size() / bandwidth * 1e6
            rows: list[tuple[str, float]] = []
            torch._dynamo.reset()
            inductor = torch.compile(fn)
            _check(inductor(g), expected)
            rows.append(("inductor", 1e3 * triton.testing.do_bench(lambda: inductor(g), return_mode="median")))
            for chunk in chunks:
                compiled, kernels = _fuse(fn, g, chunk)
                _check(compiled(g), expected)
                us = 1e3 * triton.testing.do_bench(lambda: compiled(g), return_mode="median")
                rows.append((f"fuse, chunks of {chunk} ({kernels} kernels)", us))
            print(f"\n{name} {shape}: floor {floor_us:.1f} us")
            for label, us in rows:
                print(f"  {us:8.1f} us  {floor_us / us:4.0%} of floor  {label}")


if __name__ == "__main__":
    main()
