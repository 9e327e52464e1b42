"""GPU: what a convolution costs the host per call, and depthwise convolutions beside cuDNN's.

    PYTHONPATH=. python -m benchmarks.studies.conv_study [--part calls|depthwise|both]

``calls``: the host time of one call of ``torch.convolution`` against ``torch.mm`` on the same
1x1 products (MobileNetV3's, EfficientNet's and ResNet-50's shapes, b64, bf16, channels-last),
with each one's GPU time: 100 calls queued behind a sleeping GPU (``torch.cuda._sleep``), so the
host's wall time over them is its own work; the median of 5 rounds. An eager ``sigmoid`` gives
the floor of one ATen call. Both forms' outputs are compared.

``depthwise``: a depthwise convolution with its batch norm and activation, as a module, in eager
(cuDNN), Inductor and fuse: ``do_bench`` medians, and each one's error against the module in
fp32. These figures chose ``lowering/convolutions.MAX_DEPTHWISE_TAPS``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn as nn

import fusebackend

BF16 = torch.bfloat16

ONE_BY_ONE = [  # (N, C, H, O, source)
    (64, 72, 1, 24, "MobileNetV3 SE"), (64, 120, 1, 32, "MobileNetV3 SE"), (64, 480, 1, 120, "MobileNetV3 SE"),
    (64, 960, 1, 240, "MobileNetV3 SE"), (64, 240, 1, 960, "MobileNetV3 SE"), (64, 1152, 1, 48, "EfficientNet SE"),
    (64, 16, 112, 64, "MobileNetV3"), (64, 72, 28, 40, "MobileNetV3"), (64, 160, 7, 960, "MobileNetV3"),
    (64, 16, 112, 96, "EfficientNet"), (64, 320, 7, 1280, "EfficientNet"),
    (64, 64, 56, 256, "ResNet-50"), (64, 512, 28, 128, "ResNet-50"), (64, 1024, 14, 512, "ResNet-50"),
    (64, 2048, 7, 512, "ResNet-50"),
]

DEPTHWISE = [  # (N, C, H, kernel, stride, activation)
    (64, 16, 112, 3, 1, "relu"), (64, 64, 112, 3, 2, "relu"), (64, 72, 56, 5, 2, "relu"), (64, 120, 28, 5, 1, "relu"),
    (64, 240, 28, 3, 2, "hardswish"), (64, 200, 14, 3, 1, "hardswish"), (64, 480, 14, 3, 1, "hardswish"),
    (64, 672, 14, 5, 2, "hardswish"), (64, 960, 7, 5, 1, "hardswish"),
    (64, 96, 56, 7, 1, "none"), (64, 384, 14, 7, 1, "none"), (64, 768, 7, 7, 1, "none"),
]


def host_us(fn: Callable[[], Any], calls: int = 100, rounds: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        torch.cuda._sleep(100_000_000)  # tens of ms: the calls queue behind it
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(samples)


def gpu_us(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return do_bench(fn) * 1e3


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def calls() -> None:
    print(f"{'1x1 product':44s} {'conv host us':>12s} {'conv GPU us':>11s} {'mm host us':>10s} {'mm GPU us':>9s} "
          "max rel diff")
    for n, c, h, o, source in ONE_BY_ONE:
        x = channels_last(torch.randn(n, c, h, h, device="cuda", dtype=BF16))
        w = channels_last(torch.randn(o, c, 1, 1, device="cuda", dtype=BF16))
        conv = lambda: torch.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)  # noqa: E731
        rows, weight = x.permute(0, 2, 3, 1).reshape(n * h * h, c), w.view(o, c)
        mm = lambda: torch.mm(rows, weight.t())  # noqa: E731
        a = conv().permute(0, 2, 3, 1).reshape(n * h * h, o).float()
        b = mm().float()
        diff = ((a - b).abs().max() / a.abs().max()).item()
        print(f"{source + f' {n}x{c}x{h}x{h}->{o}':44s} {host_us(conv):12.1f} {gpu_us(conv):11.1f} "
              f"{host_us(mm):10.1f} {gpu_us(mm):9.1f} {diff:.1e}")
    x = torch.randn(64, 1000, device="cuda", dtype=BF16)
    print(f"{'eager sigmoid (one ATen call)':44s} {host_us(x.sigmoid):12.1f} {gpu_us(x.sigmoid):11.1f}")


class Depthwise(nn.Module):
    def __init__(self, c: int, k: int, stride: int, act: str) -> None:
        super().__init__()
        self.plain = act == "none"
        self.conv = nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=self.plain)
        self.bn = nn.BatchNorm2d(c)
        self.act = {"relu": nn.ReLU(), "hardswish": nn.Hardswish(), "none": nn.Identity()}[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) if self.plain else self.act(self.bn(self.conv(x)))


def depthwise() -> None:
    print(f"{'depthwise (+ batch norm, activation)':38s} {'eager us':>9s} {'Inductor us':>11s} {'fuse us':>8s}  "
          "rel error e / i / f  fuse's ATen calls")
    for n, c, h, k, stride, act in DEPTHWISE:
        torch.manual_seed(0)
        module = Depthwise(c, k, stride, act).to("cuda").eval().to(memory_format=torch.channels_last)
        x = channels_last(torch.randn(n, c, h, h, device="cuda", dtype=BF16))
        with torch.no_grad():
            reference = module(x.float())
            module = module.to(BF16)
            torch._dynamo.reset()
            inductor = torch.compile(module)
            inductor(x)
            torch._dynamo.reset()
            fusebackend.metrics.reset()
            fuse = torch.compile(module, backend=fusebackend.fuse)
            fuse(x)
            aten = dict(fusebackend.metrics.fallbacks)
            scale = reference.abs().max().item()
            errors = [(f(x).float() - reference).abs().max().item() / scale for f in (module, inductor, fuse)]
            times = [gpu_us(lambda f=f: f(x)) for f in (module, inductor, fuse)]
        name = f"{n}x{c}x{h}x{h} {k}x{k} stride {stride} {act}"
        print(f"{name:38s} {times[0]:9.1f} {times[1]:11.1f} {times[2]:8.1f}  "
              f"{errors[0]:.1e} / {errors[1]:.1e} / {errors[2]:.1e}  {aten}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.conv_study", description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="both", choices=("calls", "depthwise", "both"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("conv_study times GPU calls: it needs a CUDA device")
    if args.part in ("calls", "both"):
        calls()
    if args.part in ("depthwise", "both"):
        depthwise()


if __name__ == "__main__":
    main()
