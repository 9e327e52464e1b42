"""The zoo runner: eager, Inductor and fuse on real architectures, checked, timed and charted.

    python -m benchmarks.zoo [--models gpt2,resnet] [--mode inference|train|both] [--tiny] [--out DIR]
    python -m benchmarks.zoo --chart-from DIR/zoo.json[,OTHER.json] [--out DIR]

For each model (the real size in bf16 on a GPU; ``--tiny``: the tiny size in fp32 on a CPU, eager
and fuse only, for a smoke test), each mode and each variant:

- ``eager``: ``model(**inputs)``; its outputs are the reference, its time the baseline.
- ``inductor``: ``torch.compile(model)``.
- ``fuse``: ``torch.compile(model, backend="fuse")``; graphs that ran eagerly
  (``fusebackend.metrics.eager_graphs``), ATen fallbacks by op and generated kernels are recorded.

Modes (``--mode``, default ``both``): inference for the selected models, then the training step
for those of them in ``TRAIN_REAL`` (every model: all of the zoo for inference, ``TRAIN_REAL`` for
training; ``--mode train`` trains every model named by ``--models``; ``--train`` is ``--mode
train``). Inference: ``model.eval()`` under ``torch.no_grad()``; the error is the largest
``max|out - eager| / max|eager|`` over the outputs. Training step: gradients cleared, forward,
the model's loss, backward, on the model in train mode; the error is the larger of the loss's
relative error and the largest gradient difference over the model's largest eager gradient.
``fuse <= 2x inductor`` says whether fuse's error is at most twice Inductor's.

Each compiled variant's first call (cold compile and one run, its seconds reported) is checked
against eager, and every variant is kept compiled (Dynamo is reset between models, not between
variants). Then the variants are timed in turn, in three rounds on a GPU: the median time of
one call (``benchmarks/timing.py``: ``do_bench``), the host's and the GPU's time per step
(``measure.py``); each figure is the median over the rounds, and ``round_ms`` keeps each round's
median. The host of a lent GPU changes speed over minutes, and a variant timed alone would get
whatever speed it had then. Last, each variant's peak device memory in one step and the kernels
it launches, and fuse's kernel audit (``audit.py``): its slow kernels, each beside Inductor's
kernels for the same nodes of the model. ``--no-timing`` leaves out the times.

One model failing (an exception, out of memory) is reported as ``ERROR`` with the message and the
others run; results are written after every model to ``zoo[_tiny][_train|_inference].json`` and
``.md`` in ``--out`` (default ``$OUT`` if set, else ``./bench_out``), and at the end the chart of
the speedups (``chart.py``) to the ``.png`` of the same name. A progress bar (tqdm) shows the
model running; each model's result is one line above it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Sequence

import torch

import fusebackend
from fusebackend.kernels import autotune
from benchmarks.harness import recording_warnings, short_error
from benchmarks.timing import TimingConfig, median_ms, synchronize
from benchmarks.zoo import audit, by_name, chart, parallel, report
from benchmarks.zoo.compare import output_error, output_tensors, relative_error
from benchmarks.zoo.measure import StepProfile, host_time, peak_memory, profile_step
from benchmarks.zoo.registry import TRAIN_REAL, ZOO, entry as zoo_entry
from benchmarks.zoo.rows import (COMPILE_MODES, VARIANTS, RunOptions, VariantStats, ZooRow, backend_of,  # noqa: F401
                                 parse_variant)
from benchmarks.zoo.spec import Built, narrow

def compile_stages(stages: dict[str, float], first_call_s: float | None) -> dict[str, float]:
    """fuse's stage seconds of a first call, with ``other``: the first call less those stages."""
    out = {k: round(v, 3) for k, v in stages.items()}
    if first_call_s is not None:
        out["other"] = round(max(first_call_s - sum(stages.values()), 0.0), 3)
    return out


def inductor_stages(before: dict[str, int], first_call_s: float | None, train: bool) -> dict[str, float]:
    """Inductor's first call by stage from Dynamo's timers (entries added since ``before``, each
    timer's length then): ``dynamo``, the frames less the backend; ``aot``, the backend less
    Inductor's own compile (``compile_fx_inner``); ``inductor``, that compile; ``other``, the
    rest. A training step's backward is compiled outside the frame: its stages are ``dynamo``
    and ``backend`` (AOTAutograd and the forward's compile), and the backward's compile is in
    ``other``."""
    timers = fusebackend.metrics.dynamo_timers()

    def added(name: str) -> float:
        return sum(timers.get(name, [])[before.get(name, 0):])

    backend = added("OutputGraph.call_user_compiler")
    stages = {"dynamo": max(added("_compile.compile_inner") - backend, 0.0)}
    if train:
        stages["backend"] = backend
    else:
        own = added("compile_fx_inner")
        stages.update(aot=max(backend - own, 0.0), inductor=own)
    return compile_stages(stages, first_call_s)


def _reset() -> None:
    torch._dynamo.reset()
    fusebackend.metrics.reset()
    fusebackend.dump.clear()


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _compiler(variant: str) -> Callable[[torch.nn.Module], Callable[..., Any]]:
    backend, mode = parse_variant(variant)
    if backend == "eager":
        return lambda model: model
    if backend == "inductor":
        return lambda model: torch.compile(model, mode=mode)
    # the callable, not the name: the name is registered by the installed package's entry point,
    # and the runner also runs from a checkout that is not installed
    return lambda model: torch.compile(model, backend=fusebackend.fuse, mode=mode)


def _inference_step(built: Built, call: Callable[..., Any]) -> Callable[[], Any]:
    def step() -> Any:
        with torch.no_grad():
            return call(**built.inputs)

    return step


def _train_step(built: Built, call: Callable[..., Any]) -> Callable[[], Any]:
    params = [(n, p) for n, p in built.model.named_parameters() if p.requires_grad]

    def step() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        for _, p in params:
            p.grad = None
        loss = built.loss(call(**built.train_inputs))
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in params if p.grad is not None}

    return step


def _train_error(result: tuple[torch.Tensor, dict[str, torch.Tensor]],
                 expected: tuple[torch.Tensor, dict[str, torch.Tensor]]) -> float:
    """The loss's relative error, or the largest gradient difference over the model's largest
    eager gradient, whichever is larger; inf for a gradient that is missing or not finite."""
    loss, grads = result
    eager_loss, eager_grads = expected
    scale = max((g.detach().abs().max().item() for g in eager_grads.values() if g.numel()), default=0.0)
    worst = relative_error(loss, eager_loss)
    for name, g_e in eager_grads.items():
        g = grads.get(name)
        if g is None or g.shape != g_e.shape:
            return float("inf")
        diff = (g.double() - g_e.double()).abs().max().item() if g.numel() else 0.0
        if diff != diff:
            return float("inf")
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def _snapshot(result: Any) -> Any:
    """A copy of a step's tensors, so that later steps (which reuse gradient buffers) leave it."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result[0].clone(), {n: g.clone() for n, g in result[1].items()}
    return result


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


# Timing rounds on a GPU: every variant is timed once per round, in turn, so that a host whose
# speed drifts over a minute (the H200 hosts' does: benchmarks/RESULTS.md,
# 2026-11-24) slows every variant alike; each variant's figures are the medians over the rounds.
GPU_ROUNDS = 3


def _time_in_rounds(timed: list[tuple[VariantStats, Callable[[], Any]]], options: RunOptions, train: bool) -> None:
    """Median time, host and GPU time of each variant's step, the variants taken in turn in each
    of ``GPU_ROUNDS`` rounds (one round on a CPU). fuse's launches that took Triton's path while
    timed are counted (``slow_launches``). A variant that fails here is marked as an error."""
    rounds = GPU_ROUNDS if options.device.type == "cuda" else 1
    samples: dict[str, list[tuple[float, float, float | None]]] = {stats.variant: [] for stats, _ in timed}
    fusebackend.metrics.slow_launches.clear()
    failed: set[str] = set()
    for _ in range(rounds):
        for stats, step in timed:
            if stats.variant in failed:
                continue
            try:
                median = median_ms(step, options.device, options.timing)
                host = host_time(step, options.device, train, options.timing)
            except Exception as exc:
                failed.add(stats.variant)
                _failed(stats, exc)
                continue
            samples[stats.variant].append((median, host.host_ms, host.gpu_ms))
    for stats, _ in timed:
        got = samples[stats.variant]
        if stats.variant in failed or not got:
            continue
        stats.round_ms = [m for m, _, _ in got]
        stats.median_ms = statistics.median(stats.round_ms)
        stats.host_ms = statistics.median(h for _, h, _ in got)
        gpus = [g for _, _, g in got if g is not None]
        stats.gpu_ms = statistics.median(gpus) if gpus else None
        if backend_of(stats.variant) == "fuse":  # before the profiler counts launches: it sets launch hooks
            stats.slow_launches = dict(fusebackend.metrics.slow_launches)


def _resources(stats: VariantStats, step: Callable[[], Any], options: RunOptions) -> StepProfile | None:
    """Peak memory and launches of one step, each variant alone on the GPU; for fuse, the ATen
    results its wrapper copied into the layout it declared in that step
    (``metrics.layout_copies``). Its profile, the kernel audit's input (None on a CPU)."""
    if stats.status == "error":
        return None
    try:
        fusebackend.metrics.layout_copies = 0
        memory = peak_memory(step, options.device)  # one step
        if backend_of(stats.variant) == "fuse":
            stats.layout_copies = fusebackend.metrics.layout_copies
        if memory is not None:
            stats.peak_mib, stats.base_mib = memory.peak_mib, memory.base_mib
        profile = profile_step(step, options.device)
        if profile is not None:
            stats.launches = profile.launches
            stats.generated_us = round(profile.generated_us(), 1)
            stats.library_us = round(profile.total_us - profile.generated_us(), 1)
        return profile
    except Exception as exc:
        _failed(stats, exc)
        return None


def _audit(stats: VariantStats, profiles: dict[str, StepProfile], floors: dict[str, audit.KernelFloor],
           sources: dict[str, dict[str, frozenset[audit.Source]]], options: RunOptions) -> None:
    """The kernel audit of a fuse variant's profiled step (``audit.py``): its kernels' floor, and
    the kernels flagged, each beside Inductor's kernels for the same source nodes where Inductor's
    step was profiled too (the Inductor variant of the same mode, else ``inductor``).

    A variant whose output code is the same as one compiled before it (``inductor`` and
    ``inductor@reduce-overhead``) found no module of its own (``audit.inductor_code_since``):
    its kernels, of the same names, are named by every Inductor variant's code."""
    profile = profiles.get(stats.variant)
    if profile is None or not floors or not options.bandwidth or stats.status == "error":
        return
    try:
        rows = audit.audit(profile, floors, options.bandwidth)
        stats.floor_us = round(sum(r.floor_us for r in rows), 1)
        slow = audit.flagged(rows)
        inductor = next((v for v in ("inductor" + stats.variant[len("fuse"):], "inductor") if v in profiles), None)
        if inductor is not None and stats.variant in sources:
            theirs = sources.get(inductor) or {k: n for v, found in sources.items() if backend_of(v) == "inductor"
                                               for k, n in found.items()}
            slow = audit.beside_inductor(slow, sources[stats.variant], theirs, profiles[inductor])
        stats.slow_kernels = [dataclasses.asdict(r) for r in slow]
    except Exception as exc:
        _failed(stats, exc)


def _failed(stats: VariantStats, exc: Exception) -> None:
    """A variant that failed after its check: an error, the exception first in its message."""
    stats.status = "error"
    stats.message = " | ".join(filter(None, (short_error(exc), stats.message)))


def run_model(name: str, mode: str, options: RunOptions, log: Callable[[str], None] = print) -> ZooRow:
    """One model in one mode through every variant; exceptions are recorded in the row, never raised.

    Every variant is compiled and checked first and kept; then they are timed in turn
    (``_time_in_rounds``), then each one's memory and launches are measured, and last fuse's
    kernels are audited (``_audit``), beside Inductor's profile."""
    train = mode == "train"
    row = ZooRow(name, mode)
    entry = zoo_entry(name)
    reason = entry.available()
    if reason is not None:
        row.status, row.message = "skipped", reason
        return row
    start = time.perf_counter()
    built = None
    timed: list[tuple[VariantStats, Callable[[], Any]]] = []
    floors: dict[str, dict[str, audit.KernelFloor]] = {}  # fuse variant -> its kernels' floors
    sources: dict[str, dict[str, frozenset[audit.Source]]] = {}  # compiled variant -> its kernels' source nodes
    try:
        _reset()
        built = narrow(entry.build(options.size, options.device, options.dtype), options.batch, options.seq)
        row.shapes = built.shapes
        built.model.train(train)
        make_step = _train_step if train else _inference_step
        expected, _ = _timed(lambda: _snapshot(make_step(built, built.model)()), options.device)
        if not train and not any(t.is_floating_point() and t.abs().max().item() > 0
                                 for t in output_tensors(expected)):
            row.message = "eager's outputs are all zero: the errors below tell nothing"
        eager = VariantStats("eager", "ref", speedup=1.0)
        row.variants.append(eager)
        timed.append((eager, make_step(built, built.model)))
        for variant in options.variants:
            if variant != "eager":
                mark = audit.inductor_code_mark()
                stats, step = _run_variant(variant, built, make_step, expected, options, train)
                if backend_of(variant) == "fuse":
                    floors[variant] = audit.kernel_floors((k, src) for a in fusebackend.history()
                                                          for k, src in a.kernels.items())
                    sources[variant] = audit.fuse_sources(fusebackend.history())
                elif backend_of(variant) == "inductor":
                    sources[variant] = audit.inductor_sources(audit.inductor_code_since(mark))
                row.variants.append(stats)
                if step is not None:
                    timed.append((stats, step))
        with parallel.gpu_turn():  # alone on the GPU, where other processes share it
            if options.timed:
                _time_in_rounds(timed, options, train)
            profiles = {stats.variant: p for stats, step in timed
                        if (p := _resources(stats, step, options)) is not None}
        for stats, _ in timed:  # after every variant's profile: fuse's kernels are set beside Inductor's
            _audit(stats, profiles, floors.get(stats.variant, {}), sources, options)
    except Exception as exc:
        row.status, row.message = "ERROR", short_error(exc)
        log(traceback.format_exc(limit=-3))
    finally:
        del built, timed, floors, sources
        _reset()
        _free(options.device)
    row.seconds = time.perf_counter() - start
    return row


def _run_variant(variant: str, built: Built, make_step: Callable[[Built, Callable[..., Any]], Callable[[], Any]],
                 expected: Any, options: RunOptions, train: bool) -> tuple[VariantStats, Callable[[], Any] | None]:
    """Compile ``variant`` and check its first call against eager: its stats, and its step to
    time (None where it failed). Dynamo is not reset between variants, so the variants compiled
    before stay compiled (its guards tell the backends' entries apart)."""
    stats = VariantStats(variant)
    notes: list[str] = []
    step = None
    with recording_warnings(notes, prefix="fusebackend", limit=300):
        try:
            fusebackend.metrics.reset()
            fusebackend.dump.clear()
            # torch.compile() itself is part of the first call: Inductor imports its compiler there
            # (about 200 modules), fuse at its first call (AOTAutograd's cache key imports them)
            wrap_start = time.perf_counter()
            step = make_step(built, _compiler(variant)(built.model))
            wrap_s = time.perf_counter() - wrap_start
            timers = {name: len(entries) for name, entries in fusebackend.metrics.dynamo_timers().items()}
            out, call_s = _timed(lambda: _snapshot(step()), options.device)
            stats.first_call_s = wrap_s + call_s
            stages: dict[str, float] | None = None
            if backend_of(variant) == "inductor":
                stages = inductor_stages(timers, call_s, train)
            if backend_of(variant) == "fuse":
                m = fusebackend.metrics
                stats.uncaptured = dict(m.uncaptured)
                stats.eager_graphs, stats.graphs = m.eager_graphs, m.graphs_compiled
                stats.fallbacks = dict(m.fallbacks.most_common())
                stats.attention_masks = dict(m.attention_masks)
                stats.kernels = sum(a.kernel_count for a in fusebackend.history())
                reports = {f"{a.name}/{k}": t for a in fusebackend.history() for k, t in a.autotune.items()}
                stats.tuned = autotune.summary(reports) if reports else {}
                m.collect_dynamo()
                stages = compile_stages(dict(m.stage_seconds), call_s)
                stats.cache_hits, stats.cache_misses = m.cache_hits, m.cache_misses
                stats.aot_cache_hits = m.aot_cache_hits
            if stages is not None:
                stats.compile_stages = {"torch.compile": round(wrap_s, 3), **stages}
            if train:
                stats.error = _train_error(out, expected)
            else:
                stats.error = output_error(out, expected)
            del out
        except Exception as exc:
            stats.status = "error"
            notes.insert(0, short_error(exc))
            step = None
    stats.message = " | ".join(notes)
    return stats, step


def _finish(row: ZooRow) -> None:
    eager = row.eager
    for v in row.variants:
        if eager is not None and eager.median_ms and v.median_ms:
            v.speedup = eager.median_ms / v.median_ms


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="", help="comma-separated zoo models (default: all for inference, "
                        f"{','.join(TRAIN_REAL)} for the training step); see --list")
    parser.add_argument("--list", action="store_true", help="list the zoo and exit")
    parser.add_argument("--mode", default=None, choices=("inference", "train", "both"),
                        help="inference, the training step, or both (the default): inference for the models, "
                             f"then the training step for those of them in {','.join(TRAIN_REAL)}; "
                             "--mode train trains every model named by --models")
    parser.add_argument("--train", action="store_true", help="the same as --mode train")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny configurations (default device cpu, fp32, variants eager,fuse): a smoke test")
    parser.add_argument("--variants", default=None,
                        help="comma-separated subset of eager,inductor,fuse (eager always runs); "
                             "default all three, eager,fuse with --tiny on a CPU. A compiled variant may name "
                             f"torch.compile's mode after @ ({', '.join(COMPILE_MODES)}): "
                             "inductor@reduce-overhead,fuse@reduce-overhead")
    parser.add_argument("--batch", type=int, default=None,
                        help="run at this batch: the first rows of each input of the chosen size")
    parser.add_argument("--seq", type=int, default=None,
                        help="run at this sequence length: the first positions of each token input")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="auto: cuda when a GPU is visible (and not --tiny), else cpu")
    parser.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"),
                        help="default bf16 on a GPU, fp32 on a CPU")
    parser.add_argument("--out", default=None,
                        help="folder for zoo*.json, .md and .png (default: $OUT if set, else ./bench_out; "
                             "with --chart-from, the first file's folder)")
    parser.add_argument("--chart-from", default=None, metavar="JSON[,JSON...]",
                        help="run nothing: print the table and summary of saved zoo JSON files (several are "
                             "merged) and write their chart to --out")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="Inductor's, Triton's and fuse's cache folders under DIR, kept: a first run with an empty DIR "
                             "measures cold compiles, a second run with the same DIR warm ones")
    parser.add_argument("--keep-caches", action="store_true",
                        help="use the usual Inductor/Triton/fuse cache folders instead of fresh ones")
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="GPU: do_bench warm-up budget (ms)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="GPU: do_bench repetition budget (ms)")
    parser.add_argument("--no-timing", action="store_true",
                        help="check results only; measure and report no times (for runs that share a GPU)")
    parser.add_argument("--repeats", type=int, default=3, help="CPU: timed calls per variant (median)")
    parser.add_argument("--parallel", type=int, default=None, metavar="N",
                        help="run each model and mode in a process of its own, N at a time, each with a GPU of its "
                             "own where there are N (default with --processes: one per GPU, else 1); zoo/parallel.py")
    parser.add_argument("--processes", type=int, default=1, metavar="K",
                        help="with --parallel: run each model and mode in K processes, written as K runs "
                             "(<name>_p1.json ...), and give fuse over Inductor in each and the lowest")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def options_from(args: argparse.Namespace) -> RunOptions:
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    else:
        device = torch.device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if args.variants is None:
        args.variants = "eager,fuse" if args.tiny and device.type == "cpu" else ",".join(VARIANTS)
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in wanted:
        parse_variant(v)
    # eager first; the plain variants in their order, then those with a mode as given
    variants = ("eager",) + tuple(v for v in VARIANTS[1:] if v in wanted)
    variants += tuple(dict.fromkeys(v for v in wanted if "@" in v))
    timing = TimingConfig(args.warmup_ms, args.rep_ms, 0, args.repeats)
    return RunOptions("tiny" if args.tiny else "real", device, dtype, variants, timing, timed=not args.no_timing,
                      batch=args.batch, seq=args.seq)


def mode_from(args: argparse.Namespace) -> str:
    """``--mode``, with ``--train`` read as ``--mode train``."""
    if args.train and args.mode not in (None, "train"):
        raise SystemExit(f"--train is --mode train: it contradicts --mode {args.mode}")
    return "train" if args.train else (args.mode or "both")


def select(names: str, mode: str) -> list[tuple[str, str]]:
    """The (model, mode) pairs to run, inference first (see the module docstring)."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in ZOO and not by_name.is_by_name(n)]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(ZOO)}, or timm:NAME, tv:NAME "
                         "for a model outside the zoo")
    items = []
    if mode in ("inference", "both"):
        items += [(n, "inference") for n in (wanted or ZOO)]
    if mode == "train":
        items += [(n, "train") for n in (wanted or TRAIN_REAL)]
    if mode == "both":
        items += [(n, "train") for n in (wanted or TRAIN_REAL) if n in TRAIN_REAL]
    return items


def chart_from(paths: str, out: str | None) -> list[ZooRow]:
    """``--chart-from``: the table, summary and chart of saved results, nothing run. A ``.txt``
    path is a list of JSON files (``report.listed``); from several files, a model and mode keeps the
    last file's row, and ``<stem>_sources.md`` beside the chart gives each row with its file and
    code (``report.sources_table``)."""
    files = [f for p in paths.split(",") if p.strip()
             for f in (report.listed(p.strip()) if p.strip().endswith(".txt") else [p.strip()])]
    missing = [p for p in files if not os.path.isfile(p)]
    if not files or missing:
        raise SystemExit(f"--chart-from: no such file: {', '.join(missing) or paths!r}")
    sources: dict[tuple[str, str], str] = {}
    rows, env = report.load(files, sources=sources)
    modes = [m for m in report.MODES if any(r.mode == m for r in rows)]
    folder = out or os.path.dirname(os.path.abspath(files[0]))
    name = report.stem(str(env.get("size", "")), modes)
    print_results(rows, env, folder, name)
    if len(files) > 1:
        path = os.path.join(folder, name + "_sources.md")
        with open(path, "w") as f:
            f.write(report.sources_table(rows, sources, os.path.commonpath([os.path.abspath(p) for p in files])))
        print(f"table: {path}")
    return rows


def print_results(rows: list[ZooRow], env: dict[str, Any], folder: str, name: str) -> None:
    """The end of a run (or of ``--chart-from``): the table, the summary, and the chart written."""
    print()
    report.print_table(rows, title=f"zoo: {env.get('device')}, {env.get('dtype')}, {env.get('size')} size")
    text = report.summary(rows)
    if text:
        print("\n" + text)
    for line in report.mode_lines(rows):
        print(line)
    audits = report.audit_lines(rows) + [c for c in map(report.loss_causes, rows) if c]
    if audits:
        print("\nkernels against their floor, and where fuse loses to Inductor:")
        print("\n".join(audits))
    try:
        path = chart.render(rows, env, os.path.join(folder, name + ".png"))
    except ImportError as exc:
        print(f"\nno chart: {exc} (pip install -e '.[zoo]')")
        return
    print("\nno chart: no speedup was measured" if path is None else f"\nchart: {path}")


def main(argv: Sequence[str] | None = None) -> list[ZooRow]:
    from tqdm import tqdm

    from benchmarks.harness import fresh_caches

    parser = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.list:
        for entry in ZOO.values():
            print(f"{entry.name:28s} {entry.library:13s} {entry.description}")
        return []
    if args.chart_from:
        return chart_from(args.chart_from, args.out)
    mode = mode_from(args)
    items = select(args.models, mode)
    options = options_from(args)
    if options.device.type == "cuda":
        with parallel.gpu_turn():
            options = dataclasses.replace(options, bandwidth=audit.copy_bandwidth(options.device))
    modes = [m for m in report.MODES if any(item_mode == m for _, item_mode in items)]
    name = report.stem(options.size, modes or [mode])
    out = args.out or os.environ.get("OUT") or "bench_out"
    env = report.environment(options, modes)
    if os.environ.get(parallel.TURN):
        env["gpu"] = parallel.SHARED
    if options.bandwidth:
        env["copy_gbps"] = round(options.bandwidth / 1e9, 1)
    counts = ", ".join(f"{sum(1 for _, m in items if m == each)} {each}" for each in modes)
    print(f"zoo: {counts or 'nothing to run'}; {env['size']} size, {env['dtype']} on {env['device']}; "
          f"torch {env['torch']}, transformers {env['transformers']}", flush=True)
    if mode == "both" and args.models and "train" not in modes:
        print(f"zoo: no training step: none of the models is in TRAIN_REAL ({', '.join(TRAIN_REAL)}); "
              "--mode train trains any", flush=True)
    if args.parallel is not None or args.processes > 1:
        argv = sys.argv[1:] if argv is None else list(argv)
        return parallel.main(args, items, options.device, env, out, name, argv, print_results)
    rows: list[ZooRow] = []
    paths: list[str] = []
    if args.cache_dir:
        env["caches"] = (f"kept under {args.cache_dir}: "
                         + ("warm (filled by an earlier run)" if os.path.isdir(args.cache_dir) and os.listdir(args.cache_dir)
                            else "cold (empty at the start)"))
    with fresh_caches(not args.keep_caches, args.cache_dir), fusebackend.config.patch(interpret=options.device.type == "cpu"):
        with tqdm(items, unit="model", dynamic_ncols=True) as bar:
            for k, (model, item_mode) in enumerate(bar, 1):
                bar.set_description(f"{model} ({item_mode})")
                row = run_model(model, item_mode, options, log=bar.write)
                _finish(row)
                rows.append(row)
                bar.write(f"[{k}/{len(items)}] {report.progress(row)}")
                paths = report.write(rows, env, out, name)
    if rows:
        print_results(rows, env, out, name)
        print(f"wrote {', '.join(paths)}")
    return rows


if __name__ == "__main__":
    # Run the copy imported under the package name, so that the registry and this CLI share one module.
    from benchmarks.zoo.run import main as package_main

    package_main()
