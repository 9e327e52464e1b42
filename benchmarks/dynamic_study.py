"""Dynamic shapes (issue 15): a zoo language model over several sequence lengths, compiled once
per length or once for all, by fuse and by Inductor.

Variants, each in a process of its own with empty cache folders (so every compile is cold):

- ``fuse-static``: ``torch.compile(model, backend=fuse)`` with every length marked static
  (``dynamic=False``): Dynamo and fuse compile each length apart;
- ``fuse-symbolic``: ``dynamic=True`` with ``FUSE_SYMBOLIC=1``: one compile serves every length
  (``metrics.not_symbolic`` says where one could not be made);
- ``fuse-per-shape``: ``dynamic=True`` without it: Dynamo's symbolic graph, compiled per length;
- ``inductor-static`` and ``inductor-dynamic``: the same for Inductor.

For each length: the first call's seconds (compiling included), the step's time (``timing.median_ms``:
do_bench's median on a GPU, wall time on a CPU) and the output's distance from eager's. Then
the total of the first calls (the compile time a server pays for these lengths), and fuse's
graphs compiled, compiled per shape and run eagerly.

``PYTHONPATH=. python -m benchmarks.dynamic_study --out "$OUT"`` (GPT-2 at its real size, batch 1,
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


def _one(variant: str, model_name: str, size: str, lengths: list[int], batch: int) -> dict[str, Any]:
    """In this process: compile and time ``variant`` over ``lengths``."""
    import torch

    import fusebackend
    from benchmarks.timing import TimingConfig, median_ms
    from benchmarks.zoo.compare import output_error
    from benchmarks.zoo.registry import ZOO
    from benchmarks.zoo.spec import narrow

    device = torch.device("cuda" if torch.cuda.is_available() and size == "real" else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    built = ZOO[model_name].build(size, device, dtype)
    model = built.model.eval()
    backend = fusebackend.fuse if variant.startswith("fuse") else "inductor"
    compiled = torch.compile(model, backend=backend, dynamic=not variant.endswith("static"))
    rows = []
    with fusebackend.config.patch(symbolic=variant == "fuse-symbolic"), torch.no_grad():
        for seq in lengths:
            inputs = narrow(built, batch=batch, seq=seq).inputs
            expected = model(**inputs)
            got, first_s = _first(compiled, inputs, device)
            step_ms = median_ms(lambda: compiled(**inputs), device, TimingConfig())
            rows.append({"seq": seq, "first_s": first_s, "step_ms": step_ms, "error": output_error(got, expected)})
    metrics = fusebackend.metrics
    return {"variant": variant, "device": torch.cuda.get_device_name() if device.type == "cuda" else "CPU",
            "torch": torch.__version__, "rows": rows, "total_first_s": sum(r["first_s"] for r in rows),
            "fuse_graphs": metrics.graphs_compiled if backend != "inductor" else None,
            "per_shape": {k: v[0] for k, v in metrics.specialized.items()},
            "not_symbolic": dict(metrics.not_symbolic), "eager_graphs": metrics.eager_graphs}


def _first(compiled: Any, inputs: dict[str, Any], device: Any) -> tuple[Any, float]:
    """The first call at a length: its outputs and seconds, compiling included."""
    from benchmarks.timing import timed_call

    return timed_call(lambda: compiled(**inputs), [], device)


def run(variants: list[str], model: str, size: str, lengths: list[int], batch: int, out_dir: str) -> list[dict]:
    """Each variant in a fresh process with empty cache folders; their results, in order."""
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for variant in variants:
        path = os.path.join(out_dir, f"dynamic_{variant}.json")
        with tempfile.TemporaryDirectory() as fuse_cache, tempfile.TemporaryDirectory() as inductor_cache:
            env = dict(os.environ, FUSE_CACHE_DIR=fuse_cache, TORCHINDUCTOR_CACHE_DIR=inductor_cache)
            subprocess.run([sys.executable, "-m", "benchmarks.dynamic_study", "--one", variant, "--model", model,
                            "--size", size, "--lengths", ",".join(map(str, lengths)), "--batch", str(batch),
                            "--out", out_dir], env=env, check=True)
        with open(path) as f:
            results.append(json.load(f))
    return results


def table(results: list[dict]) -> str:
    lengths = [r["seq"] for r in results[0]["rows"]]
    head = " | ".join(f"s{n} first s / step ms" for n in lengths)
    lines = [f"| variant | {head} | first calls total s | max error | fuse graphs (per shape; eager) |",
             "|" + "---|" * (len(lengths) + 4)]
    for r in results:
        cells = " | ".join(f"{row['first_s']:.2f} / {row['step_ms']:.3f}" for row in r["rows"])
        graphs = (f"{r['fuse_graphs']} ({sum(r['per_shape'].values()) or 0}; {r['eager_graphs']})"
                  if r["fuse_graphs"] is not None else "-")
        lines.append(f"| {r['variant']} | {cells} | {r['total_first_s']:.2f} | "
                     f"{max(row['error'] for row in r['rows']):.1e} | {graphs} |")
    for r in results:
        if r["not_symbolic"]:
            lines.append(f"\n{r['variant']}: not symbolic: {r['not_symbolic']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_study", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--lengths", default="64,128,256,512")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a variant's own process
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.one:
        result = _one(args.one, args.model, args.size, lengths, args.batch)
        with open(os.path.join(args.out, f"dynamic_{args.one}.json"), "w") as f:
            json.dump(result, f)
        return
    results = run(args.variants.split(","), args.model, args.size, lengths, args.batch, args.out)
    text = f"{args.model} ({args.size}, batch {args.batch}) on {results[0]['device']}, torch {results[0]['torch']}\n\n"
    text += table(results)
    with open(os.path.join(args.out, "dynamic_study.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
