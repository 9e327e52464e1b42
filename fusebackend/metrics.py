"""Counters a user reads to see what the backend did: ``fusebackend.metrics``.

- ``graphs_compiled`` and ``kernels_generated``: graphs made ready to run and their kernels,
  whether compiled in this process or loaded from the on-disk cache;
- ``cache_hits`` and ``cache_misses``: graphs loaded from the on-disk cache of compiled graphs
  (``cache.py``), and graphs compiled because it had none;
- ``aot_cache_hits``: Dynamo graphs whose AOTAutograd result (forward, backward) came from
  AOTAutograd's cache (``aot_cache.py``), not traced again;
- ``fallbacks``: ATen ops left as extern calls, by op name;
- ``eager_graphs``: whole graphs run eagerly after a failure;
- ``attention_masks``: attention calls whose mask was dropped, by what the call became: ``none``
  (a constant mask that masked nothing), ``causal`` (``is_causal=True``) or ``rows`` (a mask the
  same along the keys: its dropped rows zeroed after the call) (``attention_masks.py``), and
  ``gqa``: calls whose repeated key/value heads were replaced by ``enable_gqa=True``
  (``lowering/attention_heads.py``);
- ``stage_seconds``: compile time by stage: ``dynamo`` (Dynamo's tracing of the Python, less
  the time in this backend), ``aot`` (AOTAutograd's tracing, decomposition and partition),
  ``cache`` (the cache key and looking up the entry), ``lower``, ``verify``, ``schedule``,
  ``codegen``, ``store`` (writing the entry), ``load`` (importing the wrapper and kernels), and
  ``triton``: Triton's compile of a graph's kernels when it is loaded (``runtime.precompile``),
  and ``launch``: each kernel's first launch (Triton's own path; where the kernel was not
  compiled at load, its compile; in the interpreter, the kernel's run);
- ``cold_stage_seconds`` and ``warm_stage_seconds``: the per-graph stages (``cache`` to the
  compile at load) of graphs compiled here, and of graphs loaded from the cache;
- ``slow_launches``: launches of compiled kernels that took Triton's own path, by why (a launch
  hook set, as profilers set one, or a pointer whose alignment changed; each costs several
  times a direct launch on the host);
- ``layout_copies``: ATen results that came back in another layout than the lowering declared,
  copied into it at run time (a kernel and a host cost each);
- ``specialized``: each graph compiled for more than one input signature, by name: how many
  it was compiled for, and the symbols of its sizes where Dynamo gave them (``symbolic.py``).
  fuse compiles a graph with symbolic sizes once per concrete shape;
- ``not_symbolic``: with ``config.symbolic``, each graph with symbolic sizes that could not be
  compiled for all of them, by name, and the first reason (``sizevars.NotSymbolic``);
- ``uncaptured``: in ``mode="reduce-overhead"``, each graph that runs without a CUDA graph, by
  name, and why (``cudagraphs.py``); the CUDA graph trees log the graphs they decline at run
  time (an input written in place that is not a parameter or buffer) themselves.

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
cache_misses: int = 0
aot_cache_hits: int = 0
layout_copies: int = 0
fallbacks: collections.Counter[str] = collections.Counter()
attention_masks: collections.Counter[str] = collections.Counter()
stage_seconds: collections.Counter[str] = collections.Counter()
cold_stage_seconds: collections.Counter[str] = collections.Counter()
warm_stage_seconds: collections.Counter[str] = collections.Counter()
slow_launches: collections.Counter[str] = collections.Counter()
uncaptured: dict[str, str] = {}
specialized: dict[str, tuple[int, tuple[str, ...]]] = {}
not_symbolic: dict[str, str] = {}


def reset() -> None:
    global graphs_compiled, kernels_generated, eager_graphs, cache_hits, cache_misses, aot_cache_hits, layout_copies
    graphs_compiled = 0
    kernels_generated = 0
    eager_graphs = 0
    cache_hits = 0
    cache_misses = 0
    aot_cache_hits = 0
    layout_copies = 0
    fallbacks.clear()
    attention_masks.clear()
    stage_seconds.clear()
    cold_stage_seconds.clear()
    warm_stage_seconds.clear()
    slow_launches.clear()
    uncaptured.clear()
    specialized.clear()
    not_symbolic.clear()
    inner, backend = _dynamo_times()
    _dynamo_seen[:] = [len(inner), len(backend)]  # frames compiled before are not counted


# how many entries of Dynamo's time lists (compile_inner, call_user_compiler) were counted already
_dynamo_seen = [0, 0]


def dynamo_timers() -> dict[str, list[float]]:
    """Dynamo's own record of its timed compile steps, each a list of seconds by name
    (``torch._dynamo.utils.compilation_time_metrics``); empty where torch has none."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # another torch: no dynamo stage
        return {}
    return compilation_time_metrics


def _dynamo_times() -> tuple[list[float], list[float]]:
    """Dynamo's own record of each frame's compile, and of the backend call within it."""
    times = dynamo_timers()
    return list(times.get("_compile.compile_inner", [])), list(times.get("OutputGraph.call_user_compiler", []))


def collect_dynamo() -> None:
    """Add Dynamo's time in the frames it compiled since the last call (each frame's compile less
    the backend's part, where AOTAutograd is timed on its own) to ``stage_seconds["dynamo"]``.
    ``summary()`` calls it; so do the zoo and anyone reading ``stage_seconds`` after a first call."""
    inner, backend = _dynamo_times()
    if len(inner) < _dynamo_seen[0] or len(backend) < _dynamo_seen[1]:
        _dynamo_seen[:] = [0, 0]  # torch._dynamo.reset() cleared Dynamo's record
    spent = sum(inner[_dynamo_seen[0]:]) - sum(backend[_dynamo_seen[1]:])
    _dynamo_seen[:] = [len(inner), len(backend)]
    if spent > 0:
        stage_seconds["dynamo"] += spent


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
    collect_dynamo()
    lines = [
        f"graphs compiled:    {graphs_compiled}",
        f"kernels generated:  {kernels_generated}",
        f"graphs run eagerly: {eager_graphs}",
        f"cache hits:         {cache_hits} (graphs loaded from the on-disk cache; {cache_misses} missed)",
        f"AOT cache hits:     {aot_cache_hits} (Dynamo graphs not traced by AOTAutograd again)",
    ]
    if fallbacks:
        lines.append("ATen fallbacks:     " + ", ".join(f"{k} x{v}" for k, v in fallbacks.most_common()))
    if layout_copies:
        lines.append(f"layout copies:      {layout_copies}")
    if slow_launches:
        lines.append("slow launches:      " + ", ".join(f"{k} x{v}" for k, v in slow_launches.most_common()))
    if specialized:
        lines.append("compiled per shape: " + ", ".join(
            f"{name} x{count}" + (f" (sizes {', '.join(syms)} symbolic)" if syms else "")
            for name, (count, syms) in specialized.items()))
    if not_symbolic:
        lines.append("not symbolic:       " + "; ".join(f"{name}: {why}" for name, why in not_symbolic.items()))
    if stage_seconds:
        lines.append("compile seconds:    " + ", ".join(f"{k} {v:.3f}" for k, v in stage_seconds.items()))
    for label, stages in (("  compiled here:   ", cold_stage_seconds), ("  from the cache:  ", warm_stage_seconds)):
        if stages:
            lines.append(label + ", ".join(f"{k} {v:.3f}" for k, v in stages.items()))
    return "\n".join(lines)
