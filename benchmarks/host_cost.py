"""Where the host's time goes in one compiled step of a zoo model: fuse's parts beside Inductor's.

    PYTHONPATH=. python -m benchmarks.host_cost --models tv_resnet50,bert [--train] [--variants inductor,fuse]

For each model and variant (eager, Inductor, fuse) it prints, per step:

- ``host``: the host's wall time to issue one step, and ``gpu``: the GPU's time for it, measured
  apart (``benchmarks.timing.host_and_gpu_ms``: steps queued behind a sleeping GPU). A step whose
  host time is above its GPU time is bound by the host.
- ``gc``: the time Python's garbage collector ran during the steps (``gc.callbacks``), and how
  many collections of the oldest generation it made.
- For fuse, the host time split by where it is spent, measured by timers put around fuse's own
  functions while the steps run (so the parts add up to a little more than an untimed step):

  ========== ===================================================================================
  outside    the step less fuse's compiled functions: Dynamo's guards and frame, the model's
             Python around its graphs, autograd's engine
  aot        AOTAutograd's runtime wrappers around each graph
  key        ``FusedGraph.__call__`` less the wrapper: the input signature and its lookup
  alloc      the wrapper's buffer allocations
  launch     kernel launches (``runtime.Launcher`` and the direct launches it builds)
  wrapper    the rest of the generated wrapper: ATen calls (matrix products, convolutions,
             attention), views, layout checks
  ========== ===================================================================================

- For Inductor, ``outside`` (as above) and ``compiled``: Inductor's compiled graphs' calls (its
  wrapper, launches and ATen calls), with ``aot`` between them.

Fresh processes give the spread between runs: ``--repeat-in-processes 3`` runs each model in three
new processes, one after the other, and prints every one's times.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, Sequence

import torch

import fusebackend
from benchmarks.timing import TimingConfig, host_and_gpu_ms, median_ms
from benchmarks.zoo.registry import ZOO
from benchmarks.zoo.spec import narrow


class Timers:
    """Seconds spent inside each wrapped function, counted once however deeply calls nest."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.on = False

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1

        return timed


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@contextlib.contextmanager
def fuse_timers(timers: Timers) -> Iterator[None]:
    """Timers around fuse's compiled entry, each graph, each wrapper, launch and allocation.

    Set before the model is compiled: wrappers bind their allocators and entries when compiled.
    """
    from fusebackend import backend
    from fusebackend.kernels import runtime, wrapper_calls

    original_allocators = wrapper_calls.allocators

    def allocators(device: torch.device) -> tuple[Any, Any]:
        fast, general = original_allocators(device)
        return (timers.wrap("alloc", fast) if fast is not None else None), timers.wrap("alloc", general)

    original_entry_init = backend._Entry.__init__

    def entry_init(self: Any, call: Callable[..., Any], proven: bool) -> None:
        original_entry_init(self, timers.wrap("wrapper_total", call), proven)

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(wrapper_calls, "allocators", allocators))
        stack.enter_context(patched(backend._Entry, "__init__", entry_init))
        stack.enter_context(patched(runtime.Launcher, "__call__",
                                    timers.wrap("launch", runtime.Launcher.__call__)))
        original_direct = runtime.direct_launcher

        def direct_launcher(*args: Any) -> Any:  # the wrapper calls these once built
            return timers.wrap("launch", original_direct(*args))

        stack.enter_context(patched(runtime, "direct_launcher", direct_launcher))
        graph_call = backend.FusedGraph.__call__
        timed_graph = {kind: timers.wrap(f"graph_{kind}", graph_call) for kind in ("backward", "other")}

        def call_graph(self: Any, *args: Any) -> Any:
            return timed_graph["backward" if self.name.startswith("backward") else "other"](self, *args)

        stack.enter_context(patched(backend.FusedGraph, "__call__", call_graph))
        stack.enter_context(patched(backend._DynamoGraphOnFailure, "__call__",
                                    timers.wrap("entry_total", backend._DynamoGraphOnFailure.__call__)))
        yield


@contextlib.contextmanager
def inductor_timers(timers: Timers) -> Iterator[None]:
    from torch._inductor import output_code

    cls = output_code.CompiledFxGraph
    with patched(cls, "__call__", timers.wrap("compiled", cls.__call__)):
        yield


class GcClock:
    """Time spent in Python's garbage collector, and its collections of the oldest generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._start = 0.0
        self.on = False

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.full += info.get("generation") == 2


def build_step(name: str, variant: str, train: bool, device: torch.device, dtype: torch.dtype,
               batch: int | None = None, seq: int | None = None) -> Callable[[], Any]:
    """One step of ``variant``: eager, inductor or fuse; ``-dynamic`` compiles with
    ``dynamic=True`` (fuse: Dynamo's symbolic graph compiled per shape), ``fuse-symbolic`` too,
    with one compile for every size (``config.symbolic``, set by ``measure``)."""
    built = ZOO[name].build("real" if device.type == "cuda" else "tiny", device, dtype)
    if batch is not None or seq is not None:
        built = narrow(built, batch=batch, seq=seq)
    model = built.model.train(train)
    call: Callable[..., Any] = model
    dynamic = variant.endswith(("-dynamic", "-symbolic"))
    if variant.startswith("inductor"):
        call = torch.compile(model, dynamic=dynamic)
    elif variant.startswith("fuse"):
        call = torch.compile(model, backend=fusebackend.fuse, dynamic=dynamic)
    params = [p for p in model.parameters() if p.requires_grad]

    if train:
        def step() -> Any:
            for p in params:
                p.grad = None
            built.loss(call(**built.train_inputs)).backward()
    else:
        def step() -> Any:
            with torch.no_grad():
                return call(**built.inputs)
    return step


def top_kernels(step: Callable[[], Any], n: int) -> list[tuple[str, int, float]]:
    """The ``n`` GPU kernels that take the most device time in a step: (name, launches, us)."""
    from benchmarks.profile import kernel_times

    times = kernel_times(lambda: step(), (), 3)
    ranked = sorted(times.items(), key=lambda kv: -kv[1][1])[:n]
    return [(k, launches, us) for k, (launches, us) in ranked] + [
        ("(all kernels)", sum(v[0] for v in times.values()), sum(v[1] for v in times.values()))]


def hottest_python(step: Callable[[], Any], steps: int, n: int) -> list[tuple[str, int, float]]:
    """The ``n`` Python functions (and C functions called from Python) with the most time of
    their own per step under ``cProfile``: (function, calls, us). cProfile slows Python calls
    down, so these rank the host's work; they do not time it."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, function) -> (cc, nc, tottime, cumtime, callers)
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:n]
    return [(f"{pstats.func_std_string(func)[-80:]}", int(nc) // steps, tt * 1e6 / steps)
            for func, (cc, nc, tt, ct, callers) in ranked]


def measure(name: str, variant: str, train: bool, device: torch.device, dtype: torch.dtype,
            steps: int, top_kernels_n: int = 0, profile_n: int = 0, batch: int | None = None,
            seq: int | None = None) -> dict[str, Any]:
    torch._dynamo.reset()
    fusebackend.metrics.reset()
    timers = Timers()
    scope = fuse_timers if variant.startswith("fuse") else inductor_timers if variant.startswith("inductor") else None
    with scope(timers) if scope else contextlib.nullcontext(), \
            fusebackend.config.patch(symbolic="on" if variant == "fuse-symbolic" else "off"):
        step = build_step(name, variant, train, device, dtype, batch, seq)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        first_s = time.perf_counter() - start
        step()
        clock = GcClock()
        gc.callbacks.append(clock)
        try:
            clock.on = True
            plain = host_and_gpu_ms(step, device, steps=steps)  # untimed: fuse's timers are off
            clock.on = False
            timers.on = True
            start = time.perf_counter()
            for _ in range(steps):
                step()
            timed_host_ms = (time.perf_counter() - start) * 1e3 / steps
            timers.on = False
            if device.type == "cuda":
                torch.cuda.synchronize()
        finally:
            gc.callbacks.remove(clock)
        bench = median_ms(step, device, TimingConfig()) if device.type == "cuda" else None
        kernels = top_kernels(step, top_kernels_n) if top_kernels_n and device.type == "cuda" else []
        hot = hottest_python(step, steps, profile_n) if profile_n else []
    per_step = {k: v * 1e3 / steps for k, v in timers.seconds.items()}
    parts: dict[str, float] = {}
    if variant.startswith("fuse"):
        entry = per_step.get("entry_total", 0.0)  # forward and inference graphs, through AOTAutograd
        backward = per_step.get("graph_backward", 0.0)  # called by autograd's engine
        graph = per_step.get("graph_other", 0.0) + backward
        wrapper = per_step.get("wrapper_total", 0.0)
        parts = {
            "outside": timed_host_ms - entry - backward,
            "aot": entry - per_step.get("graph_other", 0.0),
            "key": graph - wrapper,
            "alloc": per_step.get("alloc", 0.0),
            "launch": per_step.get("launch", 0.0),
            "wrapper": wrapper - per_step.get("alloc", 0.0) - per_step.get("launch", 0.0),
        }
    elif variant.startswith("inductor"):
        compiled = per_step.get("compiled", 0.0)
        parts = {"outside": timed_host_ms - compiled, "compiled": compiled}
    return {
        "model": name, "variant": variant, "mode": "train" if train else "inference",
        "first_call_s": first_s, "host_ms": plain.host_ms, "gpu_ms": plain.gpu_ms, "do_bench_ms": bench,
        "timed_host_ms": timed_host_ms, "parts": parts,
        "calls": {k: v // steps for k, v in timers.calls.items()},
        "gc_ms": clock.seconds * 1e3 / steps / 3, "gc_full": clock.full,  # host_and_gpu_ms runs 3 rounds
        "kernels": sum(a.kernel_count for a in fusebackend.history()) if variant.startswith("fuse") else None,
        "eager_graphs": fusebackend.metrics.eager_graphs if variant.startswith("fuse") else None,
        "not_symbolic": dict(fusebackend.metrics.not_symbolic) if variant == "fuse-symbolic" else None,
        "top_kernels": kernels,
        "hottest_python": hot,
    }


def row_text(r: dict[str, Any]) -> str:
    gpu = f"{r['gpu_ms']:.3f}" if r["gpu_ms"] is not None else "-"
    bench = f"{r['do_bench_ms']:.3f}" if r["do_bench_ms"] is not None else "-"
    parts = "  ".join(f"{k} {v:.3f}" for k, v in r["parts"].items())
    bound = " HOST-BOUND" if r["gpu_ms"] is not None and r["host_ms"] > r["gpu_ms"] else ""
    kernels = "".join(f"\n{'':44s}{us:9.1f} us {n:4d}x {k[:90]}" for k, n, us in r["top_kernels"])
    kernels += "".join(f"\n{'':44s}{us:9.1f} us {n:4d}x py {k}" for k, n, us in r["hottest_python"])
    return (f"{r['model']:24s} {r['mode']:9s} {r['variant']:16s} do_bench {bench:>7s}  host {r['host_ms']:.3f}  "
            f"gpu {gpu}  gc {r['gc_ms']:.3f} ({r['gc_full']} full){bound}\n{'':44s}{parts}{kernels}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--variants", default="eager,inductor,fuse",
                        help="of eager, inductor, fuse, inductor-dynamic, fuse-dynamic (dynamic=True, compiled per "
                             "shape), fuse-symbolic (dynamic=True, one compile for every size)")
    parser.add_argument("--batch", type=int, default=None, help="the first rows of each input")
    parser.add_argument("--seq", type=int, default=None, help="the first positions of each token input")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--steps", type=int, default=5, help="steps per round (fewer for big training steps)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=("bf16", "fp32"))
    parser.add_argument("--repeat-in-processes", type=int, default=0,
                        help="run each model and variant in this many fresh processes instead of this one")
    parser.add_argument("--kernels", type=int, default=0, help="GPU: also list the N kernels taking most device time")
    parser.add_argument("--profile", type=int, default=0,
                        help="also list the N Python functions with the most time of their own (cProfile)")
    parser.add_argument("--json", default=None, help="append each result as a JSON line to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, None: None}[args.dtype]
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    for name in args.models.split(","):
        if args.repeat_in_processes:
            for _ in range(args.repeat_in_processes):  # every variant in each process, as a user runs them
                cmd = [sys.executable, "-m", "benchmarks.host_cost", "--models", name, "--variants", args.variants,
                       "--steps", str(args.steps), "--device", args.device]
                cmd += ["--train"] if args.train else []
                cmd += ["--json", args.json] if args.json else []
                cmd += ["--dtype", args.dtype] if args.dtype else []
                cmd += ["--batch", str(args.batch)] if args.batch else []
                cmd += ["--seq", str(args.seq)] if args.seq else []
                cmd += ["--kernels", str(args.kernels), "--profile", str(args.profile)]
                subprocess.run(cmd, check=False, env=dict(os.environ))
            continue
        for variant in args.variants.split(","):
            with fusebackend.config.patch(interpret=device.type == "cpu"):
                result = measure(name, variant, args.train, device, dtype, args.steps, args.kernels, args.profile,
                                 args.batch, args.seq)
            print(row_text(result), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
