"""GPU: grouped 1-d convolutions as cuDNN calls against fuse's batched products over gathered
windows (``lowering/convolutions.py``, ``gemm_taps``), by the number of taps.

Each case is a ``Conv1d`` of ``groups`` groups with padding of half its taps (wav2vec 2.0's
positional convolution is 768 channels in 16 groups, 128 taps, over b8 x 499 frames), timed
forward alone (inference) and forward and backward (``do_bench``, median, ms): eager (cuDNN),
fuse with ``FUSE_GROUPED_CONV1D=cudnn`` (the convolution an ATen call) and fuse with ``gemm``
(products at any tap count). Each compiled output is checked against eager first. The rule
``MIN_GEMM_TAPS`` takes the products from the tap count where they win.

    PYTHONPATH=. python -m benchmarks.studies.grouped_conv1d_study [--taps 8,16,32,64,128]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import triton

import fusebackend


def _case(channels: int, groups: int, taps: int, batch: int, frames: int, mode: str, train: bool) -> float:
    torch.manual_seed(0)
    conv = nn.Conv1d(channels, channels, taps, padding=taps // 2, groups=groups).cuda().bfloat16()
    x = torch.randn(batch, channels, frames, device="cuda", dtype=torch.bfloat16, requires_grad=train)
    fn = conv
    if mode != "eager":
        torch._dynamo.reset()
        with fusebackend.config.patch(grouped_conv1d=mode):
            fn = torch.compile(conv, backend=fusebackend.fuse)
            expected = conv(x)
            got = fn(x)
        torch.testing.assert_close(got, expected, atol=0.05, rtol=0.05)
    grad = torch.randn_like(conv(x))

    def step() -> None:
        if train:
            fn(x).backward(grad)
        else:
            with torch.no_grad():
                fn(x)

    with fusebackend.config.patch(grouped_conv1d=mode if mode != "eager" else "auto"):
        step()
        return triton.testing.do_bench(step, rep=100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--taps", default="8,16,32,64,128")
    parser.add_argument("--shapes", default="768x16x8x499,512x8x8x1000")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}, bf16, ms")
    print("| channels x groups, batch x frames | taps | step | eager (cuDNN) | fuse, cuDNN | fuse, products |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        channels, groups, batch, frames = map(int, shape.split("x"))
        for taps in map(int, args.taps.split(",")):
            for train in (False, True):
                times = [_case(channels, groups, taps, batch, frames, mode, train) for mode in ("eager", "cudnn", "gemm")]
                print(f"| {channels} x {groups}, {batch} x {frames} | {taps} | {'fwd+bwd' if train else 'fwd'} | "
                      + " | ".join(f"{t:.3f}" for t in times) + " |", flush=True)


if __name__ == "__main__":
    main()
