"""Whole training steps compiled as users write them: the forward, the loss's backward, the
optimizer's step and ``zero_grad`` in one compiled function, eager against Inductor and fuse.

::

    def train_step(model, opt, inputs):
        loss = built.loss(model(**inputs))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    step = torch.compile(train_step, backend=..., mode=...)

Dynamo breaks the function at ``loss.backward()``: the forward and its backward (AOTAutograd's
pair) are one compiled region, the optimizer's step another. For each of the zoo's training
models (``--models``; real sizes in bf16 on a GPU, tiny in float32 on the CPU) and variant
(``--variants``: ``eager``, ``inductor``, ``fuse``, either compiler with ``@MODE`` for
``torch.compile``'s mode, ``fuse@reduce-overhead``), from the same weights and inputs:

- **correctness**: each variant's update of every parameter over ``--steps`` steps (the weights
  after, less the weights before) against eager's and against a float64 copy's (eager, AdamW on
  the float64 model): the update's L2 distance from float64's within twice eager's, plus ``atol``
  of float64's L2 norm, plus twice float64's largest element in a parameter of ``FLIP_MIN``
  elements or more (``update_distance``). The worst parameter is reported. Adam moves an
  element by about the learning rate whatever its gradient's size, so an element whose gradient
  is near zero moves up or down as rounding sets its sign, in eager's steps as in a compiler's,
  by chance: the largest element's distance judged a step by which elements that chance picked
  (GPT-2's first LayerNorm bias, bf16, H200: Inductor's 4.4x eager's, fuse's 4.5x; Inductor's
  steps under CUDA graphs within bounds). The norm with one such element's allowance judges the
  whole update (an update 1.5x too large fails at any size);
- **time**: a step's median (``benchmarks.timing.median_ms``: CUDA events on a GPU, wall time on
  a CPU), the first call's seconds (the compiles), the peak memory of a steady step on a GPU;
- **graphs**: how many Dynamo compiled, and for fuse, how many ran eagerly;
- **on a GPU, one step's profile**: its kernels' time (the step less that is the host's), the
  part in generated kernels, launches, and the longest kernels (in the JSON).

AdamW (foreach, learning rate 1e-3, weight decay 0.01) by default, SGD with Nesterov momentum
with ``--optimizer sgd``.

    python -m benchmarks.training_steps --models gpt2,llama,resnet \\
        --variants eager,inductor,fuse,inductor@reduce-overhead,fuse@reduce-overhead --out DIR
    python -m benchmarks.training_steps --check     # tiny models on the CPU, correctness only

writes ``DIR/training_steps.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
from typing import Any, Callable

import torch

from benchmarks.optimizers import OPTIMIZERS
from benchmarks.timing import TimingConfig, median_ms, synchronize, timed_call
from benchmarks.zoo.compare import Distance

VARIANTS = ("eager", "inductor", "fuse")
ATOL = 1e-3  # of float64's update's norm, as the zoo's training rows judge gradients
# parameters of at least this many elements may have one element moved the other way (a tenth
# of the update's norm at most, for updates of one size): in a smaller one that is the update
FLIP_MIN = 400
TOP_KERNELS = 40  # the longest kernels of a profiled step, in the JSON


@dataclasses.dataclass
class Row:
    model: str
    variant: str
    status: str = "ok"  # ok, "wrong: <the worst parameter>", or the error
    step_ms: float | None = None
    first_call_s: float | None = None
    peak_mib: float | None = None
    worst: str | None = None  # the parameter farthest from float64, against its allowance
    worst_ratio: float | None = None  # its distance over the allowed one (at most 1 passes)
    graphs: int | None = None  # Dynamo's compiled graphs
    eager_graphs: int | None = None  # fuse: graphs run eagerly
    # a GPU's profile of one step: its kernels' time (the rest of the step is the host's), the
    # share of it in kernels the compiler generated, launches, and the longest kernels
    gpu_ms: float | None = None
    generated_ms: float | None = None
    launches: int | None = None
    top_kernels: list[tuple[str, int, float]] = dataclasses.field(default_factory=list)  # name, launches, us


def update_distance(name: str, compiled: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor) -> Distance:
    """One parameter's update against eager's and float64's, in L2 norm (module docstring)."""
    c, e, x = (t.detach().double() for t in (compiled, eager, exact))
    if c.shape != x.shape:
        return Distance(f"{name} (shape {list(c.shape)}, float64 {list(x.shape)})", float("inf"), 0.0, 0.0)
    dc, de = (c - x).norm().item(), (e - x).norm().item()
    dc = float("inf") if dc != dc else dc  # NaN: never within bounds
    flip = 2 * x.abs().max().item() if x.numel() >= FLIP_MIN else 0.0
    return Distance(name, dc, de, 2 * de + ATOL * x.norm().item() + flip)


def train_step(loss_of: Callable[[Any], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = loss_of(model(**inputs))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return step


# The weights before the steps, the updates and the starting state are kept in host memory: on
# the device they would count in every variant's peak (Llama's float64 updates take 9.9 GB, and
# a run holds three such sets)

def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def _updates(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: (p.detach().cpu().double() - before[n].double()) for n, p in model.named_parameters() if n in before}


def run_model(name: str, size: str, variants: list[str], optimizer: str, device: torch.device, dtype: torch.dtype,
              steps: int, timing: TimingConfig | None, log: Callable[[str], None] = print) -> list[Row]:
    """Every variant's steps on ``name`` from the same weights; eager and float64 first."""
    from torch._dynamo.utils import counters

    from benchmarks.zoo.compare import cast_inputs
    from benchmarks.zoo.measure import profile_step
    from benchmarks.zoo.registry import ZOO

    import fusebackend

    torch.manual_seed(0)
    built = ZOO[name].build(size, device, dtype)
    start = {k: v.detach().to("cpu", copy=True) for k, v in built.model.state_dict().items()}
    before = _weights(built.model)

    def fresh(to: torch.dtype = dtype) -> torch.nn.Module:
        model = copy.deepcopy(built.model).to(to)
        model.load_state_dict(start)
        return model.train()

    def updates_of(model: torch.nn.Module, call: Callable[..., Any], inputs: dict[str, torch.Tensor],
                   opt: torch.optim.Optimizer, count: int) -> dict[str, torch.Tensor]:
        for _ in range(count):
            call(model, opt, inputs)
        synchronize(device)
        return _updates(model, before)

    step = train_step(built.loss)
    exact_model = fresh(torch.float64)
    exact = updates_of(exact_model, step, cast_inputs(built.train_inputs, torch.float64),
                       OPTIMIZERS[optimizer](exact_model.parameters(), foreach=True), 1 + steps)
    del exact_model
    reference: dict[str, torch.Tensor] | None = None
    rows = []
    for variant in ["eager"] + [v for v in variants if v != "eager"]:
        row = Row(name, variant)
        backend, _, mode = variant.partition("@")
        model = fresh()
        opt = OPTIMIZERS[optimizer](model.parameters(), foreach=True)
        call: Callable[..., Any] = step
        torch._dynamo.reset()
        counters.clear()
        fusebackend.metrics.reset()
        if backend != "eager":
            call = torch.compile(step, backend=fusebackend.fuse if backend == "fuse" else "inductor",
                                 mode=mode or None)
        try:
            _, row.first_call_s = timed_call(call, (model, opt, built.train_inputs), device)
            got = updates_of(model, call, built.train_inputs, opt, steps)  # and the first call's step
            if reference is None:
                reference = got
            dists = [update_distance(n, got[n], reference[n], exact[n]) for n in exact]
            worst = max(dists, key=lambda d: d.ratio)
            row.worst, row.worst_ratio = str(worst), worst.ratio
            if not all(d.ok for d in dists) and variant != "eager":
                row.status = f"wrong: {worst}"
            if timing is not None:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                row.step_ms = median_ms(lambda: call(model, opt, built.train_inputs), device, timing)
                if device.type == "cuda":
                    row.peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
                profile = profile_step(lambda: call(model, opt, built.train_inputs), device)
                if profile is not None:
                    row.gpu_ms, row.generated_ms = profile.total_us / 1e3, profile.generated_us() / 1e3
                    row.launches = profile.launches
                    longest = sorted(profile.kernels.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
                    row.top_kernels = [(name[:120], n, round(us, 1)) for name, (n, us) in longest]
        except Exception as exc:  # a failing variant is a row, not the end of the run
            row.status = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if backend != "eager":
            row.graphs = int(counters["stats"]["unique_graphs"])
            if backend == "fuse":
                row.eager_graphs = fusebackend.metrics.eager_graphs
        rows.append(row)
        log(format_row(row))
        del model, opt, call
    return rows


def format_row(r: Row) -> str:
    parts = [f"{r.model:14s} {r.variant:26s}"]
    if r.step_ms is not None:
        parts.append(f"step {r.step_ms:9.3f} ms")
    if r.peak_mib is not None:
        parts.append(f"peak {r.peak_mib:8.0f} MiB")
    if r.first_call_s is not None and r.variant != "eager":
        parts.append(f"first call {r.first_call_s:6.1f} s")
    if r.gpu_ms is not None:
        parts.append(f"GPU {r.gpu_ms:8.3f} ms ({r.generated_ms:.3f} generated, {r.launches} launches)")
    if r.graphs is not None:
        parts.append(f"{r.graphs} graphs" + (f", {r.eager_graphs} eager" if r.eager_graphs is not None else ""))
    if r.worst_ratio is not None:
        parts.append(f"worst update {r.worst_ratio:.2f}x of allowed")
    if r.status != "ok":
        parts.append(r.status)
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,llama,resnet")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--steps", type=int, default=2, help="steps after the first call's before the updates are compared")
    p.add_argument("--check", action="store_true", help="correctness only (no timing): tiny sizes on the CPU")
    p.add_argument("--out", default=None, help="folder for training_steps.json")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.check else "cpu")
    size, dtype = ("real", torch.bfloat16) if device.type == "cuda" else ("tiny", torch.float32)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v.partition("@")[0] not in VARIANTS or (v.partition("@")[2] and v == "eager")]
    if unknown:
        raise SystemExit(f"unknown variant: {', '.join(unknown)} (variants {', '.join(VARIANTS)}, compilers with @MODE)")
    timing = None if args.check else TimingConfig(cpu_repeats=5)
    rows = [row for name in args.models.split(",")
            for row in run_model(name, size, variants, args.optimizer, device, dtype, args.steps, timing)]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
                "size": size, "dtype": str(dtype), "optimizer": args.optimizer, "steps": args.steps}
        path = os.path.join(args.out, "training_steps.json")
        with open(path, "w") as f:
            json.dump({"info": info, "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)
        print(f"wrote {path}")
    if args.check and any(r.status != "ok" for r in rows):
        raise SystemExit("a variant's updates are not eager's: " + "; ".join(format_row(r) for r in rows if r.status != "ok"))


if __name__ == "__main__":
    main()
