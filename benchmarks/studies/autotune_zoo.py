"""GPU: does ``mode="max-autotune"`` make any zoo model slower? The zoo with eager, fuse and fuse
tuned (``fuse@max-autotune-no-cudagraphs``) in several processes, and the comparison.

1. Warm-up (``--warm-jobs`` processes side by side, ``--no-timing``): every model compiled under
   both fuse variants into one cache folder, so that the timed processes spend their device time
   timing. The choices that tuning made there (kernels timed while other processes shared the
   GPU) are deleted; only the compiled graphs and kernels are kept.
2. ``--processes`` timed zoo processes, one after another, on that cache folder. The first tunes
   every kernel alone on the GPU and stores its choices; the later ones load them, as a user's
   second process would. With several GPUs, one process runs on each at once (each alone on its
   GPU; those started together tune side by side, and a choice one stores first the other may
   load); the warm-up's jobs are spread over them. Each gives GPU ms per step (CUDA events around steps issued behind a
   sleep: the kernels' time, not the host's).
3. The table: per model, fuse tuned over fuse by GPU ms in each process (its range), marked
   slower where it is slower by more than ``SLOWER`` in every process; and the geometric mean
   speedup over eager of each variant in each process.

``PYTHONPATH=. python -m benchmarks.studies.autotune_zoo --work /tmp/at --out "$OUT"`` (all inference
models: on an H100 the warm-up took 195 s with 8 jobs and a timed process 437 s, 2026-11-25);
``--stage warm`` or ``--stage time`` for one stage (a device call is limited to 10 minutes);
``--from DIR`` prints the table of saved runs. A timed process cut short still counts as done.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time

from benchmarks.zoo.registry import ZOO

VARIANTS = "eager,fuse,fuse@max-autotune-no-cudagraphs"
TUNED = "fuse@max-autotune-no-cudagraphs"
SLOWER = 0.01  # tuned over default above 1 + SLOWER in every process: slower


TINY: list[str] = []  # ["--tiny"] with --tiny


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if not TINY else 0


def _zoo(models: list[str], out: str, cache: str, extra: list[str], log: str, gpu: int | None = None) -> subprocess.Popen:
    """A zoo process over ``models`` (on GPU ``gpu`` alone where given)."""
    command = [sys.executable, "-m", "benchmarks.zoo", "--mode", "inference", "--models", ",".join(models),
               "--variants", VARIANTS, "--cache-dir", cache, "--out", out, *TINY, *extra]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu)) if gpu is not None else None
    return subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def warm(models: list[str], work: str, jobs: int) -> None:
    cache = os.path.join(work, "cache")
    procs = []
    for k in range(jobs):
        part = models[k::jobs]
        if part:
            out = os.path.join(work, f"warm{k}")
            os.makedirs(out, exist_ok=True)
            procs.append(_zoo(part, out, cache, ["--no-timing"], os.path.join(out, "log.txt"),
                              k % _gpus() if _gpus() > 1 else None))
    for p in procs:
        p.wait()
    shutil.rmtree(os.path.join(cache, "fuse", "autotune"), ignore_errors=True)  # timed on a shared GPU


def timed(models: list[str], work: str, processes: int, rep_ms: float) -> None:
    cache = os.path.join(work, "cache")
    done = len(glob.glob(os.path.join(work, "p*", "zoo*.json")))
    gpus = max(_gpus(), 1)
    for first in range(done, done + processes, gpus):  # one process per GPU at a time
        start, procs = time.time(), {}
        for k in range(first, min(first + gpus, done + processes)):
            out = os.path.join(work, f"p{k + 1}")
            os.makedirs(out, exist_ok=True)
            procs[k] = _zoo(models, out, cache, ["--rep-ms", str(rep_ms)], os.path.join(out, "log.txt"),
                            k - first if gpus > 1 else None)
        for k, proc in procs.items():
            print(f"process {k + 1}: exit {proc.wait()}, {time.time() - start:.0f} s", flush=True)


def _rows(path: str) -> dict[str, dict[str, float]]:
    """model -> variant -> GPU ms, from one zoo JSON."""
    with open(path) as f:
        data = json.load(f)
    rows: dict[str, dict[str, float]] = {}
    for row in data["rows"]:
        for v in row["variants"]:
            if v.get("gpu_ms") and v["status"] in ("ok", "ref"):
                rows.setdefault(row["model"], {})[v["variant"]] = v["gpu_ms"]
    return rows


def table(work: str) -> str:
    runs = [_rows(p) for p in sorted(glob.glob(os.path.join(work, "p*", "zoo*.json")))]
    if not runs:
        return "no timed runs under " + work
    models = sorted(set().union(*runs), key=lambda m: list(ZOO).index(m) if m in ZOO else 0)
    lines = [f"GPU ms per step, {len(runs)} processes; tuned = {TUNED}", "",
             "| model | eager | fuse | fuse tuned | tuned / fuse, per process | |", "|---|---|---|---|---|---|"]
    slower = []
    for m in models:
        per = [r[m] for r in runs if m in r and {"eager", "fuse", TUNED} <= r[m].keys()]
        if not per:
            lines.append(f"| {m} | | | | not timed in every variant | |")
            continue
        ratios = [p[TUNED] / p["fuse"] for p in per]
        mark = "slower" if min(ratios) > 1 + SLOWER else ""
        if mark:
            slower.append(m)
        cell = lambda v: "-".join(f"{x:.3f}" for x in (min(p[v] for p in per), max(p[v] for p in per)))
        lines.append(f"| {m} | {cell('eager')} | {cell('fuse')} | {cell(TUNED)} | "
                     + " ".join(f"{r:.3f}" for r in ratios) + f" | {mark} |")
    lines.append("")
    for k, r in enumerate(runs):
        both = [p for p in r.values() if {"eager", "fuse", TUNED} <= p.keys()]
        if both:
            geo = {v: math.exp(sum(math.log(p["eager"] / p[v]) for p in both) / len(both)) for v in ("fuse", TUNED)}
            lines.append(f"process {k + 1}: geomean speedup over eager by GPU ms over {len(both)} models: "
                         f"fuse {geo['fuse']:.3f}x, tuned {geo[TUNED]:.3f}x")
    lines.append(f"tuned slower than fuse by more than {SLOWER:.0%} in every process: {', '.join(slower) or 'none'}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.autotune_zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated zoo models (default: all)")
    parser.add_argument("--work", default="/tmp/autotune_zoo", help="the cache folder and each process's output")
    parser.add_argument("--stage", default="all", choices=("all", "warm", "time"))
    parser.add_argument("--warm-jobs", type=int, default=6)
    parser.add_argument("--processes", type=int, default=3, help="timed processes (more are added to those done)")
    parser.add_argument("--rep-ms", type=float, default=50.0)
    parser.add_argument("--tiny", action="store_true", help="tiny configurations on the CPU (a smoke test: no times)")
    parser.add_argument("--out", default=None, help="where the table and the runs' JSON files are copied")
    parser.add_argument("--from", dest="source", default=None, help="print the table of the runs under this folder")
    args = parser.parse_args()
    if args.source:
        print(table(args.source))
        return
    models = [m for m in args.models.split(",") if m] or list(ZOO)
    if args.tiny:
        TINY.append("--tiny")
    if args.stage in ("all", "warm"):
        start = time.time()
        warm(models, args.work, args.warm_jobs)
        print(f"warm-up: {time.time() - start:.0f} s", flush=True)
    if args.stage in ("all", "time"):
        timed(models, args.work, args.processes, args.rep_ms)
    text = table(args.work)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "autotune_zoo.md"), "w") as f:
            f.write(text + "\n")
        for path in glob.glob(os.path.join(args.work, "p*", "zoo*.json")):
            shutil.copy(path, os.path.join(args.out, f"{os.path.basename(os.path.dirname(path))}_zoo.json"))


if __name__ == "__main__":
    main()
