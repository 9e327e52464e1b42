"""What a harness run records: each variant of each case, each case, and the run.

``harness.py`` fills these in; ``report.py`` turns them into a table, Markdown and JSON. Both
import them from here (``harness`` re-exports them), so that ``report`` need not import
``harness``, which imports ``report``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmarks.timing import CopyBandwidth


@dataclasses.dataclass
class VariantResult:
    """One variant of one case. ``status``: ``ref`` (eager), ``ok``, ``FAIL`` (outputs differ from
    eager; not timed), ``error`` (it raised), ``n/a`` (the backend cannot run here: its start-up
    compile failed)."""

    variant: str
    status: str
    median_ms: float | None = None
    speedup: float | None = None
    floor_fraction: float | None = None
    error: float | None = None  # largest normwise relative difference from eager, both checks
    compile_cold_s: float | None = None
    compile_warm_s: float | None = None
    kernels: int | None = None  # generated kernels (fuse: from fusebackend.history())
    graph_kernels: dict[str, int] = dataclasses.field(default_factory=dict)
    fallbacks: dict[str, int] = dataclasses.field(default_factory=dict)
    eager_graphs: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class CaseResult:
    name: str
    description: str
    inputs: list[str] = dataclasses.field(default_factory=list)
    floor_bytes: int | None = None
    floor_ms: float | None = None
    variants: list[VariantResult] = dataclasses.field(default_factory=list)
    error: str | None = None  # the case could not run at all (e.g. out of memory in eager)
    seconds: float = 0.0


@dataclasses.dataclass
class RunResult:
    suite: str
    environment: dict[str, Any]
    copy: CopyBandwidth | None
    startup_s: dict[str, float | str]
    cases: list[CaseResult]
