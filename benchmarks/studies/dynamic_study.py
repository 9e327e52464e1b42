"""Dynamic shapes: a zoo language model over several sequence lengths, compiled once
per length or once for all, by fuse and by Inductor.

Variants, each in a process of its own with empty cache folders (so every compile is cold):

- ``fuse-static``: ``torch.compile(model, backend=fuse)`` with every length marked static
  (``dynamic=False``): Dynamo and fuse compile each length apart;
- ``fuse-symbolic``: ``dynamic=True`` with ``FUSE_SYMBOLIC=on``: one compile serves every length
  (``metrics.not_symbolic`` says where one could not be made);
- ``fuse-per-shape``: ``dynamic=True`` with ``FUSE_SYMBOLIC=off``: Dynamo's symbolic graph,
  compiled per length;
- ``fuse-auto``: Dynamo's default (``dynamic=None``) with ``FUSE_SYMBOLIC=on``: the first length
  compiled for its sizes, the second for every length (Dynamo makes a size symbolic once it has
  seen a second value of it), which serves the rest;
- ``inductor-static``, ``inductor-dynamic`` and ``inductor-auto``: the same for Inductor;
- ``-floats`` after a ``dynamic=True`` variant (``--interleave`` only): Dynamo traced with
  ``specialize_float``, so that it keeps a module's float attributes (GPT-2's layer norms' eps,
  its dropouts' p) as constants. Under ``dynamic=True`` it passes them as inputs and guards on
  each through a tensor (torch 2.11), a cost of Dynamo's that any backend pays on every call.

For each length: the first call's seconds (compiling included), the output's distance from
eager's, the GPU kernels of one step, and, in rounds over the lengths after every length has
compiled, the step's time: ``timing.median_ms`` (do_bench's median on a GPU, wall time on a CPU)
and ``timing.host_and_gpu_ms`` (the host's time to issue a step and the GPU's time to run it),
each the median over the rounds, with the garbage collector off. Then the total of the first
calls (the compile time a server pays for these lengths), and fuse's graphs compiled, compiled
per shape and run eagerly. ``--processes N`` runs every variant N times, in turn.

Step times wander between processes by more than the variants differ at batch 1, where the host
sets the step. ``--interleave`` (step times only) builds every variant in one process and times
them in turn, in an order rotated every round, and gives each variant's step over the first
variant's in the same round: ``--interleave --variants fuse-static,fuse-symbolic,...``.

``PYTHONPATH=. python -m benchmarks.studies.dynamic_study --out "$OUT"`` (GPT-2 at its real size, batch 1,
lengths 64, 128, 256 and 512, every variant); ``--size tiny --lengths 16,11,7`` on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

VARIANTS = ("fuse-static", "fuse-symbolic", "fuse-per-shape", "inductor-static", "inductor-dynamic")
SYMBOLIC = ("fuse-symbolic", "fuse-auto", "fuse-symbolic-floats")  # the variants fuse compiles once for every size


def _dynamic(variant: str) -> bool | None:
    """``torch.compile``'s ``dynamic`` for ``variant``: False for ``-static``, None (Dynamo's
    default: a size is made symbolic once a second value of it is seen) for ``-auto``, else True."""
    return False if variant.endswith("static") else None if variant.endswith("auto") else True


def _one(variant: str, model_name: str, size: str, lengths: list[int], batch: int, rounds: int) -> dict[str, Any]:
    """In this process: compile ``variant`` at each of ``lengths``, then time every length in
    ``rounds`` rounds (one length after another in each round, so that a slow stretch of the
    machine falls on all of them); each figure is the median over the rounds."""
    import gc
    import statistics

    import torch

    import fusebackend
    from benchmarks.timing import TimingConfig, host_and_gpu_ms, median_ms
    from benchmarks.zoo.compare import output_error
    from benchmarks.zoo.measure import kernel_launches
    from benchmarks.zoo.registry import ZOO
    from benchmarks.zoo.spec import narrow

    device = torch.device("cuda" if torch.cuda.is_available() and size == "real" else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    built = ZOO[model_name].build(size, device, dtype)
    model = built.model.eval()
    backend = fusebackend.fuse if variant.startswith("fuse") else "inductor"
    compiled = torch.compile(model, backend=backend, dynamic=_dynamic(variant))
    rows = []
    with fusebackend.config.patch(symbolic="on" if variant in SYMBOLIC else "off"), torch.no_grad():
        steps = {}
        for seq in lengths:
            inputs = narrow(built, batch=batch, seq=seq).inputs
            expected = model(**inputs)
            got, first_s = _first(compiled, inputs, device)
            steps[seq] = lambda inputs=inputs: compiled(**inputs)
            rows.append({"seq": seq, "first_s": first_s, "error": output_error(got, expected),
                         "launches": kernel_launches(steps[seq], device)})
        samples: dict[int, list[tuple[float, float, float | None]]] = {seq: [] for seq in lengths}
        gc.collect()
        gc.disable()  # a collection inside a timed call would land on one variant's figure
        try:
            for _ in range(rounds):
                for seq in lengths:
                    cost = host_and_gpu_ms(steps[seq], device)
                    samples[seq].append((median_ms(steps[seq], device, TimingConfig()), cost.host_ms, cost.gpu_ms))
        finally:
            gc.enable()
    for row in rows:
        step, host, gpu = zip(*samples[row["seq"]])
        row.update(step_ms=statistics.median(step), step_ms_rounds=list(step), host_ms=statistics.median(host),
                   gpu_ms=statistics.median(gpu) if gpu[0] is not None else None)
    metrics = fusebackend.metrics
    return {"variant": variant, "device": torch.cuda.get_device_name() if device.type == "cuda" else "CPU",
            "torch": torch.__version__, "rows": rows, "total_first_s": sum(r["first_s"] for r in rows),
            "rounds": rounds, "fuse_graphs": metrics.graphs_compiled if backend != "inductor" else None,
            "per_shape": {k: v[0] for k, v in metrics.specialized.items()},
            "not_symbolic": dict(metrics.not_symbolic), "eager_graphs": metrics.eager_graphs}


def _interleaved(variants: list[str], model_name: str, size: str, lengths: list[int], batch: int,
                 rounds: int) -> dict[str, Any]:
    """In this process: every variant compiled at every length (each its own copy of the model
    and its own backend, so that Dynamo keeps their graphs apart), then timed in turn: in each
    round and at each length, every variant once, in an order rotated each round, so that a slow
    stretch of the machine falls on all of them. Per length and variant, the median over the
    rounds of do_bench's step and of the host's and the GPU's times; and per round, each
    variant's step over the first variant's in that round (its median: the paired ratio)."""
    import copy
    import gc
    import statistics

    import torch

    import fusebackend
    from benchmarks.timing import TimingConfig, host_and_gpu_ms, median_ms
    from benchmarks.zoo.compare import output_error
    from benchmarks.zoo.registry import ZOO
    from benchmarks.zoo.spec import narrow

    # the variants' graphs of one forward: more than Dynamo keeps for one code object by default
    # (past it, Dynamo runs the frame eagerly)
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    device = torch.device("cuda" if torch.cuda.is_available() and size == "real" else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    built = ZOO[model_name].build(size, device, dtype)
    built.model.eval()
    inputs = {seq: narrow(built, batch=batch, seq=seq).inputs for seq in lengths}
    steps: dict[str, dict[int, Any]] = {}
    errors: dict[str, float] = {}
    compiles: dict[str, int] = {}  # fuse's graph compiles of each variant over the lengths
    with torch.no_grad():
        expected = {seq: built.model(**inputs[seq]) for seq in lengths}
        for variant in variants:
            model = copy.deepcopy(built.model)
            if variant.startswith("fuse"):
                backend: Any = lambda gm, example_inputs: fusebackend.fuse(gm, example_inputs)  # noqa: E731
            else:
                backend = "inductor"
            compiled = torch.compile(model, backend=backend, dynamic=_dynamic(variant))
            before = fusebackend.metrics.graphs_compiled
            floats = torch._dynamo.config.patch(specialize_float=variant.endswith("-floats"))
            with fusebackend.config.patch(symbolic="on" if variant in SYMBOLIC else "off"), floats:
                errors[variant] = max(output_error(compiled(**inputs[seq]), expected[seq]) for seq in lengths)
            compiles[variant] = fusebackend.metrics.graphs_compiled - before
            steps[variant] = {seq: (lambda c=compiled, i=inputs[seq]: c(**i)) for seq in lengths}
        samples = {(v, seq): [] for v in variants for seq in lengths}
        gc.collect()
        gc.disable()
        try:
            for r in range(rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for seq in lengths:
                    for variant in order:
                        step = steps[variant][seq]
                        cost = host_and_gpu_ms(step, device)
                        samples[variant, seq].append((median_ms(step, device, TimingConfig()), cost.host_ms, cost.gpu_ms))
        finally:
            gc.enable()
    rows = []
    for variant in variants:
        for seq in lengths:
            mine, first = samples[variant, seq], samples[variants[0], seq]
            rows.append({"variant": variant, "seq": seq,
                         "step_ms": statistics.median(x[0] for x in mine),
                         "host_ms": statistics.median(x[1] for x in mine),
                         "gpu_ms": statistics.median(x[2] for x in mine) if mine[0][2] is not None else None,
                         "paired": statistics.median(a[0] / b[0] for a, b in zip(mine, first)),
                         "paired_host": statistics.median(a[1] / b[1] for a, b in zip(mine, first))})
    return {"device": torch.cuda.get_device_name() if device.type == "cuda" else "CPU", "torch": torch.__version__,
            "rounds": rounds, "rows": rows, "errors": errors, "fuse_compiles": compiles, "not_symbolic": dict(fusebackend.metrics.not_symbolic),
            "eager_graphs": fusebackend.metrics.eager_graphs}


def interleaved_table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    first = rows[0]["variant"]
    lines = [f"Interleaved in one process, {result['rounds']} rounds; paired: the step over {first}'s in the "
             "same round (median over rounds)", "",
             "| variant | length | step ms | host ms | GPU ms | paired step | paired host |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        gpu = f"{r['gpu_ms']:.3f}" if r["gpu_ms"] is not None else "-"
        lines.append(f"| {r['variant']} | {r['seq']} | {r['step_ms']:.3f} | {r['host_ms']:.3f} | {gpu} | "
                     f"{r['paired']:.3f} | {r['paired_host']:.3f} |")
    lines.append(f"\nmax error per variant: {result['errors']}; fuse's graph compiles: {result['fuse_compiles']}; "
                 f"not symbolic: {result['not_symbolic']}; "
                 f"graphs run eagerly: {result['eager_graphs']}")
    return "\n".join(lines)


def _first(compiled: Any, inputs: dict[str, Any], device: Any) -> tuple[Any, float]:
    """The first call at a length: its outputs and seconds, compiling included."""
    from benchmarks.timing import timed_call

    return timed_call(lambda: compiled(**inputs), [], device)


def run(variants: list[str], model: str, size: str, lengths: list[int], batch: int, out_dir: str,
        rounds: int = 3, processes: int = 1) -> list[dict]:
    """Each variant in ``processes`` fresh processes with empty cache folders, the variants in
    turn (all of them once, then all again); their results in the order run."""
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for k in range(processes):
        for variant in variants:
            path = os.path.join(out_dir, f"dynamic_{variant}_p{k + 1}.json")
            with tempfile.TemporaryDirectory() as fuse_cache, tempfile.TemporaryDirectory() as inductor_cache:
                env = dict(os.environ, FUSE_CACHE_DIR=fuse_cache, TORCHINDUCTOR_CACHE_DIR=inductor_cache)
                subprocess.run([sys.executable, "-m", "benchmarks.studies.dynamic_study", "--one", variant, "--model", model,
                                "--size", size, "--lengths", ",".join(map(str, lengths)), "--batch", str(batch),
                                "--rounds", str(rounds), "--out", path], env=env, check=True)
            with open(path) as f:
                results.append(dict(json.load(f), process=k + 1))
    return results


def table(results: list[dict]) -> str:
    """Compiles (first calls), then steps: per length, do_bench's median, and the host's and
    the GPU's milliseconds (``timing.host_and_gpu_ms``); then the symbolic compile's step over
    the static one's, per length and process."""
    lengths = [r["seq"] for r in results[0]["rows"]]
    lines = ["| variant | process | " + " | ".join(f"s{n} first s" for n in lengths)
             + " | first calls total s | max error | fuse graphs (per shape; eager) |",
             "|" + "---|" * (len(lengths) + 5)]
    for r in results:
        graphs = (f"{r['fuse_graphs']} ({sum(r['per_shape'].values()) or 0}; {r['eager_graphs']})"
                  if r["fuse_graphs"] is not None else "-")
        lines.append(f"| {r['variant']} | {r.get('process', 1)} | "
                     + " | ".join(f"{row['first_s']:.2f}" for row in r["rows"])
                     + f" | {r['total_first_s']:.2f} | {max(row['error'] for row in r['rows']):.1e} | {graphs} |")
    lines += ["", "| variant | process | " + " | ".join(f"s{n} step ms (host / GPU), launches" for n in lengths) + " |",
              "|" + "---|" * (len(lengths) + 2)]
    for r in results:
        lines.append(f"| {r['variant']} | {r.get('process', 1)} | " + " | ".join(_step_cell(row) for row in r["rows"]) + " |")
    ratios = _ratios(results, "fuse-symbolic", "fuse-static")
    if ratios:
        lines += ["", "fuse-symbolic's step over fuse-static's (do_bench medians, process k against process k):"]
        lines += [f"- s{seq}: " + ", ".join(f"{x:.3f}" for x in xs) for seq, xs in ratios.items()]
    for r in results:
        if r["not_symbolic"]:
            lines.append(f"\n{r['variant']} (process {r.get('process', 1)}): not symbolic: {r['not_symbolic']}")
    return "\n".join(lines)


def _step_cell(row: dict) -> str:
    gpu = f"{row['gpu_ms']:.3f}" if row.get("gpu_ms") is not None else "-"
    launches = row.get("launches")
    return f"{row['step_ms']:.3f} ({row['host_ms']:.3f} / {gpu}), {launches if launches is not None else '-'}"


def _ratios(results: list[dict], variant: str, base: str) -> dict[int, list[float]]:
    ours = [r for r in results if r["variant"] == variant]
    theirs = [r for r in results if r["variant"] == base]
    out: dict[int, list[float]] = {}
    for a, b in zip(ours, theirs):
        for x, y in zip(a["rows"], b["rows"]):
            out.setdefault(x["seq"], []).append(x["step_ms"] / y["step_ms"])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.dynamic_study", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--lengths", default="64,128,256,512")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds over the lengths in each process")
    parser.add_argument("--processes", type=int, default=1, help="fresh processes per variant")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    parser.add_argument("--interleave", action="store_true",
                        help="step times only: every variant in one process, timed in turn (paired ratios)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a variant's own process
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.interleave:
        result = _interleaved(args.variants.split(","), args.model, args.size, lengths, args.batch, args.rounds)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"dynamic_interleaved_b{args.batch}.json"), "w") as f:
            json.dump(result, f)
        text = (f"{args.model} ({args.size}, batch {args.batch}) on {result['device']}, torch {result['torch']}\n\n"
                + interleaved_table(result))
        with open(os.path.join(args.out, f"dynamic_interleaved_b{args.batch}.md"), "w") as f:
            f.write(text + "\n")
        print(text)
        return
    if args.one:
        result = _one(args.one, args.model, args.size, lengths, args.batch, args.rounds)
        with open(args.out, "w") as f:
            json.dump(result, f)
        return
    results = run(args.variants.split(","), args.model, args.size, lengths, args.batch, args.out,
                  args.rounds, args.processes)
    text = (f"{args.model} ({args.size}, batch {args.batch}) on {results[0]['device']}, torch {results[0]['torch']}, "
            f"{args.rounds} timing rounds per process\n\n" + table(results))
    with open(os.path.join(args.out, f"dynamic_study_b{args.batch}.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
