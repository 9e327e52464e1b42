"""Counters a user reads to see what the backend did: ``fusebackend.metrics``.

``graphs_compiled``, ``kernels_generated``, ``fallbacks`` (ATen ops left as extern calls, by op
name), ``eager_graphs`` (whole graphs run eagerly after a failure), ``cache_hits`` (compiled
graphs and kernels found in a cache), ``stage_seconds`` (compile time per pipeline stage:
``lower``, ``verify``, ``schedule``, ``codegen``, ``load``, and ``triton``, each kernel's first
launch, where Triton compiles it or loads it from its cache; in the interpreter, its first run) and
``slow_launches`` (launches of compiled kernels that took Triton's own path, by why: a launch
hook set, as profilers set one, or a pointer whose alignment changed; each costs several times a
direct launch on the host) and ``layout_copies`` (ATen results that came back in another layout
than the lowering declared, copied into it at run time: a kernel and a host cost each).
``reset()`` zeroes them all.
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Iterator

graphs_compiled: int = 0
kernels_generated: int = 0
eager_graphs: int = 0
cache_hits: int = 0
layout_copies: int = 0
fallbacks: collections.Counter[str] = collections.Counter()
stage_seconds: collections.Counter[str] = collections.Counter()
slow_launches: collections.Counter[str] = collections.Counter()


def reset() -> None:
    global graphs_compiled, kernels_generated, eager_graphs, cache_hits, layout_copies
    graphs_compiled = 0
    kernels_generated = 0
    eager_graphs = 0
    cache_hits = 0
    layout_copies = 0
    fallbacks.clear()
    stage_seconds.clear()
    slow_launches.clear()


@contextlib.contextmanager
def timed(stage: str, into: dict[str, float] | None = None) -> Iterator[None]:
    """Add the block's wall time to ``stage_seconds[stage]`` (and to ``into[stage]`` if given)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        stage_seconds[stage] += elapsed
        if into is not None:
            into[stage] = elapsed


def summary() -> str:
    lines = [
        f"graphs compiled:    {graphs_compiled}",
        f"kernels generated:  {kernels_generated}",
        f"graphs run eagerly: {eager_graphs}",
        f"cache hits:         {cache_hits}",
    ]
    if fallbacks:
        lines.append("ATen fallbacks:     " + ", ".join(f"{k} x{v}" for k, v in fallbacks.most_common()))
    if layout_copies:
        lines.append(f"layout copies:      {layout_copies}")
    if slow_launches:
        lines.append("slow launches:      " + ", ".join(f"{k} x{v}" for k, v in slow_launches.most_common()))
    if stage_seconds:
        lines.append("compile seconds:    " + ", ".join(f"{k} {v:.3f}" for k, v in stage_seconds.items()))
    return "\n".join(lines)
