"""Compile time by stage against the size of the graph, on the zoo's models.

A compile stage whose time per IR node grows with the graph is a cost that grows faster than
linearly: a scan over all candidates per fusion, a legality check or a byte count redone for
every pair. This script measures lower / verify / schedule / codegen for every ATen graph of the
zoo's models and prints, per graph, the IR nodes, the seconds of each stage and the
milliseconds per node, so that such a stage shows up as a column that rises down the table.

Kernels are not run: ``capture_graphs`` records the ATen graphs that ``torch.compile`` hands
the backend and runs them eagerly instead (a real configuration would take hours in Triton's
interpreter), and ``compile_stages`` runs each stage of ``pipeline.compile_graph`` on one of
them directly, the same calls in the same order, without the graph cache or loading the kernels.
Convolutions take the GPU's layout (``conv_layout="channels_last"``, as FUSE_CONV_LAYOUT would).

    PYTHONPATH=. python -m benchmarks.compile_scaling [--models gpt2,efficientnet] [--size tiny|real]
        [--train] [--batch 1] [--profile efficientnet]

``--batch`` cuts the inputs' batch (the default, 1, keeps a real configuration's eager run on the
CPU short; the graph's structure, and so its compile time, does not depend on it). ``--profile``
prints the functions cProfile finds slowest in the schedule and codegen stages of one model.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import io
import pstats
import time
from typing import Any, Iterator, Sequence

import torch

import fusebackend
from fusebackend import backend, codegen, ir, lowering, scheduler
from fusebackend.kernels import runtime

STAGES = ("lower", "verify", "schedule", "codegen")


@dataclasses.dataclass
class Captured:
    """One ATen graph as the backend received it: enough to run ``compile_graph``'s stages."""

    name: str
    gm: torch.fx.GraphModule
    args: list[Any]
    user_outputs: int | None


@dataclasses.dataclass
class _Eager:
    """Stands for ``pipeline.CompiledGraph`` where the backend only calls ``.call``."""

    call: Any


@contextlib.contextmanager
def _capturing(into: list[Captured], prefix: str) -> Iterator[None]:
    """Record every graph the backend would compile, and run it eagerly instead."""

    def capture(gm: Any, args: Sequence[Any], name: str, user_outputs: int | None = None,
                digest: str | None = None, autotune: bool = False) -> Any:
        if not isinstance(gm, torch.fx.GraphModule):  # a graph from AOTAutograd's cache, made when asked
            gm = gm()
        into.append(Captured(f"{prefix}_{len(into)}", gm, list(args), user_outputs))

        def call(call_args: list[Any]) -> Any:
            inputs = list(call_args)
            call_args.clear()  # the boxed convention: the callee lets go of the inputs
            return gm(*inputs)

        return _Eager(call)

    original = backend.compile_graph
    backend.compile_graph = capture
    try:
        yield
    finally:
        backend.compile_graph = original


def _cut_batch(inputs: dict[str, Any], batch: int | None) -> dict[str, Any]:
    if batch is None:
        return inputs
    return {k: v[:batch] if isinstance(v, torch.Tensor) and v.dim() > 0 else v for k, v in inputs.items()}


def capture_graphs(model: str, size: str = "tiny", train: bool = False, batch: int | None = None) -> list[Captured]:
    """The ATen graphs of one zoo model's inference (``train``: its training step: forward and
    backward), captured under channels-last convolutions; nothing is compiled."""
    from benchmarks.zoo.registry import ZOO

    torch._dynamo.reset()
    torch.manual_seed(0)
    built = ZOO[model].build(size, torch.device("cpu"), torch.float32)
    mode = "train" if train else "inference"
    graphs: list[Captured] = []
    with fusebackend.config.patch(conv_layout="channels_last"), _capturing(graphs, f"{model}_{mode}"):
        compiled = torch.compile(built.model, backend=fusebackend.fuse)  # runs from a checkout not installed
        if train:
            built.model.train()
            built.loss(compiled(**_cut_batch(built.train_inputs, batch))).backward()
        else:
            built.model.eval()
            with torch.no_grad():
                compiled(**_cut_batch(built.inputs, batch))
    torch._dynamo.reset()
    return graphs


@dataclasses.dataclass
class Compiled:
    """What ``compile_stages`` made of one graph, and the seconds each stage took."""

    graph: ir.IRGraph
    schedule: scheduler.Schedule
    kernels: list[codegen.KernelSource]
    wrapper: codegen.WrapperSource
    seconds: dict[str, float]


def compile_stages(g: Captured, generate: bool = True) -> Compiled:
    """``pipeline.compile_graph``'s stages on one captured graph (``generate``: codegen too),
    timed one by one, under channels-last convolutions."""
    seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(stage: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        seconds[stage] = time.perf_counter() - start

    with fusebackend.config.patch(conv_layout="channels_last"):
        with timed("lower"):
            graph, moved = lowering.lower(g.gm, g.args, g.name, g.user_outputs)
        with timed("verify"):
            ir.verify(graph)
        with timed("schedule"):
            sched = scheduler.schedule(graph)
        kernels: list[codegen.KernelSource] = []
        wrapper = None
        if generate:
            with timed("codegen"):
                kernels = codegen.generate_all(sched, runtime.use_pdl(graph.device))
                wrapper = codegen.generate_wrapper(sched, kernels, moved, observe=False)
    return Compiled(graph, sched, kernels, wrapper, seconds)  # type: ignore[arg-type]


def table(rows: list[tuple[str, str, int, dict[str, float]]]) -> str:
    """Markdown: model, graph, IR nodes, seconds per stage and milliseconds per node."""
    head = ["model", "graph", "IR nodes"] + [f"{s} s" for s in STAGES] + [f"{s} ms/node" for s in STAGES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, graph, nodes, seconds in rows:
        cells = [model, graph, str(nodes)]
        cells += [f"{seconds.get(s, 0.0):.3f}" for s in STAGES]
        cells += [f"{1000 * seconds.get(s, 0.0) / max(nodes, 1):.2f}" for s in STAGES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _profile(graphs: list[Captured], top: int = 25) -> str:
    """cProfile of the schedule and codegen stages (lowered beforehand) of these graphs."""
    lowered = [(lowering.lower(g.gm, g.args, g.name, g.user_outputs)) for g in graphs]
    profiler = cProfile.Profile()
    with fusebackend.config.patch(conv_layout="channels_last"):
        profiler.enable()
        for graph, moved in lowered:
            sched = scheduler.schedule(graph)
            kernels = codegen.generate_all(sched, runtime.use_pdl(graph.device))
            codegen.generate_wrapper(sched, kernels, moved, observe=False)
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> None:
    from benchmarks.zoo.registry import ZOO

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated zoo names (default: every one that loads)")
    parser.add_argument("--size", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--train", action="store_true", help="the training step's graphs, not inference's")
    parser.add_argument("--batch", type=int, default=1, help="cut the inputs' batch to this (0: keep it)")
    parser.add_argument("--profile", default="", help="a zoo name: cProfile its schedule and codegen")
    opts = parser.parse_args(argv)
    batch = opts.batch or None
    if opts.profile:
        print(_profile(capture_graphs(opts.profile, opts.size, opts.train, batch)))
        return
    names = opts.models.split(",") if opts.models else [n for n, m in ZOO.items() if m.available() is None]
    rows = []
    for name in names:
        for g in capture_graphs(name, opts.size, opts.train, batch):
            compiled = compile_stages(g)
            rows.append((name, g.name, len(compiled.graph.nodes), compiled.seconds))
            print(f"{g.name}: {len(compiled.graph.nodes)} nodes, "
                  + ", ".join(f"{s} {compiled.seconds[s]:.3f} s" for s in STAGES), flush=True)
    rows.sort(key=lambda r: r[2])
    print()
    print(table(rows))
    totals = {s: sum(r[3][s] for r in rows) for s in STAGES}
    nodes = sum(r[2] for r in rows)
    print(f"\nall graphs: {nodes} IR nodes; " + ", ".join(
        f"{s} {totals[s]:.2f} s ({1000 * totals[s] / max(nodes, 1):.2f} ms/node)" for s in STAGES))


if __name__ == "__main__":
    main()
