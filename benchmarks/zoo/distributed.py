"""Training on several devices: a zoo language model under DDP and FSDP2, eager, Inductor and fuse.

Each (setup, variant) runs in processes of its own, one per device (``torch.multiprocessing``;
NCCL on GPUs, gloo on the CPU, where two processes share it):

- ``ddp``: ``DistributedDataParallel`` around the model, then ``torch.compile`` of the whole
  wrapped model. Dynamo's DDP optimizer splits the graph at the gradient buckets, so the backend
  receives one graph (and one backward) per bucket; the buckets' all-reduces run between them,
  from DDP's hooks, as in eager.
- ``fsdp2``: ``fully_shard`` on every transformer block and then on the whole model (its
  embeddings and head); each block compiled with ``module.compile(backend=...)``, as FSDP2's
  documentation does it. The parameters are gathered before a block runs and freed after it.

Every process draws its own batches (fixed seeds per process and step), the same for every
variant, and trains ``steps`` steps with AdamW. Per step: the loss averaged over the processes
(an all-reduce, as a user would log it) and the wall time of the step (forward, backward,
optimizer, the device synchronized). Reported per variant:

- the losses, and their largest distance from eager's relative to eager's (the same batches and
  initial weights, so the trajectories agree up to rounding: ``LOSS_RTOL`` in bf16);
- tokens per second over all processes: ``world x batch x sequence`` over the median step time
  after the first ``WARMUP`` steps (the slowest process's median);
- the first step's seconds (compiling included);
- peak memory per GPU: ``torch.cuda.max_memory_allocated`` in each timed step (reset before it),
  the highest over the steps for each process (the JSON keeps every step's);
- fuse's graph count and graphs run eagerly (``fusebackend.metrics``), from the first process.

FSDP2's step times wander between processes and within one (two H200s, 2026-11-25: over five
runs of 18 timed steps, fuse's tokens/s over Inductor's ranged 0.79x to 1.27x, and eager's median
step 80.6 to 90.7 ms; every variant had slow stretches of several steps). ``--interleave`` builds every variant in the same processes and steps
them in turn, the order rotated each round, so a slow stretch falls on all of them; the table then
adds each variant's median step time over eager's, per round (paired). Peak memory is only
meaningful without it: the other variants' models are allocated too.

``PYTHONPATH=. python -m benchmarks.zoo.distributed --out "$OUT"`` (the zoo's Llama, real size,
bf16, 20 steps, both setups, eager / Inductor / fuse, on every visible GPU); ``--size tiny`` with
two CPU processes (gloo, fp32, kernels in Triton's interpreter). The tests
(``tests/test_distributed.py``) call ``run`` with the tiny size.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

SETUPS = ("ddp", "fsdp2")
VARIANTS = ("eager", "inductor", "fuse")
LR = 1e-4  # AdamW's; at 1e-3 the bf16 losses of eager and Inductor parted by 4% within 13 steps
WARMUP = 2  # steps not timed: the first compiles, the second may still allocate for the first time
LOSS_RTOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-5}  # losses against eager's


@dataclasses.dataclass(frozen=True)
class Options:
    bucket_mb: float | None = None  # DDP's bucket size (None: DDP's default, 25 MiB)
    peak_blocks: int = 0  # on a GPU: list the largest blocks live at the peak of one more step
    # the variants in the same processes, one step of each in turn (paired times; the peaks then
    # include the other variants' models)
    interleave: bool = False


@dataclasses.dataclass
class Result:
    setup: str
    variant: str
    world: int
    losses: list[float]
    step_ms: float  # the slowest process's median step time over the timed steps
    first_step_s: float
    tokens_per_s: float
    peak_mib: list[float]  # per process; empty on a CPU
    graphs: int | None = None  # fuse: graphs compiled on the first process
    eager_graphs: int | None = None  # fuse: graphs that ran eagerly there
    times_ms: list[float] = dataclasses.field(default_factory=list)  # the first process's step times
    step_peaks_mib: list[list[float]] = dataclasses.field(default_factory=list)  # per process, per timed step
    # per process: (MiB, where allocated) of the largest blocks live at the peak of one more step
    peak_blocks: list[list[tuple[float, str]]] = dataclasses.field(default_factory=list)
    # per process, per timed step: MiB allocated as the step began (parameters, optimizer state, ...)
    step_base_mib: list[list[float]] = dataclasses.field(default_factory=list)
    # per process, with peak_blocks: (MiB, what) of the blocks allocated between steps that are
    # no parameter, gradient or optimizer state, by size
    resident: list[list[tuple[float, str]]] = dataclasses.field(default_factory=list)
    interleaved: bool = False  # stepped in turn with the other variants, in the same processes
    loss_rdiff: float | None = None  # the largest |loss - eager's| / |eager's| over the steps


def blocks(model: nn.Module) -> nn.ModuleList:
    """The model's transformer blocks: the longest ``nn.ModuleList`` whose members share a class."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0
             and len({type(c) for c in m}) == 1]
    if not lists:
        raise ValueError(f"{type(model).__name__}: no list of transformer blocks to shard")
    return max(lists, key=len)


def _wrap(model: nn.Module, setup: str, variant: str, device: torch.device, bucket_mb: float | None) -> nn.Module:
    import fusebackend

    # the function itself: where the package is not installed, the name "fuse" is not registered
    backend = {"eager": None, "fuse": fusebackend.fuse}.get(variant, variant)
    if setup == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        options = {}
        if bucket_mb is not None:
            # DDP's first bucket is 1 MiB, and Dynamo's DDP optimizer asserts that no bucket is
            # smaller: several buckets of a tiny model need a smaller first one too
            dist._DEFAULT_FIRST_BUCKET_BYTES = min(dist._DEFAULT_FIRST_BUCKET_BYTES, int(bucket_mb * 2**20))
            options["bucket_cap_mb"] = bucket_mb
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                          **options)
        return wrapped if backend is None else torch.compile(wrapped, backend=backend)
    from torch.distributed.fsdp import fully_shard

    for block in blocks(model):
        fully_shard(block)
        if backend is not None:
            block.compile(backend=backend)
    fully_shard(model)
    return model


def _worker(rank: int, world: int, port: int, model_name: str, size: str, setup: str, variants: list[str],
            steps: int, out_dir: str, options: Options) -> None:
    import fusebackend
    from benchmarks.zoo.registry import ZOO

    cuda = torch.cuda.is_available() and size == "real"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    dtype = torch.bfloat16 if cuda else torch.float32

    def trainer(variant: str) -> _Trainer:
        return _Trainer(ZOO[model_name], size, setup, variant, rank, world, device, dtype, options)

    def save(result: Result) -> None:
        if rank == 0:
            with open(os.path.join(out_dir, f"{setup}-{result.variant}.json"), "w") as f:
                json.dump(dataclasses.asdict(result), f)

    try:
        if options.interleave:
            # every variant's model at once, one step of each in turn, the order rotated each round:
            # a slow stretch of the machine falls on every variant alike
            trainers = [trainer(v) for v in variants]
            for step in range(steps):
                for i in range(len(trainers)):
                    trainers[(step + i) % len(trainers)].step(step)
            for t in trainers:
                save(t.result())
        else:
            for variant in variants:
                torch._dynamo.reset()
                fusebackend.metrics.reset()
                t = trainer(variant)
                for step in range(steps):
                    t.step(step)
                save(t.result())
                del t
        # every process past its last collective before any tears the group down: a process
        # that destroyed its gloo group while the other still sent into it aborted at exit
        # ("terminate called without an active exception", 3 of 10 runs of the tiny FSDP2 on a CPU)
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _Trainer:
    """One variant's model and optimizer on this process, stepped on this process's batches."""

    def __init__(self, entry: Any, size: str, setup: str, variant: str, rank: int, world: int,
                 device: torch.device, dtype: torch.dtype, options: Options) -> None:
        built = entry.build(size, device, dtype)  # the same weights on every process (fixed seed)
        self.batch, self.seq = built.train_inputs["input_ids"].shape
        self.vocab = built.model.config.vocab_size
        self.model = _wrap(built.model, setup, variant, device, options.bucket_mb)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.setup, self.variant, self.rank, self.world = setup, variant, rank, world
        self.device, self.options = device, options
        self.cuda = device.type == "cuda"
        self.losses: list[float] = []
        self.times: list[float] = []
        self.peaks: list[float] = []
        self.bases: list[float] = []

    def _step(self, step: int) -> torch.Tensor:
        from benchmarks.zoo.common import tokens

        # each process and step its own batch, the same for every variant
        ids = tokens(self.batch, self.seq, self.vocab, self.device, offset=1000 * step + self.rank)
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def step(self, step: int) -> None:
        """One timed step: its wall time (the device synchronized), peak and starting memory, and
        the loss averaged over the processes."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.bases.append(torch.cuda.memory_allocated(self.device) / 2**20)
        start = time.perf_counter()
        loss = self._step(step)
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.peaks.append(torch.cuda.max_memory_allocated(self.device) / 2**20)
        self.times.append(time.perf_counter() - start)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        self.losses.append(mean.item() / self.world)

    def result(self) -> Result:
        """The variant's figures over every process (collective: every process calls it)."""
        import fusebackend

        cuda, device, world = self.cuda, self.device, self.world
        timed = self.times[WARMUP:] or self.times
        median = torch.tensor(statistics.median(timed), dtype=torch.float64, device=device)
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        mine = torch.tensor([self.peaks[WARMUP:], self.bases[WARMUP:]] if cuda else [[0.0]], dtype=torch.float64,
                            device=device)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)  # each process's peak and base in each timed step
        at_peak: list[Any] = [None] * world
        resident: list[Any] = [None] * world
        if cuda and self.options.peak_blocks:
            from benchmarks.studies.memory_study import live_at_peak

            dist.all_gather_object(resident, _resident(self.model, self.optimizer, device))
            _, _, live = live_at_peak(lambda: self._step(len(self.times)), device)
            dist.all_gather_object(at_peak, _largest(live, self.options.peak_blocks))
        fused = self.variant == "fuse"
        return Result(self.setup, self.variant, world, self.losses, median.item() * 1e3, self.times[0],
                      world * self.batch * self.seq / median.item(),
                      [p[0].max().item() for p in every] if cuda else [],
                      fusebackend.metrics.graphs_compiled if fused else None,
                      fusebackend.metrics.eager_graphs if fused else None, [t * 1e3 for t in self.times],
                      [p[0].tolist() for p in every] if cuda else [], at_peak if at_peak[0] is not None else [],
                      [p[1].tolist() for p in every] if cuda else [], resident if resident[0] is not None else [],
                      interleaved=self.options.interleave)


def _resident(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> list[tuple[float, str]]:
    """The blocks allocated between steps that hold no parameter, gradient or optimizer state,
    counted by size, in MiB (what a variant keeps from step to step beyond the model's own)."""
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t  # FSDP2's parameters are DTensors

    known = []
    for p in model.parameters():
        known += [local(p)] + ([local(p.grad)] if p.grad is not None else [])
    for state in optimizer.state.values():
        known += [local(v) for v in state.values() if isinstance(v, torch.Tensor)]
    starts = sorted(t.untyped_storage().data_ptr() for t in known if t.device == device)
    torch.cuda.synchronize(device)
    counts: dict[int, int] = {}
    for segment in torch.cuda.memory._snapshot()["segments"]:
        if segment["device"] != device.index:
            continue
        address = segment["address"]
        for block in segment["blocks"]:
            start, address = address, address + block["size"]
            if block["state"] != "active_allocated":
                continue
            i = bisect.bisect_left(starts, start)
            if i < len(starts) and starts[i] < address:
                continue  # a parameter, gradient or optimizer state lives here
            counts[block["size"]] = counts.get(block["size"], 0) + 1
    return sorted(((n * size / 2**20, f"{n} x {size:,} B") for size, n in counts.items()), reverse=True)


def _largest(live: list[tuple[int, str]], count: int) -> list[tuple[float, str]]:
    """The ``count`` largest of the blocks live at a peak, in MiB, those allocated at the same
    place summed."""
    by_place: dict[str, int] = {}
    for size, where in live:
        by_place[where] = by_place.get(where, 0) + size
    return sorted(((n / 2**20, where) for where, n in by_place.items()), reverse=True)[:count]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(setups: list[str], variants: list[str], size: str = "real", steps: int = 20, model: str = "llama",
        out_dir: str = "bench_out", world: int | None = None, together: bool = False,
        options: Options = Options()) -> list[Result]:
    """Every setup under every variant (eager first: the losses' reference), each in fresh
    processes (``together``: a setup's variants one after another in the same processes, which
    saves their start-up on a CPU). ``options``: see ``Options``.
    Returns the results, eager's first per setup."""
    cuda = torch.cuda.is_available() and size == "real"
    world = world or (torch.cuda.device_count() if cuda else 2)
    variants = ["eager"] + [v for v in variants if v != "eager"]
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for setup in setups:
        for group in ([variants] if together or options.interleave else [[v] for v in variants]):
            mp.start_processes(_worker, args=(world, _free_port(), model, size, setup, group, steps, out_dir,
                                                     options),
                               nprocs=world, start_method="spawn")
        done = []
        for variant in variants:
            with open(os.path.join(out_dir, f"{setup}-{variant}.json")) as f:
                done.append(Result(**json.load(f)))
        for r in done:
            r.loss_rdiff = max(abs(a - b) / abs(b) for a, b in zip(r.losses, done[0].losses))
        results += done
    return results


def table(results: list[Result], dtype: torch.dtype) -> str:
    tol = LOSS_RTOL[dtype]
    lines = ["| setup | variant | tokens/s | over eager | step ms | first step s | peak MiB per GPU (max; each) "
             f"| loss vs eager (rel., tol. {tol:g}) | graphs (eager) |", "|" + "---|" * 9]
    eager = {r.setup: r for r in results if r.variant == "eager"}
    for r in results:
        peaks = f"{max(r.peak_mib):.0f}; {', '.join(f'{p:.0f}' for p in r.peak_mib)}" if r.peak_mib else "n/a"
        peaks = "n/a (interleaved)" if r.interleaved else peaks
        graphs = f"{r.graphs} ({r.eager_graphs})" if r.graphs is not None else "-"
        ok = "" if r.loss_rdiff is None or r.loss_rdiff <= tol else " **over**"
        lines.append(f"| {r.setup} | {r.variant} | {r.tokens_per_s:,.0f} | {r.tokens_per_s / eager[r.setup].tokens_per_s:.2f}x "
                     f"| {r.step_ms:.2f} | {r.first_step_s:.1f} | {peaks} | {r.loss_rdiff:.1e}{ok} | {graphs} |")
    for setup, first in eager.items():
        if first.interleaved:
            lines.append(f"\n{setup}, stepped in turn: the median over timed rounds of a variant's step time over eager's:")
            lines += [f"    {r.variant}: {_paired(r, first):.3f}" for r in results if r.setup == setup]
    for r in results:
        for rank, blocks in enumerate(r.peak_blocks):
            lines.append(f"\n{r.setup} {r.variant}, process {rank}: the largest blocks live at the peak of a step")
            lines += [f"    {mib:9.1f} MiB  {where}" for mib, where in blocks]
    for r in results:
        for rank, (blocks, base) in enumerate(zip(r.resident, r.step_base_mib)):
            lines.append(f"\n{r.setup} {r.variant}, process {rank}: {max(base):.1f} MiB allocated between steps; "
                         f"of it, {sum(m for m, _ in blocks):.1f} MiB neither parameters, gradients nor optimizer state:")
            lines += [f"    {mib:9.1f} MiB  {what}" for mib, what in blocks[:12]]
    return "\n".join(lines)


def _paired(r: Result, base: Result) -> float:
    """The median over the timed rounds of ``r``'s step time over ``base``'s in the same round."""
    return statistics.median(a / b for a, b in zip(r.times_ms[WARMUP:], base.times_ms[WARMUP:]))


def chart(folder: str, path: str, title: str) -> str | None:
    """A PNG of tokens/s per setup, a bar per variant, from the JSON a run wrote into ``folder``
    (``<setup>-<variant>.json``), or into each of its subfolders (several runs: a group per run
    and setup); ``report.bars``, None where nothing was found."""
    import glob

    from benchmarks import report

    runs = [folder] + sorted(d for d in glob.glob(os.path.join(folder, "*")) if os.path.isdir(d))
    found: dict[tuple[str, str], dict[str, float]] = {}
    for run in runs:
        for file in sorted(glob.glob(os.path.join(run, "*-*.json"))):
            with open(file) as f:
                data = json.load(f)
            name = os.path.relpath(run, folder)
            found.setdefault((data["setup"], "" if name == "." else name), {})[data["variant"]] = data["tokens_per_s"]
    variants = [v for v in ("fuse", "inductor", "eager") if any(v in d for d in found.values())]
    groups = sorted(found)
    return report.bars([f"{setup} {run}".strip() for setup, run in groups],
                       {v: [found[g].get(v) for g in groups] for v in variants}, path, title,
                       "tokens/s, all processes", fmt="{:,.0f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--model", default="llama", help="a zoo language model that takes input_ids and labels")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world", type=int, default=None, help="processes (default: every GPU, or 2 on a CPU)")
    parser.add_argument("--bucket-mb", type=float, default=None, help="DDP's bucket size (default 25)")
    parser.add_argument("--peak-blocks", type=int, default=0,
                        help="GPU: list this many of the largest blocks live at the peak of one more step")
    parser.add_argument("--interleave", action="store_true",
                        help="all variants in the same processes, one step of each in turn (paired step times; "
                             "the peaks then include the other variants' models)")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    parser.add_argument("--chart-from", default=None, metavar="DIR",
                        help="run nothing: the chart of the runs saved in DIR (or in its subfolders), to --out")
    args = parser.parse_args(argv)
    if args.chart_from:
        os.makedirs(args.out, exist_ok=True)
        print(chart(args.chart_from, os.path.join(args.out, "distributed.png"), f"{args.model}: {args.chart_from}")
              or "no chart: no run found, or matplotlib is not installed")
        return
    results = run(args.setups.split(","), args.variants.split(","), args.size, args.steps, args.model, args.out,
                  args.world, options=Options(args.bucket_mb, args.peak_blocks, args.interleave))
    cuda = torch.cuda.is_available() and args.size == "real"
    text = table(results, torch.bfloat16 if cuda else torch.float32)
    device = torch.cuda.get_device_name() if cuda else "CPU (gloo)"
    header = (f"{args.model} ({args.size}), {results[0].world} processes on {device}, {args.steps} steps, "
              f"torch {torch.__version__}\n\n")
    with open(os.path.join(args.out, "distributed.md"), "w") as f:
        f.write(header + text + "\n")
    chart(args.out, os.path.join(args.out, "distributed.png"), header.strip())
    print(header + text)
    if not all(math.isfinite(loss) for r in results for loss in r.losses):
        sys.exit("a loss is not finite")


if __name__ == "__main__":
    main()
