"""Optimizer steps over real models' parameters: eager (foreach, and fused where PyTorch has it),
Inductor and fuse compiling ``opt.step``, against the step's memory floor.

An optimizer step is memory traffic: it reads every parameter, its gradient and its states, and
writes the parameter and the states. Its floor is those bytes over the copy bandwidth measured in
the same run (a copy of 1 GiB, read and written: ``benchmarks.timing.copy_bandwidth``). The
parameters are a zoo model's (``--models``, ``benchmarks/zoo/registry.py``) or ``synthetic<N>``:
N tensors of mixed sizes (every fifth a vector, the others matrices of 64 to 1024 rows), to see
compile time grow with the list.

Per optimizer (``--optimizers``: AdamW with weight decay, SGD with Nesterov momentum, Adafactor)
and variant (``--variants``):

- ``eager``: PyTorch's foreach implementation, the default on a GPU (the reference);
- ``fused``: ``fused=True`` (AdamW and SGD);
- ``inductor`` and ``fuse``: ``torch.compile(opt.step)`` with that backend, as PyTorch's tutorial
  on compiling the optimizer writes it; ``fuse@reduce-overhead`` (or another of
  ``torch.compile``'s modes after ``@``) compiles it in that mode: a step of little memory
  traffic is the host's, and CUDA graphs take the launches off it.

It reports the step's median time (``benchmarks.timing.median_ms``: ``do_bench`` with the L2
flushed on a GPU, wall time on a CPU), its share of the floor, on a GPU the host's time to issue
a step against its kernels' time (a step of little memory traffic is the host's), the first call's seconds (the
compile; with ``--cold``, over empty cache folders), and the largest relative difference of the
parameters from eager's after the same steps from the same start. For fuse: the steady step's
graph's kernels and the ATen calls left in it (a first step that makes the states is a graph of
its own).

    python -m benchmarks.optimizers --models gpt2,llama,resnet --optimizers adamw,sgd,adafactor \\
        --variants eager,fused,inductor,fuse --out DIR
    python -m benchmarks.optimizers --models synthetic1000 --optimizers adamw --variants inductor,fuse --cold
    python -m benchmarks.optimizers --models resnet --variants eager,fused,inductor@reduce-overhead,fuse@reduce-overhead

writes ``DIR/optimizers.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from typing import Any, Callable

import torch

from benchmarks.timing import TimingConfig, copy_bandwidth, median_ms, synchronize, timed_call

GiB = 1 << 30
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": lambda params, **kw: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **kw),
    "sgd": lambda params, **kw: torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True, **kw),
    "adafactor": lambda params, **kw: torch.optim.Adafactor(params, lr=1e-2, **kw),
}
FUSED = {"adamw", "sgd"}  # optimizers with a fused=True implementation
VARIANTS = ("eager", "fused", "inductor", "fuse")


@dataclasses.dataclass
class Row:
    params: str  # the model, or synthetic<N>
    tensors: int
    elements: int
    optimizer: str
    variant: str
    status: str = "ok"  # ok, or why not run / the error
    step_ms: float | None = None
    floor_ms: float | None = None
    share: float | None = None  # floor over step
    first_call_s: float | None = None
    max_rel_diff: float | None = None  # parameters after the steps, against eager's
    graphs: int | None = None  # fuse: graphs compiled (Dynamo breaks some steps into several)
    kernels: int | None = None  # fuse: the last graph's generated kernels
    aten_calls: dict[str, int] | None = None  # fuse: the ATen calls left, by op
    # a GPU: the host's time to issue a step (20 steps issued without a wait, the least of 5
    # rounds) and its kernels' time (the profiler's, over 10 steps): which of the two sets it
    host_ms: float | None = None
    gpu_ms: float | None = None


def parameters(name: str, size: str, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """Leaf tensors to optimize: a zoo model's parameters, or ``synthetic<N>``."""
    if name.startswith("synthetic"):
        count = int(name[len("synthetic"):])
        gen = torch.Generator().manual_seed(0)
        shapes = []
        for i in range(count):
            rows = int(torch.randint(64, 1025, (1,), generator=gen))
            shapes.append((rows,) if i % 5 == 4 else (rows, 64 if size == "tiny" else 256))
        if size == "tiny":
            shapes = [tuple(max(1, s // 32) for s in shape) for shape in shapes]
        return [torch.randn(shape, generator=gen).to(device, dtype) for shape in shapes]
    from benchmarks.zoo.registry import ZOO

    model = ZOO[name].build(size, device, dtype).model
    seen: set[int] = set()
    out = []
    for p in model.parameters():  # tied weights once
        if p.requires_grad and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            out.append(p.detach().clone())
    del model
    return out


def step_bytes(params: list[torch.Tensor], opt: torch.optim.Optimizer) -> int:
    """The floor's bytes: each parameter read and written, its gradient read, and each of its
    states of more than one element read and written (a step count of one element is left out)."""
    total = 0
    for p in params:
        size = p.numel() * p.element_size()
        total += 2 * size + p.grad.numel() * p.grad.element_size()
        for state in opt.state[p].values():
            if isinstance(state, torch.Tensor) and state.numel() > 1:
                total += 2 * state.numel() * state.element_size()
    return total


def run_one(name: str, size: str, optimizer: str, variant: str, device: torch.device, dtype: torch.dtype,
            steps: int, repeats: int, bandwidth: float | None,
            reference: list[torch.Tensor] | None) -> tuple[Row, list[torch.Tensor]]:
    """One variant's steps from the common start; returns its row and its parameters after ``steps``."""
    import fusebackend

    torch.manual_seed(0)
    params = [p.requires_grad_() for p in parameters(name, size, device, dtype)]
    row = Row(name, len(params), sum(p.numel() for p in params), optimizer, variant)
    grads = [torch.randn(p.shape, generator=torch.Generator().manual_seed(i)).to(device, dtype) * 1e-2
             for i, p in enumerate(params)]
    for p, g in zip(params, grads):
        p.grad = g
    if variant == "fused" and optimizer not in FUSED:
        row.status = "no fused implementation"
        return row, params
    kwargs = {"fused": True} if variant == "fused" else {"foreach": True}
    try:
        opt = OPTIMIZERS[optimizer](params, **kwargs)
    except (RuntimeError, ValueError, TypeError) as exc:  # fused=True where PyTorch has none
        row.status = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return row, params
    step: Callable[[], Any] = opt.step
    backend, _, mode = variant.partition("@")
    if backend in ("inductor", "fuse"):
        torch._dynamo.reset()
        fusebackend.metrics.reset()
        step = torch.compile(opt.step, backend=fusebackend.fuse if backend == "fuse" else "inductor", mode=mode or None)
    try:
        _, row.first_call_s = timed_call(step, (), device)
        for _ in range(steps - 1):
            step()
        synchronize(device)
    except Exception as exc:  # a failing variant is a row, not the end of the run
        row.status = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return row, params
    after = [p.detach().clone() for p in params]
    if reference is not None:
        row.max_rel_diff = max(float((p - r).abs().max() / r.abs().max().clamp(min=1e-12))
                               for p, r in zip(after, reference))
    if backend == "fuse":  # the steady step's graph (the first step's may differ: states made in it)
        row.graphs = fusebackend.metrics.graphs_compiled  # reset before the compile
        last = fusebackend.last_compiled() if row.graphs else None
        row.kernels = len(last.kernels) if last is not None else 0
        calls: dict[str, int] = {}
        for line in last.schedule.splitlines() if last is not None else []:
            op = line.split(":", 1)[1].split()[0] if line.startswith("  extern ") else ""
            if op.startswith("aten."):  # (a fusebackend.foreach_lists call is a kernel, counted above)
                op = op.removeprefix("aten.").rsplit(".", 1)[0]
                calls[op] = calls.get(op, 0) + 1
        row.aten_calls = calls
    row.step_ms = median_ms(step, device, TimingConfig(cpu_repeats=repeats))
    if device.type == "cuda":
        row.host_ms, row.gpu_ms = host_and_gpu_ms(step, device)
    if bandwidth:
        row.floor_ms = step_bytes(params, opt) / bandwidth / 1e6
        row.share = row.floor_ms / row.step_ms
    return row, after


def host_and_gpu_ms(step: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    """A step's host time (issuing 20 steps without waiting, the least of 5 rounds: the GPU's
    queue holds them) and its GPU kernels' time (the profiler's, a step's share of 10)."""
    import time

    rounds = []
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(20):
            step()
        rounds.append((time.perf_counter() - start) / 20 * 1e3)
    synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        synchronize(device)
    kernels_us = sum(e.device_time_total for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return min(rounds), kernels_us / 10 / 1e3


def measure(names: list[str], size: str, optimizers: list[str], variants: list[str], device: torch.device,
            dtype: torch.dtype, steps: int = 3, repeats: int = 20, bandwidth: float | None = None,
            log: Callable[[str], None] = print) -> list[Row]:
    """Every (parameters, optimizer, variant); eager runs first in each, as the reference."""
    rows = []
    for name in names:
        for optimizer in optimizers:
            reference = None
            for variant in ["eager"] + [v for v in variants if v != "eager"]:
                row, after = run_one(name, size, optimizer, variant, device, dtype, steps, repeats, bandwidth,
                                     reference)
                if variant == "eager":
                    reference = after
                rows.append(row)
                log(format_row(row))
    return rows


def format_row(r: Row) -> str:
    head = f"{r.params:14s} {r.tensors:5d} tensors  {r.optimizer:9s} {r.variant:8s}"
    if r.status != "ok":
        return f"{head}  {r.status}"
    parts = [head, f"step {r.step_ms:8.3f} ms"]
    if r.share is not None:
        parts.append(f"({100 * r.share:.0f}% of floor {r.floor_ms:.3f} ms)")
    if r.host_ms is not None and r.gpu_ms is not None:
        parts.append(f"host {r.host_ms:.3f} ms, GPU {r.gpu_ms:.3f} ms")
    if r.first_call_s is not None and r.variant.partition("@")[0] in ("inductor", "fuse"):
        parts.append(f"first call {r.first_call_s:6.1f} s")
    if r.max_rel_diff is not None:
        parts.append(f"diff {r.max_rel_diff:.1e}")
    if r.kernels is not None:
        left = ", ".join(f"{op} x{n}" for op, n in sorted((r.aten_calls or {}).items()))
        parts.append(f"{r.graphs} graphs, the last {r.kernels} kernels" + (f", ATen: {left}" if left else ""))
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,llama,resnet", help="zoo names or synthetic<N>, comma-separated")
    p.add_argument("--size", default=None, choices=["real", "tiny"], help="default: real on a GPU, tiny on a CPU")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--optimizers", default="adamw,sgd,adafactor")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=3, help="steps before the parameters are compared")
    p.add_argument("--repeats", type=int, default=20, help="CPU: timed steps (median); a GPU times by do_bench")
    p.add_argument("--cold", action="store_true", help="Inductor's, Triton's and fuse's caches in fresh folders")
    p.add_argument("--out", default=None, help="folder for optimizers.json")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = args.size or ("real" if device.type == "cuda" else "tiny")
    if args.cold:
        folder = tempfile.mkdtemp(prefix="optimizers_caches_")
        for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                         ("FUSE_CACHE_DIR", "fuse")):
            os.environ[var] = os.path.join(folder, sub)
    bandwidth = copy_bandwidth(device, GiB, TimingConfig()).bytes_per_s / 1e9 if device.type == "cuda" else None
    if bandwidth:
        print(f"copy bandwidth {bandwidth:.0f} GB/s ({torch.cuda.get_device_name()})")
    unknown = (sorted(set(args.optimizers.split(",")) - set(OPTIMIZERS))
               + sorted({v for v in args.variants.split(",") if v.partition("@")[0] not in VARIANTS
                         or (v.partition("@")[2] and v.partition("@")[0] not in ("inductor", "fuse"))}))
    if unknown:
        raise SystemExit(f"unknown optimizer or variant: {', '.join(unknown)} (optimizers {', '.join(OPTIMIZERS)}; "
                         f"variants {', '.join(VARIANTS)}, inductor and fuse with @MODE)")
    rows = measure(args.models.split(","), size, args.optimizers.split(","), args.variants.split(","), device,
                   getattr(torch, args.dtype), args.steps, args.repeats, bandwidth)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
                "size": size, "dtype": args.dtype, "copy_gb_per_s": bandwidth, "cold": args.cold}
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            pass
        path = os.path.join(args.out, "optimizers.json")
        with open(path, "w") as f:
            json.dump({"info": info, "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
