"""Cold and warm compile times of the zoo's models, each backend in processes of its own.

The zoo compiles eager, Inductor and fuse in one process. There the backend that goes second
finds the other's imports done and its worker processes still starting. This runs the zoo with
``--no-timing`` (every first call still checked against eager) in separate processes:

    for each repeat, for each backend (the order alternates between repeats):
        python -m benchmarks.zoo --variants eager,BACKEND --no-timing --cache-dir DIR   (cold: DIR empty)
        the same command again                                                        (warm: DIR kept)

Each cold process starts from empty Inductor, Triton and fuse cache folders; its warm process
then reads what it left. A first call is timed from ``torch.compile(model)`` to the call's
return: Inductor imports its compiler (about 200 modules) inside ``torch.compile``, fuse inside
the first call (AOTAutograd's cache key imports them), so timing the call alone would leave
Inductor's imports out (stage ``torch.compile``). The table gives per model each backend's
first call, cold and warm: the median over repeats and the range (``min-max``). Beside them it
gives fuse over Inductor (medians), and fuse's own stages on a warm start (all but
``torch.compile``, Dynamo's, AOTAutograd's and the rest of the call). Below it, each backend's
first call by stage (medians).

    PYTHONPATH=. python -m benchmarks.compile_time --models gpt2,bert [--mode inference] [--repeats 2] [--out DIR]
    PYTHONPATH=. python -m benchmarks.compile_time --from DIR      # the table of runs saved in DIR
    PYTHONPATH=. python -m benchmarks.compile_time --from DIR --chart compile_time.png   # and its chart

Runs go to ``DIR/compile_time/<backend>_<repeat>_<cold|warm>/`` (the zoo's JSON and Markdown).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Sequence

from benchmarks.zoo import report

BACKENDS = ("inductor", "fuse")
STATES = ("cold", "warm")
OUTSIDE = {"torch.compile", "dynamo", "aot", "other"}  # stages that are not fuse's own


def run(models: str, mode: str, repeats: int, out: str, timeout: float, backends: Sequence[str] = BACKENDS,
        tiny: bool = False, start: int = 0) -> None:
    """The zoo, once per repeat, backend and cache state, each in its own process. Repeats are
    numbered from ``start``; the backends go in the order given in even ones, reversed in odd ones."""
    for r in range(start, start + repeats):
        order = list(backends) if r % 2 == 0 else list(backends)[::-1]
        for backend in order:
            caches = tempfile.mkdtemp(prefix=f"compile-time-{backend}-{r}-")
            try:
                for state in STATES:
                    folder = os.path.join(out, "compile_time", f"{backend}_{r}_{state}")
                    os.makedirs(folder, exist_ok=True)
                    cmd = [sys.executable, "-m", "benchmarks.zoo", "--models", models, "--mode", mode,
                           "--variants", f"eager,{backend}", "--no-timing", "--cache-dir", caches, "--out", folder] + (["--tiny"] if tiny else [])
                    try:
                        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                        status = f"exit {done.returncode}"
                        if done.returncode:
                            print(done.stderr[-2000:], file=sys.stderr)
                    except subprocess.TimeoutExpired:
                        status = f"timed out after {timeout:.0f} s (the models done are saved)"
                    print(f"{backend} repeat {r} {state}: {status}", flush=True)
            finally:
                shutil.rmtree(caches, ignore_errors=True)


def collect(out: str) -> dict[tuple[str, str, str], list[dict[str, object]]]:
    """(model, backend, state) -> the compiled variant's stats in each repeat, from the JSON saved."""
    found: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    for backend in BACKENDS:
        for state in STATES:
            for path in sorted(glob.glob(os.path.join(out, "compile_time", f"{backend}_*_{state}", "zoo*.json"))):
                rows, _ = report.load([path], log=lambda _: None)
                for row in rows:
                    stats = row.get(backend)
                    if stats is not None and stats.status == "ok" and stats.first_call_s is not None:
                        found.setdefault((f"{row.model} ({row.mode})", backend, state), []).append(
                            {"s": stats.first_call_s, "stages": stats.compile_stages})
    return found


def _spread(values: Sequence[float], digits: int = 1) -> str:
    """The median, and the range where there are several."""
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.{digits}f}" if len(values) == 1 else f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def table(found: dict[tuple[str, str, str], list[dict[str, object]]]) -> str:
    """Markdown: first calls per model, backend and state; then the stages (medians)."""
    models = list(dict.fromkeys(m for m, _, _ in found))

    def seconds(model: str, backend: str, state: str) -> list[float]:
        return [float(x["s"]) for x in found.get((model, backend, state), [])]  # type: ignore[arg-type]

    def own(model: str) -> list[float]:
        return [sum(v for k, v in x["stages"].items() if k not in OUTSIDE)  # type: ignore[union-attr]
                for x in found.get((model, "fuse", "warm"), [])]

    head = ["model", "Inductor cold", "fuse cold", "fuse / Inductor", "Inductor warm", "fuse warm",
            "fuse / Inductor", "fuse warm: own stages"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        cells = [m]
        for state in STATES:
            ind, fuse = seconds(m, "inductor", state), seconds(m, "fuse", state)
            ratio = "-" if not ind or not fuse else f"{_median(fuse) / _median(ind):.2f}"  # type: ignore[operator]
            cells += [_spread(ind), _spread(fuse), ratio]
        cells.append(_spread(own(m), digits=2))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "First call by stage, medians over repeats (s):", ""]
    for m in models:
        for backend in BACKENDS:
            for state in STATES:
                runs = found.get((m, backend, state), [])
                names = sorted({k for x in runs for k in x["stages"]})  # type: ignore[union-attr]
                if not names:
                    continue
                parts = ", ".join(
                    f"{k} {statistics.median(float(x['stages'].get(k, 0.0)) for x in runs):.2f}"  # type: ignore[union-attr]
                    for k in names)
                lines.append(f"- {m}, {backend} {state}: {parts}")
    return "\n".join(lines)


def chart(found: dict[tuple[str, str, str], list[dict[str, object]]], path: str, title: str) -> str | None:
    """A PNG of fuse's first call over Inductor's per model (medians), cold and warm: left of the
    line at 1 fuse is faster (``report.bars``; None where nothing was measured)."""
    from benchmarks import report as harness_report

    models = list(dict.fromkeys(m for m, _, _ in found))

    def ratio(model: str, state: str) -> float | None:
        ind, fuse = (_median([float(x["s"]) for x in found.get((model, b, state), [])])  # type: ignore[arg-type]
                     for b in ("inductor", "fuse"))
        return None if ind is None or fuse is None else fuse / ind

    series = {f"{state} start": [ratio(m, state) for m in models] for state in STATES}
    return harness_report.bars(models, series, path, title, "fuse's first call over Inductor's (under 1: fuse is faster)",
                               reference=1.0)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated zoo models (the zoo's --models)")
    parser.add_argument("--mode", default="inference", choices=("inference", "train"))
    parser.add_argument("--repeats", type=int, default=2, help="cold and warm processes per backend")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"), help="folder for the runs")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per process")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="inductor,fuse or a part, in the order run")
    parser.add_argument("--start", type=int, default=0,
                        help="number the repeats from this (more repeats added to a folder; odd ones reverse the order)")
    parser.add_argument("--tiny", action="store_true", help="the zoo's tiny configurations (a smoke test on a CPU)")
    parser.add_argument("--from", dest="saved", default=None, metavar="DIR", help="run nothing: the table of DIR (or DIR,DIR...)")
    parser.add_argument("--chart", default=None, metavar="PNG", help="also draw fuse / Inductor per model there")
    opts = parser.parse_args(argv)
    if opts.saved is None:
        if not opts.models:
            parser.error("--models is needed (or --from DIR)")
        backends = [b for b in opts.backends.split(",") if b]
        unknown = set(backends) - set(BACKENDS)
        if unknown:
            parser.error(f"unknown backend(s) {', '.join(sorted(unknown))}")
        run(opts.models, opts.mode, opts.repeats, opts.out, opts.timeout, backends, opts.tiny, opts.start)
    found: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    for folder in (opts.saved or opts.out).split(","):  # several folders: one table (the zoo split across processes)
        for key, runs in collect(folder).items():
            found.setdefault(key, []).extend(runs)
    print(table(found))
    if opts.chart:
        print(chart(found, opts.chart, "fuse's first call over Inductor's, each backend in processes of its own")
              or "no chart: nothing measured, or matplotlib is not installed")


if __name__ == "__main__":
    main()
