"""What one step of a zoo variant costs besides its median time: host time, memory, launches.

The runner (``run.py``) calls these on a step that has already run once (compiled and checked):

- ``host_time(step, device, train, timing)``: ``benchmarks.timing.host_and_gpu_ms`` with the
  number of steps chosen here. On a GPU, 5 steps of inference and 2 of a training step are queued
  per round behind a sleeping kernel, 3 rounds: a training step launches thousands of kernels,
  and more steps than the launch queue holds would make the host wait for the GPU and report
  that wait as host time. On a CPU the host's time is the step's wall time and there is no GPU
  time; one step per round and ``timing.cpu_repeats`` rounds keep a run of Triton's interpreter
  as short as the median's own measurement.
- ``peak_memory(step, device)``: the absolute peak of device memory allocated by PyTorch's
  caching allocator during one step (``torch.cuda.max_memory_allocated`` after
  ``reset_peak_memory_stats``), with what was allocated when the step began: the weights, the
  inputs, the previous step's gradients and what the runner holds (eager's reference outputs).
  The peak is the number reported; the peak less the base is what the step itself added on top.
  None on a CPU.
- ``profile_step(step, device)``: each device kernel of one step by name, its launches and
  time (``torch.profiler``), copies and fills left out as below; the kernel audit's input
  (``audit.py``).
- ``kernel_launches(step, device)``: GPU kernels launched by one step, counted with
  ``torch.profiler`` (``ProfilerActivity.CUDA``): the device events of the step, less the copies
  and fills (activity ``gpu_memcpy`` and ``gpu_memset`` where the profiler's events say their
  activity, and events named ``Memcpy ...`` or ``Memset ...``, CUPTI's names for them, where they
  do not), so that ATen's, Inductor's and fuse's kernels are counted alike. None on a CPU, or where the profiler saw no device activity
  at all (no CUPTI): a count of zero there would be false.
"""

from __future__ import annotations

import dataclasses
import gc
from collections import defaultdict
from typing import Any, Callable

import torch

from benchmarks.timing import HostGpu, TimingConfig, host_and_gpu_ms

# Steps queued per round on a GPU (see the module docstring): few for a training step, whose
# thousands of launches would otherwise fill the launch queue behind the sleeping kernel.
GPU_INFERENCE_STEPS = 5
GPU_TRAIN_STEPS = 2
GPU_ROUNDS = 3
_MIB = float(1 << 20)


def host_time(step: Callable[[], Any], device: torch.device, train: bool, timing: TimingConfig) -> HostGpu:
    """Host and GPU milliseconds of one step (``benchmarks.timing.host_and_gpu_ms``)."""
    if device.type == "cuda":
        steps = GPU_TRAIN_STEPS if train else GPU_INFERENCE_STEPS
        return host_and_gpu_ms(step, device, steps=steps, rounds=GPU_ROUNDS)
    return host_and_gpu_ms(step, device, steps=1, rounds=max(1, timing.cpu_repeats))


def host_method(device: torch.device, timing: TimingConfig) -> str:
    """How ``host_time`` measures on ``device``, in words, for the report's environment."""
    if device.type == "cuda":
        return (f"host: wall time of {GPU_INFERENCE_STEPS} inference steps or {GPU_TRAIN_STEPS} training steps "
                f"issued behind torch.cuda._sleep, per step, median of {GPU_ROUNDS} rounds; GPU: CUDA events "
                "around the same steps")
    return f"host: wall time of one step, median of {max(1, timing.cpu_repeats)} (no GPU time on a CPU)"


@dataclasses.dataclass(frozen=True)
class PeakMemory:
    peak_mib: float  # the most allocated at once during the step, everything included
    base_mib: float  # allocated when the step began

    @property
    def step_mib(self) -> float:
        """What the step added at its peak above what it began with."""
        return self.peak_mib - self.base_mib


def peak_memory(step: Callable[[], Any], device: torch.device) -> PeakMemory | None:
    """Peak device memory of one step (see the module docstring); None on a CPU."""
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return PeakMemory(peak / _MIB, base / _MIB)


# kernels a compiler generated: fuse's (``fused_...``, ``foreach_lists`` for an optimizer's lists) and Inductor's (``triton_...``)
_GENERATED = ("fused_", "triton_", "foreach_lists")


@dataclasses.dataclass
class StepProfile:
    """One step's device kernels by name: (launches, microseconds)."""

    kernels: dict[str, tuple[int, float]]

    @property
    def total_us(self) -> float:
        return sum(us for _, us in self.kernels.values())

    def generated_us(self) -> float:
        """Time in kernels a compiler generated (fuse's or Inductor's Triton kernels)."""
        return sum(us for name, (_, us) in self.kernels.items() if name.startswith(_GENERATED))

    @property
    def launches(self) -> int:
        return sum(n for n, _ in self.kernels.values())


def profile_step(step: Callable[[], Any], device: torch.device) -> StepProfile | None:
    """Device kernels of one step by name, copies and fills left out; None on a CPU or where
    the profiler saw no device activity."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = step()
        torch.cuda.synchronize(device)
    del out
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    seen = False
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        seen = True
        if _is_copy_or_fill(event):
            continue
        entry = totals[event.name]
        entry[0] += 1
        entry[1] += getattr(event, "device_time_total", None) or event.cuda_time_total
    if not seen:
        return None
    return StepProfile({name: (int(n), us) for name, (n, us) in totals.items()})


def _is_copy_or_fill(event: Any) -> bool:
    # activity_type is on the profiler's events from torch 2.13; the names hold in every version
    activity = getattr(event, "activity_type", None)
    return activity in ("gpu_memcpy", "gpu_memset") or event.name.startswith(("Memcpy", "Memset"))


def kernel_launches(step: Callable[[], Any], device: torch.device) -> int | None:
    """GPU kernels one step launches, copies and fills left out (see the module docstring)."""
    profile = profile_step(step, device)
    return None if profile is None else profile.launches
