"""The OpInfo sweep's CLI: run every op of ``op_db`` with float32 samples through
``backend="fuse"`` (``benchmarks/opinfo_run.py``) and report.

    python -m benchmarks.opinfo --out opinfo.json            # every op, ~10 min on 2 cores
    python -m benchmarks.opinfo --ops add,softmax,fft.fft    # some ops
    python -m benchmarks.opinfo --warm                       # every op, twice: a warm start

``--warm`` runs the sweep in two processes, one after the other, over the same cache folders
(fuse's, Inductor's with AOTAutograd's entries, Triton's; fresh ones, or under ``--cache-dir``),
as a user's second process meets them. It reports every op whose second run is worse than its
first (``warm_regressions``): a graph run eagerly, another status, or a graph compiled again
where the first run stored it.

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
import os
import platform
import re
import subprocess
import sys
from typing import Any, Sequence

import torch

from benchmarks.opinfo_run import (DEFAULT_SAMPLES, DEFAULT_TIME_LIMIT, METADATA_ONLY, OpResult,
                                   float32_ops, op_name, run_ops)

_REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def warm_regressions(first: Sequence[dict[str, Any]], second: Sequence[dict[str, Any]]) -> list[str]:
    """What the second of two runs over the same cache folders did worse, one line per op: a
    graph run eagerly where the first ran none, another status than the first's, or a graph
    compiled again (missing fuse's cache) that the first compiled and stored. Runs given as the
    ``ops`` of ``to_json``."""
    before = {r["name"]: r for r in first}
    lines = []
    for r in second:
        old = before.get(r["name"])
        if old is None:
            continue
        why = []
        if r["eager_graphs"] and not old["eager_graphs"]:
            why.append(f"{r['eager_graphs']} graph(s) ran eagerly ({(r['warnings'] or [''])[0]})")
        if r["status"] != old["status"]:
            why.append(f"{old['status']} cold, {r['status']} warm ({(r['problems'] or [''])[0]})")
        if r["cache_misses"] and old["cache_misses"] and not old["eager_graphs"]:
            why.append(f"{r['cache_misses']} graph(s) compiled again, {r['cache_hits']} loaded")
        if why:
            lines.append(f"{r['name']}: " + "; ".join(why))
    return lines


def run_warm(argv: Sequence[str], cache_dir: str | None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The sweep of ``argv`` (this CLI's arguments, without ``--warm``) in two child processes
    over the same cache folders: the two runs' JSON, and ``warm_regressions`` of the second."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="opinfo-warm-") as scratch:
        root = cache_dir or os.path.join(scratch, "caches")
        env = dict(os.environ, FUSE_CACHE_DIR=os.path.join(root, "fuse"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"), TRITON_CACHE_DIR=os.path.join(root, "triton"))
        runs = []
        for which in ("cold", "warm"):
            out = os.path.join(scratch, f"{which}.json")
            done = subprocess.run([sys.executable, "-m", "benchmarks.opinfo", *argv, "--out", out], env=env,
                                  capture_output=True, text=True, cwd=_REPOSITORY)
            if done.returncode != 0:
                raise RuntimeError(f"the {which} run failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
            with open(out) as fh:
                runs.append(json.load(fh))
    return runs[0], runs[1], warm_regressions(runs[0]["ops"], runs[1]["ops"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="", help="comma-separated op names (with variant: 'div.trunc_rounding'); default all")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="samples per op (the first ones eager runs)")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, help="seconds per op")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="", help="write the results as JSON to this file")
    parser.add_argument("--warm", action="store_true",
                        help="run the sweep twice, in two processes over the same cache folders, and report the ops "
                             "whose second (warm) run is worse")
    parser.add_argument("--cache-dir", default=None, help="with --warm: the cache folders under this one (default: fresh)")
    args = parser.parse_args(argv)
    if args.warm:
        inner = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--warm"]
        inner = _without_option(_without_option(inner, "--cache-dir"), "--out")
        cold, warm, regressions = run_warm(inner, args.cache_dir)
        hits = sum(r["cache_hits"] for r in warm["ops"])
        graphs = sum(r["graphs"] for r in warm["ops"])
        print(f"warm start: {len(warm['ops'])} ops; cold run {cold['figures']['eager_graph']} with a graph run eagerly, "
              f"warm run {warm['figures']['eager_graph']}; warm graphs loaded from fuse's cache: {hits} of {graphs}")
        print(f"ops worse warm than cold ({len(regressions)}):")
        print("\n".join(f"  {line}" for line in regressions) or "  none")
        if args.out:
            with open(args.out, "w") as fh:
                json.dump({"cold": cold, "warm": warm, "regressions": regressions}, fh, indent=1)
        return

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


def _without_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without ``name VALUE`` or ``name=VALUE``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
