"""``mode="max-autotune"``: each generated kernel keeps the fastest of a few launch configurations.

The default mode launches each kernel with the block sizes and warps of the heuristics in
``runtime.py``. They were measured on a few shapes; a model has hundreds of others. In
max-autotune mode:

1. Codegen (``codegen.generate_all``) generates each reduction and each flat pointwise kernel
   again for the candidates ``candidates`` gives: the heuristic's configuration with one of
   XBLOCK, RBLOCK or num_warps doubled or halved, within bounds (a block no larger than the
   extent rounded up to a power of two, at most 32768 elements, at least one element a thread).
   A candidate is a kernel of its own: its masks and whether it loops over a row follow from its
   blocks. Tiled pointwise kernels, scans and scatters keep their configuration.
2. On the kernel's first call, ``Tuner`` launches each candidate, the heuristic's too, on the
   call's inputs, with scratch tensors in place of the buffers it stores (an input the kernel
   writes in place is never written twice), and keeps the fastest: the median of ``REPEATS``
   launches, each timed by CUDA events after the L2 cache is overwritten. Later calls launch the
   chosen one directly.
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
import os
import statistics
import time
from typing import Any, Callable

import torch

from fusebackend import cache, ir
from fusebackend.config import use_interpreter
from fusebackend.kernels.runtime import Launcher, _next_pow2, load_kernel

REPEATS = 10  # timed launches of each candidate
MAX_BLOCK = 1 << 15  # elements of one block
MAX_WARPS = 16


def candidates(source: Any) -> list[dict[str, int]]:
    """Other launch configurations for a generated kernel (``codegen.body.KernelSource``): none
    for tiles, scans and scatters."""
    launch = source.launch
    if "YBLOCK" in launch or any(isinstance(n, (ir.Scatter, ir.Scan)) for n in source.plan.nodes):
        return []
    interpret = use_interpreter()
    reduction = "RBLOCK" in launch
    extents = {"XBLOCK": source.sizes[0], "RBLOCK": source.sizes[1] if reduction else 1}
    blocks = ("XBLOCK", "RBLOCK") if reduction else ("XBLOCK",)
    base = {k: launch[k] for k in blocks}
    warps = launch.get("num_warps", 4)
    steps: list[tuple[dict[str, int], int]] = []
    for name in blocks:
        for factor in (2, 0.5):
            steps.append(({**base, name: int(base[name] * factor)}, warps))
    if not interpret:
        steps += [(base, warps * 2), (base, warps // 2)]
    found: list[dict[str, int]] = []
    for blocks_of, w in steps:
        size = 1
        for name, value in blocks_of.items():
            size *= value
            if value < 1 or value > _next_pow2(max(extents[name], 1)):
                break
        else:
            if size > MAX_BLOCK or (not interpret and (w < 1 or w > MAX_WARPS or size < 32 * w)):
                continue
            candidate = dict(blocks_of) if interpret else {**blocks_of, "num_warps": w}
            if candidate not in found:
                found.append(candidate)
    return found


def describe(launch: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in launch.items() if k in ("XBLOCK", "RBLOCK", "num_warps"))


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

    def __call__(self, stream: int | None, *args: Any) -> None:
        if not use_interpreter() and torch.cuda.is_current_stream_capturing():
            chosen, times = 0, None  # nothing can be timed while a CUDA graph is recorded
        else:
            times = [self._time(launcher, stream, args) for launcher in self.choices]
            chosen = min(range(len(times)), key=times.__getitem__)
            store(self.key, [c.launch for c in self.choices], times, chosen)
        launcher = self.choices[chosen]
        launcher.home, launcher.name = self.home, self.name
        self.home[self.name] = launcher
        self.report(self.name, report_text([c.launch for c in self.choices], times, chosen))
        launcher(stream, *args)

    def _time(self, launcher: Launcher, stream: int | None, args: tuple[Any, ...]) -> float:
        """Microseconds of one launch on ``args``, with scratch tensors for what it stores."""
        scratch = tuple(torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
                        if k in self.written and isinstance(a, torch.Tensor) else a for k, a in enumerate(args))
        if use_interpreter():
            start = time.perf_counter()
            launcher(stream, *scratch)
            return (time.perf_counter() - start) * 1e6
        launcher(stream, *scratch)  # its first launch: Triton's path, compiled if it was not
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        flush = torch.empty(_l2_bytes(device) // 4, dtype=torch.int32, device=device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPEATS)]
        for begin, end in events:
            flush.zero_()  # each launch reads its inputs from memory, as in the model
            begin.record()
            launcher(stream, *scratch)
            end.record()
        torch.cuda.synchronize(device)
        return statistics.median(b.elapsed_time(e) for b, e in events) * 1e3


def _l2_bytes(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return max(getattr(props, "L2_cache_size", 0), 64 << 20)


def report_text(launches: list[dict[str, Any]], times: list[float] | None, chosen: int) -> str:
    """One line per candidate: its blocks and warps, its time, and which was chosen."""
    lines = []
    for k, launch in enumerate(launches):
        took = f"{times[k]:.2f} us" if times is not None else "not timed (first called while a CUDA graph was recorded)"
        mark = "  <- chosen" if k == chosen else ""
        lines.append(f"  {'heuristic' if k == 0 else f'candidate {k}'}: {describe(launch)}: {took}{mark}")
    return "\n".join(lines)


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
