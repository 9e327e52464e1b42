"""``mode="max-autotune"``: each generated kernel keeps the fastest of a few launch configurations.

The default mode launches each kernel with the block sizes and warps of the heuristics in
``runtime.py``. They were measured on a few shapes; a model has hundreds of others. In
max-autotune mode:

1. Codegen (``codegen.generate_all``) generates each kernel again for the candidates
   ``candidates`` gives: the heuristic's configuration with one of its blocks (XBLOCK, RBLOCK,
   a tile's YBLOCK, a product's KBLOCK) or its warps doubled or halved, and for a kernel that
   loops over its rows or a product over K, other pipelining stages, within bounds (a block no
   larger than the extent rounded up to a power of two, or for a tile one that divides it; at
   most 32768 elements; at least one element a thread). A candidate is a kernel of its own: its masks and whether it loops over a row
   follow from its blocks. Flat and tiled pointwise kernels, reductions, scans and scatters are
   all tuned.
2. On the kernel's first call, ``Tuner`` launches each candidate, the heuristic's too, on the
   call's inputs, with scratch tensors in place of the buffers it stores (an input the kernel
   writes in place is never written twice), and keeps the fastest: the median of ``REPEATS``
   launches, each timed by CUDA events, once after the L2 cache is overwritten before each
   launch and once with the inputs left in it (in a model a kernel finds its inputs in between).
   A candidate is kept only where it beats the heuristic's time by ``MARGIN`` both ways: a
   choice within the timing's noise, or one that wins only from memory or only from the L2
   cache, could as well be slower in the model. The fastest from memory is the one considered;
   the dumps give those times. Later calls launch the chosen one directly.
3. The choice is kept on disk (``<cache_dir>/autotune/``), under a key of the kernels' sources,
   sizes and launch configurations, the device's name and the Triton version; a later process
   loads only the chosen kernel and times nothing.

The dumps (``autotune.txt`` in the graph's dump folder; ``CompiledArtifacts.autotune``) list each
tuned kernel's candidates with their times and the choice. In Triton's interpreter (the test
suite) the candidates are timed by the host's clock: the choice means nothing there, but every
candidate runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import time
from typing import Any, Callable

import torch

from fusebackend import cache, ir
from fusebackend.config import use_interpreter
from fusebackend.kernels.runtime import Launcher, _next_pow2, gpu_shape, load_kernel

REPEATS = 10  # timed launches of each candidate
MAX_BLOCK = 1 << 15  # elements of one block
MAX_WARPS = 16
STAGES = (1, 2)  # software pipelining of a looped kernel's loop; Triton's default on a GPU is 3
PRODUCT_STAGES = (2, 3, 4)  # a product kernel's K loop: tiles of both factors in flight
MARGIN = 0.03  # a candidate replaces the heuristic's launch only where it is this much faster


def candidates(source: Any) -> list[dict[str, int]]:
    """Other launch configurations for a generated kernel (``codegen.body.KernelSource``): its
    blocks (XBLOCK, RBLOCK, YBLOCK: those it has) one at a time doubled or halved; its warps
    doubled or halved; and where it loops over its rows (RBLOCK under the row's extent), Triton's
    software pipelining of that loop at ``STAGES`` other than its default (a product's loop over K,
    KBLOCK a step of it, at ``PRODUCT_STAGES`` other than the heuristic's). A block stays within
    its extent rounded up to a power of two (a tile's must divide it: codegen drops those that do
    not), at most ``MAX_BLOCK`` elements and at least one element a thread. In the interpreter
    only blocks vary: warps and stages mean nothing there."""
    launch = source.launch
    interpret = use_interpreter()
    extents = {"XBLOCK": source.sizes[0], "RBLOCK": source.sizes[1] if len(source.sizes) > 1 else 1}
    blocks = tuple(k for k in ("XBLOCK", "RBLOCK", "YBLOCK", "KBLOCK") if k in launch)
    base = {k: launch[k] for k in blocks}
    warps = launch.get("num_warps", 4)
    steps: list[tuple[dict[str, int], dict[str, int]]] = []  # (blocks, compile options)
    for name in blocks:
        for factor in (2, 0.5):
            steps.append(({**base, name: int(base[name] * factor)}, {"num_warps": warps}))
    if not interpret:
        steps += [(base, {"num_warps": warps * 2}), (base, {"num_warps": warps // 2})]
        if "KBLOCK" in base:  # a product's loop over K: its stages as its own (the heuristic's)
            stages = launch.get("num_stages", 3)
            steps += [(base, {"num_warps": warps, "num_stages": n}) for n in PRODUCT_STAGES if n != stages]
        elif "RBLOCK" in base and base["RBLOCK"] < extents["RBLOCK"]:
            steps += [(base, {"num_warps": warps, "num_stages": n}) for n in STAGES]
    found: list[dict[str, int]] = []
    tiled = "YBLOCK" in base
    for blocks_of, options in steps:
        size = 1
        for name, value in blocks_of.items():
            if value < 1 or (not tiled and value > _next_pow2(max(extents[name], 1))):
                break
            if name != "KBLOCK":  # a product's K step is no part of its output's block
                size *= value
        else:
            w = options["num_warps"]
            if size > MAX_BLOCK or (not interpret and (w < 1 or w > MAX_WARPS or size < 32 * w)):
                continue
            candidate = dict(blocks_of) if interpret else {**blocks_of, **options}
            if candidate not in found:
                found.append(candidate)
    return found


def describe(launch: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in launch.items()
                     if k in ("XBLOCK", "YBLOCK", "RBLOCK", "KBLOCK", "num_warps", "num_stages"))


def bind(record: Any, device: str, home: dict[str, Any], report: Callable[[str, str], None]
         ) -> tuple[Any, list[Launcher]]:
    """What the wrapper's namespace binds for a kernel with candidates (a ``cache.KernelRecord``),
    and the launchers to compile ahead: the choice stored on disk, or a ``Tuner`` over all."""
    options = [(record.source, record.grid, record.launch), *record.variants]
    tuning_key = key([(src, launch) for src, _, launch in options], record.sizes, device)
    known = load(tuning_key, len(options))
    if known is not None:
        chosen, times = known
        source, grid, launch = options[chosen]
        report(record.name, report_text([launch for _, _, launch in options], times, chosen) + "  (from disk)")
        launcher = Launcher(load_kernel(record.name, source), grid, launch, home, record.name)
        return launcher, [launcher] if grid else []
    choices = [Launcher(load_kernel(record.name, source), grid, launch) for source, grid, launch in options]
    return Tuner(choices, record.written, tuning_key, home, record.name, report), [c for c in choices if c.grid[0]]


class Tuner:
    """Stands for a kernel with candidates in its wrapper's namespace until its first call, which
    times them (``Tuner.__call__``) and puts the fastest's ``Launcher`` there instead."""

    def __init__(self, choices: list[Launcher], written: tuple[int, ...], key: str, home: dict[str, Any],
                 name: str, report: Callable[[str, str], None]) -> None:
        self.choices = choices  # the heuristic's first
        self.written = written  # positions of the arguments the kernel stores into
        self.key, self.home, self.name, self.report = key, home, name, report
        self.failures: dict[int, str] = {}  # candidates that could not run: why

    def __call__(self, stream: int | None, *args: Any) -> None:
        if not use_interpreter() and torch.cuda.is_current_stream_capturing():
            chosen, times = 0, None  # nothing can be timed while a CUDA graph is recorded
        else:
            timed = [self._time_or_none(k, stream, args) for k in range(len(self.choices))]
            times = [cold for cold, _ in timed]
            chosen = min(range(len(times)), key=times.__getitem__)
            if any(t[chosen] > t[0] * (1 - MARGIN) for t in zip(*timed)):
                chosen = 0  # not clearly faster both ways: the heuristic's stays
            store(self.key, [c.launch for c in self.choices], times, chosen)
        launcher = self.choices[chosen]
        launcher.home, launcher.name = self.home, self.name
        self.home[self.name] = launcher
        self.report(self.name, report_text([c.launch for c in self.choices], times, chosen, self.failures))
        launcher(stream, *args)

    def _time_or_none(self, k: int, stream: int | None, args: tuple[Any, ...]) -> tuple[float, float]:
        """Candidate ``k``'s ``_time``; infinite where it cannot be compiled or launched on this
        device (Triton's OutOfResources: a product's tiles of fp32 over its shared memory), so that
        it is never chosen, its reason kept for the report. The heuristic's failure is an error."""
        try:
            return self._time(self.choices[k], stream, args)
        except Exception as exc:  # noqa: BLE001 - Triton raises several kinds; the reason is kept
            if k == 0:
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.failures[k] = f"{type(exc).__name__}: {first}"[:160]
            return math.inf, math.inf

    def _time(self, launcher: Launcher, stream: int | None, args: tuple[Any, ...]) -> tuple[float, float]:
        """Microseconds of one launch on ``args``, with scratch tensors for what it stores: with
        its inputs in memory (the L2 cache overwritten first) and with them in the L2 cache (a
        kernel in a model finds its inputs in between: some just written by the kernel before)."""
        scratch = tuple(torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
                        if k in self.written and isinstance(a, torch.Tensor) else a for k, a in enumerate(args))
        if use_interpreter():
            start = time.perf_counter()
            launcher(stream, *scratch)
            took = (time.perf_counter() - start) * 1e6
            return took, took
        launcher(stream, *scratch)  # its first launch: Triton's path, compiled if it was not
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        flush = torch.empty(max(gpu_shape(device.index)[1], 64 << 20) // 4, dtype=torch.int32, device=device)
        times = []
        for flushed in (True, False):
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPEATS)]
            for begin, end in events:
                if flushed:
                    flush.zero_()
                begin.record()
                launcher(stream, *scratch)
                end.record()
            torch.cuda.synchronize(device)
            times.append(statistics.median(b.elapsed_time(e) for b, e in events) * 1e3)
        return times[0], times[1]


def report_text(launches: list[dict[str, Any]], times: list[float] | None, chosen: int,
                failures: dict[int, str] | None = None) -> str:
    """One line per candidate: its blocks and warps, its time (or why it could not run), and
    which was chosen."""
    lines = []
    for k, launch in enumerate(launches):
        if times is None:
            took = "not timed (first called while a CUDA graph was recorded)"
        elif math.isinf(times[k]):
            took = f"could not run ({(failures or {}).get(k, 'on an earlier call')})"
        else:
            took = f"{times[k]:.2f} us"
        mark = "  <- chosen" if k == chosen else ""
        lines.append(f"  {'heuristic' if k == 0 else f'candidate {k}'}: {describe(launch)}: {took}{mark}")
    return "\n".join(lines)


_LINE = re.compile(r"^\s*(heuristic|candidate \d+): .*: ([0-9.]+) us(  <- chosen)?")


def summary(reports: dict[str, str]) -> dict[str, float]:
    """Totals over the tuned kernels' reports (``report_text``, by kernel): how many were tuned
    and timed, how many kept a candidate, and the sums of the heuristic's and the chosen
    launches' times (each timed alone, from memory: what tuning expected to save)."""
    totals = {"kernels": 0, "changed": 0, "heuristic_us": 0.0, "chosen_us": 0.0}
    for text in reports.values():
        times = [(m.group(1), float(m.group(2)), bool(m.group(3))) for m in map(_LINE.match, text.splitlines()) if m]
        if not times:
            continue  # not timed (first called while a CUDA graph was recorded)
        chosen = next(t for t in times if t[2])
        totals["kernels"] += 1
        totals["changed"] += chosen[0] != "heuristic"
        totals["heuristic_us"] += times[0][1]
        totals["chosen_us"] += chosen[1]
    return totals


def key(sources: list[tuple[str, dict[str, Any]]], sizes: tuple[int, ...], device: str) -> str:
    """The disk key of a kernel's choice: its candidates' sources and launches, its sizes, the
    device's name and the Triton version."""
    import triton

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "interpreter"
    text = repr((sources, sizes, name, triton.__version__, torch.__version__))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(key: str) -> str | None:
    folder = cache.folder("autotune")
    return os.path.join(folder, f"{key}.json") if folder is not None else None


def load(key: str, count: int) -> tuple[int, list[float] | None] | None:
    """The choice stored under ``key`` among ``count`` candidates, and their times; None where
    there is none (or it does not read)."""
    path = _path(key)
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        chosen, times = int(record["chosen"]), record["times_us"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 <= chosen < count or len(times) != count:
        return None
    return chosen, [float(t) for t in times]


def store(key: str, launches: list[dict[str, Any]], times: list[float], chosen: int) -> None:
    path = _path(key)
    if path is not None:
        record = {"chosen": chosen, "times_us": times, "launches": launches}
        cache.write_atomic(path, json.dumps(record, indent=1).encode())
