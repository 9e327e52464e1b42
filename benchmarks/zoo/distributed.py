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

``PYTHONPATH=. python -m benchmarks.zoo.distributed --out "$OUT"`` (the zoo's Llama, real size,
bf16, 20 steps, both setups, eager / Inductor / fuse, on every visible GPU); ``--size tiny`` with
two CPU processes (gloo, fp32, kernels in Triton's interpreter). The tests
(``tests/test_distributed.py``) call ``run`` with the tiny size.
"""

from __future__ import annotations

import argparse
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
    try:
        for variant in variants:
            torch._dynamo.reset()
            fusebackend.metrics.reset()
            result = _train(ZOO[model_name], size, setup, variant, steps, rank, world, device, dtype, options)
            if rank == 0:
                with open(os.path.join(out_dir, f"{setup}-{variant}.json"), "w") as f:
                    json.dump(dataclasses.asdict(result), f)
        # every process past its last collective before any tears the group down: a process
        # that destroyed its gloo group while the other still sent into it aborted at exit
        # ("terminate called without an active exception", 3 of 10 runs of the tiny FSDP2 on a CPU)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train(entry: Any, size: str, setup: str, variant: str, steps: int, rank: int, world: int,
           device: torch.device, dtype: torch.dtype, options: Options) -> Result:
    import fusebackend
    from benchmarks.zoo.common import tokens

    built = entry.build(size, device, dtype)  # the same weights on every process (fixed seed)
    batch, seq = built.train_inputs["input_ids"].shape
    vocab = built.model.config.vocab_size
    model = _wrap(built.model, setup, variant, device, options.bucket_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    cuda = device.type == "cuda"

    def train_step(step: int) -> torch.Tensor:
        ids = tokens(batch, seq, vocab, device, offset=1000 * step + rank)  # each process and step its own
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    losses, times, peaks = [], [], []
    for step in range(steps):
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        loss = train_step(step)
        if cuda:
            torch.cuda.synchronize(device)
            peaks.append(torch.cuda.max_memory_allocated(device) / 2**20)
        times.append(time.perf_counter() - start)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    timed = times[WARMUP:] or times
    median = torch.tensor(statistics.median(timed), dtype=torch.float64, device=device)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    mine = torch.tensor(peaks[WARMUP:] if cuda else [0.0], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)  # each process's peak in each timed step
    at_peak: list[Any] = [None] * world
    if cuda and options.peak_blocks:
        from benchmarks.memory_study import live_at_peak

        _, _, live = live_at_peak(lambda: train_step(steps), device)
        dist.all_gather_object(at_peak, _largest(live, options.peak_blocks))
    fused = variant == "fuse"
    return Result(setup, variant, world, losses, median.item() * 1e3, times[0], world * batch * seq / median.item(),
                  [p.max().item() for p in every] if cuda else [],
                  fusebackend.metrics.graphs_compiled if fused else None,
                  fusebackend.metrics.eager_graphs if fused else None, [t * 1e3 for t in times],
                  [p.tolist() for p in every] if cuda else [], at_peak if at_peak[0] is not None else [])


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
        for group in ([variants] if together else [[v] for v in variants]):
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
        graphs = f"{r.graphs} ({r.eager_graphs})" if r.graphs is not None else "-"
        ok = "" if r.loss_rdiff is None or r.loss_rdiff <= tol else " **over**"
        lines.append(f"| {r.setup} | {r.variant} | {r.tokens_per_s:,.0f} | {r.tokens_per_s / eager[r.setup].tokens_per_s:.2f}x "
                     f"| {r.step_ms:.2f} | {r.first_step_s:.1f} | {peaks} | {r.loss_rdiff:.1e}{ok} | {graphs} |")
    for r in results:
        for rank, blocks in enumerate(r.peak_blocks):
            lines.append(f"\n{r.setup} {r.variant}, process {rank}: the largest blocks live at the peak of a step")
            lines += [f"    {mib:9.1f} MiB  {where}" for mib, where in blocks]
    return "\n".join(lines)


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
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = parser.parse_args(argv)
    results = run(args.setups.split(","), args.variants.split(","), args.size, args.steps, args.model, args.out,
                  args.world, options=Options(args.bucket_mb, args.peak_blocks))
    cuda = torch.cuda.is_available() and args.size == "real"
    text = table(results, torch.bfloat16 if cuda else torch.float32)
    device = torch.cuda.get_device_name() if cuda else "CPU (gloo)"
    header = (f"{args.model} ({args.size}), {results[0].world} processes on {device}, {args.steps} steps, "
              f"torch {torch.__version__}\n\n")
    with open(os.path.join(args.out, "distributed.md"), "w") as f:
        f.write(header + text + "\n")
    print(header + text)
    if not all(math.isfinite(loss) for r in results for loss in r.losses):
        sys.exit("a loss is not finite")


if __name__ == "__main__":
    main()
