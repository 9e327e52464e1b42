"""The OpInfo sweep's CLI: run every op of ``op_db`` with float32 samples through
``backend="fuse"`` (``benchmarks/opinfo_run.py``) and report.

    python -m benchmarks.opinfo --out opinfo.json            # every op, ~10 min on 2 cores
    python -m benchmarks.opinfo --ops add,softmax,fft.fft    # some ops

It prints one line per op as it goes, then the three figures the README reports (ops that match
eager, ops that generate kernels, ops whose graph ran eagerly), the ops by category, and for every
op that mismatched, raised, or ran a graph eagerly the first line of the error or warning, grouped
by cause. ``--out`` writes the same as JSON (every op's ``OpResult``, its time included).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import platform
import re
import subprocess
import sys
from typing import Any, Sequence

import torch

from benchmarks.opinfo_run import (DEFAULT_SAMPLES, DEFAULT_TIME_LIMIT, METADATA_ONLY, OpResult,
                                   float32_ops, op_name, run_ops)

STATUSES = ("match", "mismatch", "error", "timeout", "skipped")
KINDS = ("kernels", "aten_only", "eager_graph", "no_graph")


def figures(results: Sequence[OpResult]) -> dict[str, int]:
    """The headline counts. ``kernels`` counts every op with a generated kernel, ``eager_graph``
    every op with a graph run eagerly (an op can be both; its ``kind`` is then ``eager_graph``)."""
    return {
        "ops": len(results),
        "match": sum(r.status == "match" for r in results),
        "kernels": sum(r.kernels > 0 for r in results),
        "eager_graph": sum(r.eager_graphs > 0 for r in results),
        **{f"status_{s}": sum(r.status == s for r in results) for s in STATUSES},
        **{f"kind_{k}": sum(r.kind == k for r in results) for k in KINDS},
    }


def cause(line: str) -> str:
    """A warning or error line with what varies between ops taken out (graph names, numbers),
    so that one cause groups the ops it hits."""
    line = re.sub(r"graph \S+ failed", "graph failed", line)
    line = re.sub(r"\b(sample \d+: )", "", line)
    return re.sub(r"\d+", "N", line)


def _problem_lines(r: OpResult) -> list[str]:
    """The lines that say why ``r`` is not clean: its errors and mismatches, and for a graph run
    eagerly the backend's warnings."""
    lines = list(r.problems)
    if r.eager_graphs:
        lines += [w for w in r.warnings if w.startswith("fusebackend")] or ["(no backend warning caught)"]
    return lines


def grouped(results: Sequence[OpResult]) -> dict[str, list[tuple[str, str]]]:
    """Cause -> [(op, its first line for that cause)], biggest groups first."""
    groups: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for r in results:
        seen = set()
        for line in _problem_lines(r):
            key = cause(line)
            if key not in seen:
                seen.add(key)
                groups[key].append((r.name, line))
    return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def report(results: Sequence[OpResult], samples: int) -> str:
    f = figures(results)
    n = f["ops"]
    out = [
        f"OpInfo sweep: {n} ops of op_db with float32 samples, up to {samples} samples each",
        f"  match eager:         {f['match']} / {n}",
        f"  generate kernels:    {f['kernels']} / {n}",
        f"  graph ran eagerly:   {f['eager_graph']} / {n}",
        "  status: " + ", ".join(f"{s} {f['status_' + s]}" for s in STATUSES),
        "  kind:   " + ", ".join(f"{k} {f['kind_' + k]}" for k in KINDS),
        f"  seconds: {sum(r.seconds for r in results):.0f} in all",
        "",
    ]
    by_status = {s: [r for r in results if r.status == s] for s in STATUSES}
    by_kind = {k: [r for r in results if r.kind == k] for k in KINDS}
    for s in ("mismatch", "error", "timeout"):
        if by_status[s]:
            out.append(f"{s} ({len(by_status[s])}):")
            out += [f"  {r.name}: {r.problems[0] if r.problems else ''}" for r in by_status[s]]
            out.append("")
    if by_status["skipped"]:
        out.append(f"skipped: no sample eager runs ({len(by_status['skipped'])}): "
                   + ", ".join(r.name for r in by_status["skipped"]))
        out.append("")
    bad = [r for r in results if r.status in ("mismatch", "error", "timeout") or r.eager_graphs]
    if bad:
        out.append("causes (mismatches, errors, timeouts, graphs run eagerly), by first line:")
        for key, members in grouped(bad).items():
            out.append(f"  [{len(members)}] {members[0][1]}")
            out.append("      " + ", ".join(name for name, _ in members))
        out.append("")
    out.append(f"kernels ({len(by_kind['kernels'])}): " + ", ".join(r.name for r in by_kind["kernels"]))
    out.append("")
    out.append(f"aten_only ({len(by_kind['aten_only'])}), with the ATen ops left as calls:")
    out += [f"  {r.name}: {', '.join(r.fallbacks) or '(none: a graph of views or constants)'}"
            for r in by_kind["aten_only"]]
    out.append("")
    out.append(f"eager_graph ({len(by_kind['eager_graph'])}): " + ", ".join(r.name for r in by_kind["eager_graph"]))
    out.append("")
    out.append(f"no_graph: Dynamo handed the backend no graph ({len(by_kind['no_graph'])}), with its graph-break reason:")
    out += [f"  {r.name}: {r.graph_breaks[0] if r.graph_breaks else '(no graph break: nothing to compile)'}"
            for r in by_kind["no_graph"]]
    out.append("")
    meta = [r for r in results if r.compared != "values"]
    out.append(f"compared on structure, shape and dtype only ({len(meta)}): "
               + ", ".join(f"{r.name} ({r.compared})" for r in meta))
    varies = [r.name for r in results if any("vary" in note for note in r.notes) and r.name not in METADATA_ONLY]
    if varies:
        out.append("eager varies between calls (compared on metadata), not in METADATA_ONLY: " + ", ".join(varies))
    loose = [r.name for r in results if any("reduction tolerance" in note for note in r.notes)]
    out.append(f"within the reduction tolerance only ({len(loose)}): " + ", ".join(loose))
    return "\n".join(out)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def to_json(results: Sequence[OpResult], args: argparse.Namespace) -> dict[str, Any]:
    import triton

    return {
        "meta": {"commit": _commit(), "torch": torch.__version__, "triton": triton.__version__,
                 "python": platform.python_version(), "device": args.device, "samples": args.samples,
                 "time_limit": args.time_limit},
        "figures": figures(results),
        "ops": [dataclasses.asdict(r) for r in results],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="", help="comma-separated op names (with variant: 'div.trunc_rounding'); default all")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="samples per op (the first ones eager runs)")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, help="seconds per op")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="", help="write the results as JSON to this file")
    args = parser.parse_args(argv)

    ops = float32_ops(args.device)
    if args.ops:
        wanted = args.ops.split(",")
        known = {op_name(op) for op in ops}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            parser.error(f"no float32 OpInfo named {', '.join(unknown)}")
        ops = [op for op in ops if op_name(op) in wanted]

    def progress(r: OpResult, i: int, n: int) -> None:
        print(f"[{i}/{n}] {r.name}: {r.status} {r.kind} {r.seconds:.1f}s", flush=True)

    results = run_ops(ops, args.device, args.samples, args.time_limit, progress)
    print()
    print(report(results, args.samples))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(to_json(results, args), fh, indent=1)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
