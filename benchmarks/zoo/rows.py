"""What the zoo runner measures, as data: a row per model and mode (``ZooRow``), a
``VariantStats`` per variant in it, the run's options (``RunOptions``), and the variants' names
(``backend@mode``). The runner (``run.py``) fills them; the report (``report.py``) and the chart
(``chart.py``) read them, saved as JSON or not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from benchmarks.timing import TimingConfig
from benchmarks.zoo.spec import Size

VARIANTS = ("eager", "inductor", "fuse")
# torch.compile's modes a compiled variant may name after "@" (``fuse@reduce-overhead``)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


def backend_of(variant: str) -> str:
    """The backend of a variant: ``fuse`` for ``fuse`` and ``fuse@reduce-overhead``."""
    return variant.split("@", 1)[0]


def parse_variant(variant: str) -> tuple[str, str | None]:
    """A variant's backend and torch.compile mode (None: no mode given); raises SystemExit for a
    variant the runner does not have."""
    backend, _, mode = variant.partition("@")
    if backend not in VARIANTS or (mode and (backend == "eager" or mode not in COMPILE_MODES)):
        raise SystemExit(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}, each compiled one "
                         f"optionally with @MODE for MODE in {', '.join(COMPILE_MODES)}")
    return backend, mode or None


@dataclasses.dataclass
class VariantStats:
    variant: str
    status: str = "ok"  # ref (eager), ok, error
    error: float | None = None  # against eager (see the module docstring); None for eager itself
    median_ms: float | None = None  # the median over the timing rounds' medians
    round_ms: list[float] = dataclasses.field(default_factory=list)  # each round's median (run_model)
    first_call_s: float | None = None  # torch.compile(), its compile and one run ("cold compile s"); None for eager
    # fuse: the first call's seconds by stage (fusebackend.metrics.stage_seconds: dynamo, aot, cache,
    # lower, ..., triton), and "other": the rest of the first call (the model's Python, the ATen calls);
    # Inductor: dynamo, aot and inductor from Dynamo's timers (inductor_stages)
    compile_stages: dict[str, float] = dataclasses.field(default_factory=dict)
    cache_hits: int | None = None  # fuse: graphs of the first call loaded from its on-disk cache
    cache_misses: int | None = None  # fuse: graphs of the first call compiled (and stored)
    aot_cache_hits: int | None = None  # fuse: Dynamo graphs of the first call AOTAutograd's cache had
    speedup: float | None = None  # eager's time over this one
    host_ms: float | None = None  # the host's time per step (measure.host_time)
    gpu_ms: float | None = None  # the GPU's time per step with the host ahead; None on a CPU
    peak_mib: float | None = None  # the most device memory allocated during one step; None on a CPU
    base_mib: float | None = None  # device memory allocated when that step began
    launches: int | None = None  # GPU kernels one step launches, copies and fills left out; None on a CPU
    # the kernel audit (audit.py), from one profiled step on a GPU: device microseconds in kernels
    # a compiler generated and in the rest (cuBLAS, cuDNN, ATen); fuse: its generated kernels'
    # floors summed, and the kernels under half their floor that take 2% of the step or more
    # (audit.KernelAudit as a dict, with Inductor's kernels for the same source nodes)
    generated_us: float | None = None
    library_us: float | None = None
    floor_us: float | None = None
    slow_kernels: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    eager_graphs: int | None = None  # fuse: graphs that ran eagerly after a failure
    graphs: int | None = None  # fuse: graphs compiled
    kernels: int | None = None  # fuse: generated kernels
    fallbacks: dict[str, int] = dataclasses.field(default_factory=dict)  # fuse: ATen ops by name
    # fuse: attention calls whose constant mask was dropped, by what they became (metrics.attention_masks)
    attention_masks: dict[str, int] = dataclasses.field(default_factory=dict)
    # fuse: launches that took Triton's path while timed, by why (fusebackend.metrics.slow_launches)
    slow_launches: dict[str, int] = dataclasses.field(default_factory=dict)
    layout_copies: int | None = None  # fuse: ATen results copied into their declared layout in one step
    uncaptured: dict[str, str] = dataclasses.field(default_factory=dict)  # fuse@reduce-overhead: graphs not recorded, why
    # fuse@max-autotune: kernels tuned, how many kept a candidate, and the heuristic's and the
    # chosen launches' summed times, each timed alone (fusebackend.kernels.autotune.summary)
    tuned: dict[str, float] = dataclasses.field(default_factory=dict)
    message: str = ""  # the exception, or fuse's warnings


@dataclasses.dataclass
class ZooRow:
    model: str
    mode: str  # "inference" or "train"
    shapes: str = ""
    status: str = "ok"  # ok, ERROR (the model could not be built or run eagerly), skipped
    message: str = ""
    seconds: float = 0.0
    variants: list[VariantStats] = dataclasses.field(default_factory=list)

    def get(self, name: str) -> VariantStats | None:
        return next((v for v in self.variants if v.variant == name), None)

    @property
    def eager(self) -> VariantStats | None:
        return self.get("eager")

    @property
    def inductor(self) -> VariantStats | None:
        return self.get("inductor")

    @property
    def fuse(self) -> VariantStats | None:
        return self.get("fuse")

    @property
    def fuse_within_2x_inductor(self) -> bool | None:
        f, i = self.fuse, self.inductor
        if f is None or i is None or f.error is None or i.error is None:
            return None
        return f.error <= 2 * i.error


@dataclasses.dataclass(frozen=True)
class RunOptions:
    size: Size
    device: torch.device
    dtype: torch.dtype
    variants: tuple[str, ...]
    timing: TimingConfig
    timed: bool = True  # False (--no-timing): check only, report no times
    batch: int | None = None  # --batch: the first rows of each input (spec.narrow)
    seq: int | None = None  # --seq: the first positions of each token input
    bandwidth: float | None = None  # a device copy's bytes per second, for the kernel audit (GPU only)
