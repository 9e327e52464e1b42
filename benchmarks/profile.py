"""Where a case's time goes on the GPU: its timed step under ``torch.profiler``, kernel by kernel.

For each case and variant: build the step, run it twice (compiles, warm-up), then profile
``--steps`` calls and print the GPU kernels by total device time per step, with the sum over all
kernels. Kernel names tell fuse's (``fused_pw*``/``fused_red*``), Inductor's (``triton_*``) and
ATen's apart, so the table shows what a slower variant spends its extra time on.

With ``--host``, also the host (Python) side: the wall time per step against the kernel time (a
step whose wall time exceeds its kernel time is bound by launching, not by the GPU), and the
Python functions that take the most time, from ``cProfile``.

    PYTHONPATH=. python -m benchmarks.profile --cases transformer.train,convnet.forward

``--zoo`` names zoo models instead (their inference step at the real size in bf16, or with
``--train`` their training step; ``--batch`` and ``--seq`` narrowing it); variants may then carry a
mode (``fuse@reduce-overhead``), and kernels replayed inside a CUDA graph are listed as the
profiler sees them. Each of fuse's kernels is shown against its floor (its bytes over the copy
bandwidth measured in the same run, ``zoo/audit.py``):

    PYTHONPATH=. python -m benchmarks.profile --zoo tv_resnet50 --batch 1 \\
        --variants inductor@reduce-overhead,fuse@reduce-overhead --top 30
    PYTHONPATH=. python -m benchmarks.profile --zoo sd_unet --train --variants eager,inductor,fuse --top 40
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

import fusebackend
from benchmarks import harness, memory_bound, models_bench
from benchmarks.zoo import audit


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


def _zoo_steps(names: str, batch: int | None, seq: int | None, device: torch.device, train: bool = False) -> Any:
    """(name, setup) pairs for zoo models' inference (or training) steps, in the shape
    ``memory_bound``'s cases give: ``setup()`` returns an object with ``make_inputs()`` and
    ``build(compiler)``."""
    from benchmarks.zoo.registry import ZOO
    from benchmarks.zoo.run import _compiler, _inference_step, _train_step
    from benchmarks.zoo.spec import narrow

    class Work:
        def __init__(self, name: str) -> None:
            self.built = narrow(ZOO[name].build("real", device, torch.bfloat16), batch, seq)
            self.built.model.train(train)

        def make_inputs(self) -> tuple[Any, ...]:
            return ()

        def build(self, variant: str) -> Any:
            make = _train_step if train else _inference_step
            return make(self.built, _compiler(variant)(self.built.model))

    return {name: (lambda name=name: Work(name)) for name in names.split(",")}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated names from memory_bound and models_bench")
    parser.add_argument("--zoo", default="", help="comma-separated zoo models (inference, real size, bf16)")
    parser.add_argument("--train", action="store_true", help="--zoo: the models' training steps")
    parser.add_argument("--batch", type=int, default=None, help="--zoo: the batch size")
    parser.add_argument("--seq", type=int, default=None, help="--zoo: the sequence length")
    parser.add_argument("--variants", default="eager,inductor,fuse")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="kernels shown per variant")
    parser.add_argument("--host", action="store_true", help="also time the host side and profile its Python")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    bandwidth = audit.copy_bandwidth(device)
    if args.zoo:
        setups = _zoo_steps(args.zoo, args.batch, args.seq, device, args.train)
    else:
        every = {c.name: c for c in memory_bound.cases(device, small=False) + models_bench.cases(device, small=False)}
        setups = {name: every[name].setup for name in args.cases.split(",")}
    for name, setup in setups.items():
        work = setup()
        for variant in args.variants.split(","):
            torch._dynamo.reset()
            fusebackend.dump.clear()
            torch.manual_seed(0)
            inputs = tuple(work.make_inputs())
            step = work.build(variant if args.zoo else harness.COMPILERS[variant])
            for _ in range(3):
                step(*inputs)
            times = kernel_times(step, inputs, args.steps)
            total = sum(us for _, us in times.values())
            launches = sum(n for n, _ in times.values())
            floors = audit.kernel_floors((k, src) for a in fusebackend.history() for k, src in a.kernels.items())
            print(f"\n{name} / {variant}: {total:.0f} us of kernels per step, {launches} launches")
            for kname, (n, us) in sorted(times.items(), key=lambda kv: -kv[1][1])[: args.top]:
                floor = floors.get(kname)
                of = f"  {floor.floor_bytes / bandwidth * 1e6 / us:4.0%} of floor" if floor is not None and us else ""
                print(f"  {us:9.1f} us  {n:3d}x{of}  {kname[:110]}")
            generated = {k: v for k, v in times.items() if k.startswith(("fused_", "triton_"))}
            gen_us, gen_n = sum(us for _, us in generated.values()), sum(n for n, _ in generated.values())
            print(f"  generated kernels {gen_us:.1f} us ({gen_n} launches); "
                  f"library kernels {total - gen_us:.1f} us ({launches - gen_n} launches)")
            if args.host:
                host_profile(step, inputs, args.steps * 4, args.top + 8)
        del work
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
