"""Timing on a GPU or a CPU, and the copy bandwidth that sets the floor of memory-bound cases.

On a GPU, ``median_ms`` is ``triton.testing.do_bench``'s median: CUDA events around each call,
the L2 cache flushed between calls (outside the timed region), warm-up first. On a CPU it is the
median of ``time.perf_counter`` around each of a few calls after a warm-up call. Either way the
region holds exactly one call of the function given, nothing else.

do_bench flushes the L2 by writing zeros over a buffer larger than it, so each timed call starts
with the L2 full of dirty lines, and the first bytes the call brings in make the cache write
those back: work inside the timed region that belongs to the flush. On an H200 (2026-11-23) a
kernel that only reads 128 MiB took 38.8 us after do_bench's flush and 33.7 us after a flush
that leaves the cache clean (the same zeros, then a read of another buffer as large); the copy
that sets the floor, 1 GiB, is hardly changed. ``l2="clean"`` times that way, with CUDA events
around each call and do_bench's budgets; the default, ``"zeroed"``, is do_bench itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time
from typing import Any, Callable, Sequence

import torch



@dataclasses.dataclass(frozen=True)
class TimingConfig:
    """GPU: do_bench's warm-up and repetition budgets (milliseconds). CPU: untimed warm-up calls
    and timed calls (the harness always calls a step once on the timing inputs before timing it)."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    cpu_warmup: int = 0
    cpu_repeats: int = 3
    l2: str = "zeroed"  # GPU: "zeroed" (do_bench's flush, dirty lines) or "clean" (see the module docstring)

    def method(self, device: torch.device) -> str:
        if device.type == "cuda" and self.l2 == "clean":
            return (f"median of CUDA events around each call (warmup {self.warmup_ms:g} ms, rep {self.rep_ms:g} ms), "
                    f"L2 flushed between calls and left clean (256 MiB of zeros written, then 256 MiB read)")
        if device.type == "cuda":
            return (f"triton.testing.do_bench median (warmup {self.warmup_ms:g} ms, rep {self.rep_ms:g} ms, "
                    f"CUDA events per call, L2 flushed between calls)")
        return (f"time.perf_counter median of {self.cpu_repeats} calls, after the check call"
                + (f" and {self.cpu_warmup} more warm-up calls" if self.cpu_warmup else ""))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], Any], device: torch.device, timing: TimingConfig) -> float:
    """Median wall time of one ``fn()`` in milliseconds; on a GPU, device time between events."""
    if device.type == "cuda" and timing.l2 == "clean":
        return _clean_l2_median_ms(fn, device, timing)
    if device.type == "cuda":
        import triton.testing

        # do_bench times rep / (its estimate of one call) calls, at least one: a step longer than
        # the budget would be one sample, and one late launch its median. Falcon-7B's b4 s512
        # step (about 72 ms, H100, 2026-11-27) read 84 ms for fuse against Inductor's 74 under a
        # 50 ms budget, and 70.6 against 73.0 with ten samples or more.
        rep = max(timing.rep_ms, MIN_SAMPLES * _estimate_ms(fn))
        return float(triton.testing.do_bench(fn, warmup=timing.warmup_ms, rep=rep, return_mode="median"))
    for _ in range(timing.cpu_warmup):
        fn()
    samples = []
    for _ in range(timing.cpu_repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


# the fewest timed calls behind a GPU median, whatever the repetition budget
MIN_SAMPLES = 10


def _estimate_ms(fn: Callable[[], Any]) -> float:
    """The device time of one call, from three calls between two events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 3


def _clean_l2_median_ms(fn: Callable[[], Any], device: torch.device, timing: TimingConfig) -> float:
    """Like do_bench, but each call starts with an L2 that holds only clean lines of other data."""
    zeroed = torch.empty(256 << 20, dtype=torch.int8, device=device)
    read = torch.ones(64 << 20, dtype=torch.int32, device=device)  # 256 MiB

    def flush() -> None:
        zeroed.zero_()
        read.sum()  # brings in clean lines; the dirty ones are written back here, untimed

    def run(n: int) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            flush()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in events]

    estimate = statistics.median(run(5))
    run(max(1, int(timing.warmup_ms / max(estimate, 1e-3))))
    return statistics.median(run(max(MIN_SAMPLES, min(int(timing.rep_ms / max(estimate, 1e-3)), 1000))))


@dataclasses.dataclass(frozen=True)
class HostGpu:
    """One step's cost on each side: ``host_ms``, the wall time the host takes to issue it;
    ``gpu_ms``, the device time of its work when the host is ahead. A step whose host time is
    above its GPU time is bound by the host: the GPU waits for it."""

    host_ms: float
    gpu_ms: float | None  # None on a CPU

    @property
    def host_bound(self) -> bool:
        return self.gpu_ms is not None and self.host_ms > self.gpu_ms


def host_and_gpu_ms(fn: Callable[[], Any], device: torch.device, steps: int = 5, rounds: int = 3) -> HostGpu:
    """Host and GPU milliseconds of one ``fn()``: the medians over ``rounds`` of ``steps`` calls.

    On a GPU the calls are queued behind a sleeping kernel (``torch.cuda._sleep``), long enough
    that the host issues all of them before the GPU starts the first: the host's wall time over
    the calls is its own work alone (no wait for the GPU), and CUDA events after the sleep and
    after the last call give the GPU's time with no gaps waiting for the host. On a CPU both are
    the same, the wall time, and ``gpu_ms`` is None. A step of thousands of launches can fill
    the GPU's launch queue behind the sleep; the host then waits, and ``host_ms`` is an upper
    bound: keep ``steps`` small for such steps.
    """
    fn()
    if device.type != "cuda":
        samples = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            samples.append((time.perf_counter() - start) * 1e3 / steps)
        return HostGpu(statistics.median(samples), None)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize(device)
    wall_ms = (time.perf_counter() - start) * 1e3  # an upper bound of the host's time for the calls
    cycles_per_ms = _sleep_cycles_per_ms(device)
    hosts, gpus = [], []
    for _ in range(rounds):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(cycles_per_ms * (2 * wall_ms + 20)))
        begin.record()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        hosts.append((time.perf_counter() - start) * 1e3 / steps)
        end.record()
        torch.cuda.synchronize(device)
        gpus.append(begin.elapsed_time(end) / steps)
    return HostGpu(statistics.median(hosts), statistics.median(gpus))


_SLEEP_CYCLES: dict[int, float] = {}


def _sleep_cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on ``device``, measured once."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SLEEP_CYCLES:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # warm
        begin.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize(device)
        _SLEEP_CYCLES[index] = 10_000_000 / max(begin.elapsed_time(end), 1e-3)
    return _SLEEP_CYCLES[index]


def study_parser(doc: str | None) -> argparse.ArgumentParser:
    """A study's command line: its docstring as the help, and ``--check`` (outputs only)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="check outputs only (no timing)")
    return parser


def study_setup(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, torch.device, float]:
    """A study's parsed arguments, its device (a GPU, unless its kernels run in Triton's
    interpreter) and, where the study times (on a GPU and not ``--check``), the copy bandwidth
    measured there in bytes per second (printed), else 0."""
    import fusebackend
    from benchmarks.zoo.audit import copy_bandwidth

    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not fusebackend.use_interpreter()
    device = torch.device("cuda" if gpu else "cpu")
    if not gpu or args.check:
        return args, device, 0.0
    bandwidth = copy_bandwidth(device)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    return args, device, bandwidth


def graph_replay_us(fn: Callable[[], Any], calls: int = 20) -> float:
    """Microseconds a call of ``fn`` (CUDA work only) takes: ``calls`` calls captured in one CUDA
    graph and its replay timed by ``do_bench`` (median), so launches cost nothing."""
    import triton.testing

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return triton.testing.do_bench(graph.replay, warmup=20, rep=200, return_mode="median") * 1e3 / calls


def timed_call(fn: Callable[..., Any], inputs: Sequence[Any], device: torch.device) -> tuple[Any, float]:
    """One synchronized call: its outputs and its wall time in seconds."""
    synchronize(device)
    start = time.perf_counter()
    out = fn(*inputs)
    synchronize(device)
    return out, time.perf_counter() - start


@dataclasses.dataclass(frozen=True)
class CopyBandwidth:
    nbytes: int  # size of the tensor copied; the copy moves twice this (read + write)
    median_ms: float

    @property
    def bytes_per_s(self) -> float:
        return 2 * self.nbytes / (self.median_ms * 1e-3)


def copy_bandwidth(device: torch.device, nbytes: int, timing: TimingConfig) -> CopyBandwidth:
    """Measure device-to-device copy bandwidth: ``dst.copy_(src)`` of ``nbytes`` (random data)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return CopyBandwidth(nbytes, median_ms(lambda: dst.copy_(src), device, timing))


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
