"""Where a case's time goes on the GPU: its timed step under ``torch.profiler``, kernel by kernel.

For each case and variant: build the step, run it twice (compiles, warm-up), then profile
``--steps`` calls and print the GPU kernels by total device time per step, with the sum over all
kernels. Kernel names tell fuse's (``fused_pw*``/``fused_red*``), Inductor's (``triton_*``) and
ATen's apart, so the table shows what a slower variant spends its extra time on.

With ``--host``, also the host (Python) side: the wall time per step against the kernel time (a
step whose wall time exceeds its kernel time is bound by launching, not by the GPU), and the
Python functions that take the most time, from ``cProfile``.

    PYTHONPATH=. python -m benchmarks.profile --cases transformer.train,convnet.forward
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections import defaultdict
from typing import Any, Sequence

import torch

from benchmarks import harness, memory_bound, models_bench


def kernel_times(step: Any, inputs: tuple[Any, ...], steps: int) -> dict[str, tuple[int, float]]:
    """Kernel name -> (launches per step, device microseconds per step)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(*inputs)
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[event.name]
            entry[0] += 1
            entry[1] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    return {name: (int(n) // steps, us / steps) for name, (n, us) in totals.items()}


def host_profile(step: Any, inputs: tuple[Any, ...], steps: int, top: int) -> None:
    """Wall time per step (synchronized) and the hottest Python functions over ``steps`` calls."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(*inputs)
    torch.cuda.synchronize()
    print(f"  wall {1e3 * (time.perf_counter() - start) / steps:.3f} ms per step (synchronized at the end)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step(*inputs)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    lines = [ln for ln in text.getvalue().splitlines() if ln.strip()]
    start_at = next((k for k, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    print(f"  python, {steps} steps, by own time:")
    for ln in lines[start_at: start_at + top + 1]:
        print("    " + ln[:150])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", required=True, help="comma-separated names from memory_bound and models_bench")
    parser.add_argument("--variants", default="eager,inductor,fuse")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="kernels shown per variant")
    parser.add_argument("--host", action="store_true", help="also time the host side and profile its Python")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    every = {c.name: c for c in memory_bound.cases(device, small=False) + models_bench.cases(device, small=False)}
    for name in args.cases.split(","):
        work = every[name].setup()
        for variant in args.variants.split(","):
            torch._dynamo.reset()
            torch.manual_seed(0)
            inputs = tuple(work.make_inputs())
            step = work.build(harness.COMPILERS[variant])
            for _ in range(2):
                step(*inputs)
            times = kernel_times(step, inputs, args.steps)
            total = sum(us for _, us in times.values())
            launches = sum(n for n, _ in times.values())
            print(f"\n{name} / {variant}: {total:.0f} us of kernels per step, {launches} launches")
            for kname, (n, us) in sorted(times.items(), key=lambda kv: -kv[1][1])[: args.top]:
                print(f"  {us:9.1f} us  {n:3d}x  {kname[:110]}")
            if args.host:
                host_profile(step, inputs, args.steps * 4, args.top + 8)
        del work
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
