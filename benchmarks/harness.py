"""The benchmark harness: eager, Inductor and fuse side by side in one process.

A ``Case`` is a workload (a callable built by a compiler, plus a factory of fresh inputs) and,
for memory-bound cases, the bytes it must move. ``run_suite`` runs every case through each
variant:

- ``eager``: the callable as written; its outputs are the reference.
- ``inductor``: ``torch.compile(fn)`` (default backend). Reported as ``n/a`` when it cannot run
  here (for instance a CPU machine without a C++ compiler).
- ``fuse``: ``torch.compile(fn, backend=fusebackend.fuse)``.

For each compiled variant, in this order:

1. cold compile: ``torch._dynamo.reset()``, build, and time the first call on input set A
   (trace + compile + one run, synchronized). Its outputs are checked against eager on A.
2. warm compile: ``torch._dynamo.reset()``, build again from a fresh function object of the same
   code, and time its first call on input set B; the backends' on-disk (and in-process) kernel
   caches are now populated. Its outputs are checked against eager on B.
3. timing: the median time of one call on input set B, nothing else (no compile, no checks).

A variant whose check fails is reported ``FAIL`` and not timed (``check.py`` says what passes).
Timing on a GPU uses ``triton.testing.do_bench`` (CUDA events around each call, L2 flushed in
between, median); on a CPU, ``time.perf_counter`` around each of a few calls, median
(``timing.py``). ``report.py`` turns the results into the table, Markdown and JSON.

The bandwidth floor of a memory-bound case is ``floor_bytes / copy_bandwidth``, where the copy
bandwidth is measured in the same run by a large device-to-device ``copy_`` (bytes read + bytes
written over its median time). ``floor %`` is floor time over measured time.

Unless ``--keep-caches`` is given, Inductor, Triton and fuse write their caches to a fresh
temporary folder, so "cold" means no kernels on disk from earlier runs. Before the first case each
compiled variant compiles a trivial function once, so that one-time start-up (imports, worker
pools, the GPU driver's first compile) is reported separately and not charged to the first case.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import os
import platform
import sys
import tempfile
import time
import types
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch

import fusebackend
from benchmarks import report
from benchmarks.check import Mismatch, against_reference, compare, describe, tensors
from benchmarks.results import CaseResult, RunResult, VariantResult  # also imported as harness.CaseResult ...
from benchmarks.timing import CopyBandwidth, TimingConfig, copy_bandwidth, free_memory, median_ms, timed_call

Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]

# Suites the CLI knows: name -> module with ``cases(device, small) -> list[Case]``.
SUITES = {"memory_bound": "benchmarks.memory_bound", "models": "benchmarks.models_bench"}
VARIANTS = ("eager", "inductor", "fuse")


# --------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a case runs. ``build(compiler)`` returns the step to time, with the case's function(s)
    passed through ``compiler``; ``make_inputs()`` draws a fresh input tuple (the harness seeds
    torch's generator before each call)."""

    build: Callable[[Compiler], Callable[..., Any]]
    make_inputs: Callable[[], tuple[Any, ...]]
    # the same step in fp32 on the same inputs (a half-precision model's parameters upcast), for
    # outputs that miss eager's tolerance: see check.against_reference
    reference: Callable[..., Any] | None = None


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark. ``setup`` is called when the case runs (so models and tensors exist only
    then). ``floor_bytes(inputs, outputs)``: the bytes that must move through device memory, for
    memory-bound cases; None for cases with compute-bound parts (matrix products, convolutions)."""

    name: str
    description: str
    setup: Callable[[], Workload]
    floor_bytes: Callable[[tuple[Any, ...], Any], int] | None = None
    precision: torch.dtype | None = None  # the compute dtype, where outputs are finer (see check.compare)


def function_case(
    name: str,
    description: str,
    fn: Callable[..., Any],
    make_inputs: Callable[[], tuple[Any, ...]],
    floor_bytes: Callable[[tuple[Any, ...], Any], int] | None = None,
) -> Case:
    """A case that times ``fn(*inputs)`` (compiled or not) and nothing else."""
    return Case(name, description, lambda: Workload(lambda compile_: compile_(fn), make_inputs), floor_bytes)


def nbytes(*objs: Any) -> int:
    """Bytes of every tensor in ``objs`` (numel x element size), each counted once."""
    return sum(t.numel() * t.element_size() for t in tensors(objs))


def io_bytes(inputs: tuple[Any, ...], outputs: Any) -> int:
    """The floor of a single fused pass: every input read once, every output written once."""
    return nbytes(inputs, outputs)


def fresh_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A new function object with the same code, globals, defaults and closure as ``fn``.

    Anything that is not a plain Python function (a module, a bound method) is returned as is.
    """
    if not isinstance(fn, types.FunctionType):
        return fn
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    copy.__qualname__ = fn.__qualname__
    return copy


def _eager(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


def _inductor(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fresh_function(fn))


def _fuse(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fresh_function(fn), backend=fusebackend.fuse)


COMPILERS: dict[str, Compiler] = {"eager": _eager, "inductor": _inductor, "fuse": _fuse}


# --------------------------------------------------------------------------------------------
# Running


@dataclasses.dataclass(frozen=True)
class RunConfig:
    device: torch.device
    variants: tuple[str, ...] = VARIANTS
    timing: TimingConfig = TimingConfig()
    copy_nbytes: int = 1 << 30


def short_error(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most ``limit`` characters (and an ellipsis)."""
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


@contextlib.contextmanager
def recording_warnings(into: list[str], prefix: str = "", limit: int | None = None) -> Iterator[None]:
    """Append each distinct warning raised inside the block (those starting with ``prefix``, cut
    to ``limit`` characters) to ``into``, one line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                text = str(w.message).strip().replace("\n", " ")
                if text.startswith(prefix) and text not in into:
                    into.append(text if limit is None else text[:limit])


def _reset_backends() -> None:
    torch._dynamo.reset()
    fusebackend.metrics.reset()
    fusebackend.dump.clear()
    try:
        import torch._inductor.metrics as inductor_metrics

        inductor_metrics.reset()
    except Exception:  # Inductor unavailable: nothing to reset
        pass


def _inductor_kernel_count() -> int | None:
    try:
        import torch._inductor.metrics as inductor_metrics

        return int(inductor_metrics.generated_kernel_count)
    except Exception:
        return None


def _record_fuse_stats(result: VariantResult) -> None:
    artifacts = fusebackend.history()
    result.graph_kernels = {a.name: a.kernel_count for a in artifacts}
    result.kernels = sum(result.graph_kernels.values())
    result.fallbacks = dict(fusebackend.metrics.fallbacks)
    result.eager_graphs = fusebackend.metrics.eager_graphs


def _check(out: Any, expected: Any, precision: torch.dtype | None,
           reference: Callable[[], Any] | None) -> tuple[float, list[str]]:
    """``compare`` against eager; where that fails and the case has an fp32 reference, the
    comparison with it decides (``check.against_reference``)."""
    try:
        return compare(out, expected, precision)
    except Mismatch:
        if reference is None:
            raise
        err, note = against_reference(out, expected, reference(), precision)
        return err, [note] if note else []


def run_variant(name: str, work: Workload, inputs_a: tuple[Any, ...], inputs_b: tuple[Any, ...],
                expected_a: Any, expected_b: Any, config: RunConfig, precision: torch.dtype | None = None,
                references: tuple[Callable[[], Any], Callable[[], Any]] | None = None) -> VariantResult:
    """Compile cold (checked on A), compile warm (checked on B), then time on B (see module doc).

    ``references``: the fp32 reference outputs for A and B, computed on demand (see ``_check``).
    """
    device, result = config.device, VariantResult(name, "ok")
    ref_a, ref_b = references if references is not None else (None, None)
    compiler = COMPILERS[name]
    with recording_warnings(result.warnings):
        try:
            _reset_backends()
            step = work.build(compiler)
            out, result.compile_cold_s = timed_call(step, inputs_a, device)
            if name == "fuse":
                _record_fuse_stats(result)
            elif name == "inductor":
                result.kernels = _inductor_kernel_count()
            err_a, notes = _check(out, expected_a, precision, ref_a)
            del out, step
            torch._dynamo.reset()
            step = work.build(compiler)
            out, result.compile_warm_s = timed_call(step, inputs_b, device)
            err_b, notes_b = _check(out, expected_b, precision, ref_b)
            notes += [n for n in notes_b if n not in notes]
            del out
            result.error, result.notes = max(err_a, err_b), notes
            result.median_ms = median_ms(lambda: step(*inputs_b), device, config.timing)
            warm_eager = fusebackend.metrics.eager_graphs - result.eager_graphs
            if name == "fuse" and warm_eager:
                result.notes.append(f"{warm_eager} graph(s) of the warm compile ran eagerly")
        except Mismatch as exc:
            result.status = "FAIL"
            result.notes.append(str(exc))
        except Exception as exc:  # a backend that raises is reported; the other variants still run
            result.status = "error"
            result.notes.append(short_error(exc))
    if name == "fuse":
        for text in result.warnings:
            if text.startswith("fusebackend"):
                result.notes.append(text if len(text) <= 300 else text[:300] + "...")
    return result


def run_case(case: Case, config: RunConfig, unavailable: dict[str, str]) -> CaseResult:
    """Run one case; an exception (out of memory, a broken case) is recorded, never raised.

    Device memory is freed afterwards: the case's tensors live only in ``_measure``'s frame.
    """
    result = CaseResult(case.name, case.description)
    start = time.perf_counter()
    try:
        _measure(case, config, unavailable, result)
    except Exception as exc:
        result.error = short_error(exc)
    finally:
        torch._dynamo.reset()
        free_memory(config.device)
    result.seconds = time.perf_counter() - start
    return result


def _measure(case: Case, config: RunConfig, unavailable: dict[str, str], result: CaseResult) -> None:
    """Eager first (the reference and the baseline time), then each compiled variant."""
    device = config.device
    work = case.setup()
    torch.manual_seed(1)
    inputs_a = work.make_inputs()
    torch.manual_seed(2)
    inputs_b = work.make_inputs()
    result.inputs = [describe(t) for t in tensors(inputs_b)]
    eager_step = work.build(_eager)
    expected_a, _ = timed_call(eager_step, inputs_a, device)
    expected_b, _ = timed_call(eager_step, inputs_b, device)
    eager = VariantResult("eager", "ref", speedup=1.0)
    eager.median_ms = median_ms(lambda: eager_step(*inputs_b), device, config.timing)
    result.variants.append(eager)
    if case.floor_bytes is not None:
        result.floor_bytes = case.floor_bytes(inputs_b, expected_b)
    references = None
    if work.reference is not None:
        reference = work.reference
        # computed at most once each, and only if some variant misses eager's tolerance
        references = (functools.cache(lambda: reference(*inputs_a)), functools.cache(lambda: reference(*inputs_b)))
    for name in (v for v in config.variants if v != "eager"):
        if name in unavailable:
            result.variants.append(VariantResult(name, "n/a", notes=[unavailable[name]]))
            continue
        result.variants.append(run_variant(name, work, inputs_a, inputs_b, expected_a, expected_b, config,
                                           case.precision, references))
        free_memory(device)


def _finish(result: CaseResult, copy: CopyBandwidth | None) -> None:
    """Speedups against eager and fractions of the bandwidth floor."""
    eager_ms = result.variants[0].median_ms if result.variants else None
    if result.floor_bytes is not None and copy is not None:
        result.floor_ms = result.floor_bytes / copy.bytes_per_s * 1e3
    for v in result.variants:
        if v.median_ms is None:
            continue
        if eager_ms:
            v.speedup = eager_ms / v.median_ms
        if result.floor_ms is not None:
            v.floor_fraction = result.floor_ms / v.median_ms


def _prime(name: str, device: torch.device) -> float:
    """Compile and run a trivial function once: the process's one-time start-up cost."""
    def trivial(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 + 1.0

    _reset_backends()
    x = torch.randn(64, device=device)
    _, seconds = timed_call(COMPILERS[name](trivial), (x,), device)
    torch._dynamo.reset()
    return seconds


def environment(device: torch.device) -> dict[str, Any]:
    import triton

    env: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "fuse_interpreter": fusebackend.use_interpreter(),
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
    return env


def run_suite(suite: str, cases: Sequence[Case], config: RunConfig,
              log: Callable[[str], None] = print) -> RunResult:
    """Run ``cases`` in order; one failing case never stops the others."""
    device = config.device
    env = environment(device)
    log(f"{suite}: {len(cases)} cases on {env['device']}; torch {env['torch']}, triton {env['triton']}")
    copy = None
    try:
        copy = copy_bandwidth(device, config.copy_nbytes, config.timing)
        log(f"copy bandwidth: {copy.bytes_per_s / 1e9:.1f} GB/s ({copy.nbytes / 2**20:.0f} MiB copied in {copy.median_ms:.3f} ms)")
    except Exception as exc:
        log(f"copy bandwidth: not measured ({short_error(exc)})")
    free_memory(device)
    startup: dict[str, float | str] = {}
    unavailable: dict[str, str] = {}
    for name in config.variants:
        if name == "eager":
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                startup[name] = _prime(name, device)
            log(f"{name}: start-up compile {startup[name]:.1f} s")
        except Exception as exc:
            startup[name] = f"start-up compile failed: {short_error(exc, 200)}"
            log(f"{name}: {startup[name]}")
            if name == "inductor":  # cannot run here (no compiler, no Triton for this device)
                unavailable[name] = startup[name]
    results = []
    for k, case in enumerate(cases, 1):
        result = run_case(case, config, unavailable)
        _finish(result, copy)
        results.append(result)
        log(f"[{k}/{len(cases)}] {case.name} ({result.seconds:.1f} s): " + _progress(result))
    return RunResult(suite, env, copy, startup, results)


def _progress(result: CaseResult) -> str:
    if result.error:
        return f"ERROR {result.error}"
    parts = []
    for v in result.variants:
        t = f" {v.median_ms:.4g} ms" if v.median_ms is not None else ""
        parts.append(f"{v.variant} {v.status}{t}")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every suite's command line shares."""
    parser.add_argument("--small", action="store_true", help="tiny shapes, for a CPU check in Triton's interpreter")
    parser.add_argument("--cases", default="", help="comma-separated case names to run (default: all); see --list")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--variants", default=None,
                        help="comma-separated subset of eager,inductor,fuse; eager always runs (it is the reference). "
                             "Default: all three, except eager,fuse with --small on a CPU, where Inductor's C++ "
                             "compiles would take most of the run")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="auto: cuda when a GPU is visible, else cpu")
    parser.add_argument("--out", default=os.environ.get("OUT") or "bench_out",
                        help="folder for the JSON and Markdown results (default: $OUT if set, else ./bench_out)")
    parser.add_argument("--keep-caches", action="store_true",
                        help="use the usual Inductor/Triton/fuse cache folders instead of fresh ones, so 'cold' may be warm")
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="GPU: do_bench warm-up budget (ms)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="GPU: do_bench repetition budget (ms)")
    parser.add_argument("--l2", default="zeroed", choices=("zeroed", "clean"),
                        help="GPU: how the L2 is flushed between timed calls: zeroed (do_bench's flush, which "
                             "leaves dirty lines the call must write back) or clean (see benchmarks/timing.py)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="CPU: calls timed per variant, median reported (the check call before is the warm-up)")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="CPU: torch intra-op threads (default 1: on tiny shapes, waking a thread pool costs more "
                             "than the work and makes CPU times noise; 0 leaves torch's default)")
    parser.add_argument("--copy-mib", type=int, default=None,
                        help="size of the bandwidth-measuring copy (default 1024 MiB on a GPU, 256 on a CPU)")


@contextlib.contextmanager
def fresh_caches(enabled: bool, root: str | None = None) -> Iterator[str | None]:
    """Point Inductor, Triton and fuse at empty cache folders for the duration of the run; with
    ``root``, at folders under it, kept after the run (a second run with the same root starts
    warm: what the first compiled is in them)."""
    if not enabled:
        yield None
        return
    with (contextlib.nullcontext(root) if root else tempfile.TemporaryDirectory(prefix="fuse-bench-cache-")) as root:
        saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
        try:
            with fusebackend.config.patch(cache_dir=os.path.join(root, "fuse")):
                yield root
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _select(cases: list[Case], names: str) -> list[Case]:
    if not names:
        return cases
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {c.name: c for c in cases}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in wanted]


def main_for(suites: Sequence[str], args: argparse.Namespace) -> list[RunResult]:
    """Run the named suites with parsed options; print each table and write JSON and Markdown."""
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if args.variants is None:
        args.variants = "eager,fuse" if args.small and device.type == "cpu" else ",".join(VARIANTS)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    variants = ("eager",) + tuple(v for v in VARIANTS[1:] if v in variants)
    all_cases = {s: importlib.import_module(SUITES[s]).cases(device, args.small) for s in suites}
    if args.list:
        for s, cases in all_cases.items():
            for c in cases:
                print(f"{s}: {c.name:28s} {c.description}")
        return []
    copy_mib = args.copy_mib or (1024 if device.type == "cuda" else 256)
    if device.type == "cpu" and args.cpu_threads > 0:
        torch.set_num_threads(args.cpu_threads)
    config = RunConfig(device, variants, TimingConfig(args.warmup_ms, args.rep_ms, 0, args.repeats, args.l2), copy_mib << 20)
    results = []
    # On a CPU the generated kernels run in Triton's interpreter; on a GPU, compiled.
    with fresh_caches(not args.keep_caches), fusebackend.config.patch(interpret=device.type == "cpu"):
        for s in suites:
            cases = _select(all_cases[s], args.cases)
            result = run_suite(s + (" (small)" if args.small else ""), cases, config)
            result.environment["timing"] = config.timing.method(device)
            result.environment["variants"] = list(variants)
            if device.type == "cpu":
                result.environment["cpu_threads"] = torch.get_num_threads()
            result.environment["caches"] = "usual folders" if args.keep_caches else "fresh (empty) folders"
            paths = report.write(result, args.out, s + ("_small" if args.small else ""))
            print()
            print(report.table(result))
            print(f"\nwrote {', '.join(paths)}")
            results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.harness",
        description="Run benchmark suites: eager vs Inductor vs fuse, checked, timed, against the bandwidth floor.",
    )
    parser.add_argument("suites", nargs="*", metavar="SUITE",
                        help=f"suites to run, of {', '.join(SUITES)} (default: all)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.suites = args.suites or list(SUITES)
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    if args.cases and len(args.suites) > 1:
        parser.error("--cases needs exactly one suite")
    main_for(args.suites, args)


if __name__ == "__main__":
    # Run the copy imported under the package name, so the suites and this CLI share one module.
    from benchmarks.harness import main as package_main

    sys.exit(package_main())
