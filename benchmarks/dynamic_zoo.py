"""Zoo models compiled with ``dynamic=True`` and called at three sizes: the sizes of
their sequences (language models) or batches (the others), with fuse's default
``FUSE_SYMBOLIC=auto``.

    PYTHONPATH=. python -m benchmarks.dynamic_zoo --models gpt2,vit [--train] --out "$OUT"

For each model, one JSON line: the sizes, each output's distance from eager's (inference:
``compare.output_error``; ``--train``: the largest parameter gradient's distance from eager's,
relative to its largest value), each first call's seconds (a compile where one happens), fuse's
graph compiles, graphs run eagerly, ``metrics.not_symbolic`` (why a graph was compiled per
shape) and ``metrics.specialized``. Every call gets tensors of its own, as a server's requests
would: ``narrow`` returns the built inputs themselves, views, at the built size, and Dynamo
guards on a view's base. ``--size tiny`` runs on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch

import fusebackend
from benchmarks.zoo.compare import output_error
from benchmarks.zoo.registry import ZOO
from benchmarks.zoo.spec import narrow

LANGUAGE = {"gpt2", "bert", "distilbert", "llama", "qwen2", "gpt_neox", "t5"}


def _fresh(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in inputs.items()}


def run(name: str, size: str, train: bool) -> dict[str, Any]:
    torch._dynamo.reset()
    fusebackend.metrics.reset()
    device = torch.device("cuda" if size == "real" else "cpu")
    built = ZOO[name].build(size, device, torch.bfloat16 if size == "real" else torch.float32)
    model = built.model.train(train)
    if name in LANGUAGE:
        full = built.inputs["input_ids"].shape[1]
        sizes = [{"seq": n} for n in (full, full * 3 // 4 + 1, full // 2)]
    else:
        full = next(iter(built.inputs.values())).shape[0]
        sizes = [{"batch": n} for n in sorted({full, max(2, full * 3 // 4 + 1), max(2, full // 2)}, reverse=True)]
    params = [p for p in model.parameters() if p.requires_grad]

    def step(fn: Any, inputs: dict[str, torch.Tensor]) -> Any:
        if not train:
            with torch.no_grad():
                return fn(**inputs)
        for p in params:
            p.grad = None
        built.loss(fn(**inputs)).backward()
        return [p.grad.float().clone() for p in params]

    expected = [step(model, _fresh(narrow(built, **kw).train_inputs if train else narrow(built, **kw).inputs))
                for kw in sizes]
    compiled = torch.compile(model, backend=fusebackend.fuse, dynamic=True)
    errors, first = [], []
    for kw, want in zip(sizes, expected):
        nb = narrow(built, **kw)
        start = time.perf_counter()
        got = step(compiled, _fresh(nb.train_inputs if train else nb.inputs))
        if device.type == "cuda":
            torch.cuda.synchronize()
        first.append(time.perf_counter() - start)
        errors.append(max(((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item() for a, b in zip(got, want))
                      if train else output_error(got, want))
    return {"model": name, "train": train, "sizes": [next(iter(kw.values())) for kw in sizes], "errors": errors,
            "first_s": first, "compiles": fusebackend.metrics.graphs_compiled,
            "eager_graphs": fusebackend.metrics.eager_graphs, "not_symbolic": dict(fusebackend.metrics.not_symbolic),
            "specialized": {k: v[0] for k, v in fusebackend.metrics.specialized.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dynamic_zoo.jsonl"), "a") as out:
        for name in args.models.split(","):
            line = json.dumps(run(name, args.size, args.train))
            print(line, flush=True)
            out.write(line + "\n")


if __name__ == "__main__":
    main()
