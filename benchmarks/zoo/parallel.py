"""The zoo in several processes at once, and each model in several processes.

``python -m benchmarks.zoo --parallel N --processes K`` runs every (model, mode) of the run ``K``
times, each time in a process of its own, ``N`` processes at a time. On a machine with GPUs each
of the ``N`` slots has a GPU of its own (``CUDA_VISIBLE_DEVICES``), as long as there are as many
GPUs as slots; a model's processes take the queue in turn, so that its ``K`` runs fall on other
GPUs and at other times. Each child is the zoo's own command for one model and mode, with fresh
cache folders of its own, writing under ``<out>/processes/``.

The queue is staggered (``job_order``): a model's second process comes right after its first
(on another slot, so on another GPU where there are two or more), then the next model's first,
so that a run cut short (a job's time limit) leaves every model but the last measured in each
process. Where slots outnumber GPUs, the children on one GPU take turns to time and profile
(``gpu_turn``: a lock file per GPU, named in ``$FUSE_ZOO_GPU_TURN``) while the others build,
check and compile: a quick survey of many models on one GPU. The steps are timed alone on the GPU
but not on the host (other processes' compiles share its cores), and the runs say so. The rows of the ``k``-th process of every model are one run, written as the zoo
writes one (``<name>_p<k>.json``, ``.md``) after each child, with ``"partial": true`` in the
environment until the last, then with its chart (``.png``); a table gives fuse over Inductor
per model in each process and the lowest of them: a model is as fast as its slowest process
says (a host shared by several processes moves host-bound steps by up to a third between them).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from benchmarks.zoo import chart, report
from benchmarks.zoo.rows import ZooRow


def main(args: argparse.Namespace, items: list[tuple[str, str]], device: torch.device, env: dict[str, Any],
         out: str, name: str, argv: list[str],
         finish: Callable[[list[ZooRow], dict[str, Any], str, str], None]) -> list[ZooRow]:
    """The runner's ``--parallel`` / ``--processes``: ``run``, each process number's rows written as
    one run (``finish``, the runner's end of a run, for the first: its table and chart), and the
    table of fuse over Inductor per process. The first run's rows are returned."""
    if args.cache_dir:
        raise SystemExit("--cache-dir with --parallel: processes at once would share the cache folders")
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    workers = args.parallel or max(1, gpus)
    if gpus and workers > gpus:
        print(f"zoo: {workers} processes at a time on {gpus} GPU(s): those on one GPU take turns to time it",
              flush=True)
        env = dict(env, gpu=SHARED)
    def written_so_far(runs: list[list[ZooRow]]) -> None:
        for p, rows in enumerate(runs, 1):
            if rows:
                report.write(rows, dict(env, process=p, partial=True), out, f"{name}_p{p}")

    runs = run(items, child_arguments(argv), workers, max(1, args.processes), out, gpus, progress=written_so_far)
    for p, rows in enumerate(runs, 1):
        paths = report.write(rows, dict(env, process=p), out, f"{name}_p{p}")
        if p > 1:  # the first's is drawn by finish, with its table
            try:
                paths += [c for c in [chart.render(rows, env, os.path.join(out, f"{name}_p{p}.png"))] if c]
            except ImportError:
                pass
        print(f"process {p}: wrote {', '.join(paths)}")
    finish(runs[0], env, out, f"{name}_p1")
    print("\nfuse over Inductor in each process:\n" + table(runs))
    return runs[0]


TURN = "FUSE_ZOO_GPU_TURN"  # the lock file of the GPU a child shares with others
SHARED = "shared: timed in turns, while other processes compiled on the host"  # the runs' environment says


@contextlib.contextmanager
def gpu_turn() -> Iterator[None]:
    """This process's turn on its GPU, where it shares the GPU with other children of one run
    (``$FUSE_ZOO_GPU_TURN`` names the GPU's lock file): held while its steps are timed and
    profiled, so that no other child's timing runs meanwhile. Elsewhere it does nothing."""
    path = os.environ.get(TURN)
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def child_arguments(argv: Sequence[str]) -> list[str]:
    """The options a child takes from the parent's command line: all but those that choose the
    models, the output and the processes."""
    skip = {"--models", "--mode", "--out", "--parallel", "--processes"}
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in skip:
            i += 1 if "=" in arg else 2
            continue
        if name == "--train":
            i += 1
            continue
        out.append(arg)
        i += 1
    return out


def job_order(items: Sequence[tuple[str, str]], processes: int) -> list[tuple[int, str, str]]:
    """(process number, model, mode) in the order the children start: item ``i``'s process
    ``p`` in turn ``i + p - 1``, the later process first within a turn."""
    turns = len(items) + processes - 1
    return [(p, *items[t - p + 1]) for t in range(turns) for p in range(processes, 0, -1) if 0 <= t - p + 1 < len(items)]


def run(items: Sequence[tuple[str, str]], passed: Sequence[str], workers: int, processes: int, out: str,
        gpus: int, log: Callable[[str], None] = print,
        progress: Callable[[list[list[ZooRow]]], None] | None = None) -> list[list[ZooRow]]:
    """Each of ``items`` ``processes`` times, ``workers`` children at once (slot ``i`` on GPU ``i``
    where there are ``gpus``); the rows of each process number, in the order of ``items``.
    ``progress``: called with the rows of the children done so far after each one ends."""
    queue = job_order(items, processes)
    lock = threading.Lock()
    folders: dict[tuple[int, str, str], str] = {}
    start = time.perf_counter()

    def collect() -> list[list[ZooRow]]:
        runs: list[list[ZooRow]] = []
        for p in range(1, processes + 1):
            rows: list[ZooRow] = []
            for model, mode in items:
                folder = folders.get((p, model, mode))
                if folder is None:  # not run yet
                    continue
                found = [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".json")]
                if not found:
                    rows.append(ZooRow(model, mode, status="ERROR", message=f"no results: see {folder}/log.txt"))
                    continue
                saved, _ = report.load(found, log=lambda _: None)
                rows += saved or [ZooRow(model, mode, status="ERROR", message=f"no row: see {folder}/log.txt")]
            runs.append(rows)
        return runs

    def worker(slot: int) -> None:
        while True:
            with lock:
                if not queue:
                    return
                p, model, mode = queue.pop(0)
            folder = os.path.join(out, "processes", f"{model.replace(':', '-')}_{mode}_p{p}")
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(slot % gpus)
                if workers > gpus:
                    env[TURN] = os.path.join(out, "processes", f"gpu{slot % gpus}.turn")
            cmd = [sys.executable, "-m", "benchmarks.zoo", "--models", model, "--mode", mode, "--out", folder, *passed]
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "log.txt"), "w") as stream:
                code = subprocess.run(cmd, env=env, stdout=stream, stderr=subprocess.STDOUT).returncode
            with lock:
                folders[(p, model, mode)] = folder
                where = f" on GPU {slot % gpus}" if gpus else ""
                log(f"[{time.perf_counter() - start:6.0f} s] {model} ({mode}), process {p}{where}: "
                    + ("done" if code == 0 else f"exit {code}, see {folder}/log.txt"))
                if progress is not None:
                    progress(collect())

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return collect()


def table(runs: Sequence[Sequence[ZooRow]]) -> str:
    """fuse over Inductor (their median times) per model and mode in each process, and the lowest."""
    head = ["model", "mode"] + [f"process {p}" for p in range(1, len(runs) + 1)] + ["lowest"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rows in zip(*runs):
        ratios = []
        for row in rows:
            i, f = row.inductor, row.fuse
            ok = row.status == "ok" and i is not None and f is not None and i.median_ms and f.median_ms
            ratios.append(i.median_ms / f.median_ms if ok else None)  # type: ignore[union-attr,operator]
        cells = ["-" if r is None else f"{r:.2f}x" for r in ratios]
        known = [r for r in ratios if r is not None]
        lines.append(f"| {rows[0].model} | {rows[0].mode} | " + " | ".join(cells)
                     + f" | {f'{min(known):.2f}x' if known else '-'} |")
    return "\n".join(lines)
