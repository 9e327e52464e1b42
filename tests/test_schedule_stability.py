"""The schedules of the zoo's tiny models stay what they were, and scheduling scales with the graph.

Golden schedules. ``tests/data/schedules/<model>_<mode>.txt`` holds, for every ATen graph of one
zoo model's tiny configuration (inference, or a training step's forward and backward), under
channels-last convolutions, each step of its schedule as ``Schedule.report`` prints it: the
kernel's nodes, its bytes and the buffers it stores, or the extern call. Work on the scheduler
that is meant to be faster only (memoizing, indexing candidates) must leave every one of these
lines as it was; a change to a kernel's grouping shows as a diff of them. The graphs are
captured from ``torch.compile`` and lowered and scheduled again here; no kernel is generated or
run (``benchmarks/compile_scaling.py``).

By default the test checks a sample (``SAMPLE``: a language model's training step and an
encoder-decoder, convnets with residuals, depthwise windows and squeeze-and-excitation, a
windowed vision transformer), about 22 seconds on 2 cores; ``FUSE_SCHEDULES=all`` or ``pytest
--full`` checks every golden file (a few minutes). After a change that is meant to change
schedules, write the files again, and read their diff before committing it:

    PYTHONPATH=. python -m tests.test_schedule_stability --regenerate [model_mode ...]

Scaling. Greedy fusion pops candidates from a heap and checks each popped one; a pass that
rescans every pair, a check that walks the whole graph, or a count redone over every node for
each candidate makes the work grow with the square of the graph. ``test_fusion_work_is_linear``
counts the legality checks (``fusion.why_not``) and the Python function calls of scheduling a
synthetic residual stack of N and 4N blocks, and requires both per node to stay nearly flat:
counts, not seconds, so that the test does not depend on the machine's load.
"""

from __future__ import annotations

import cProfile
import difflib
import os
import pathlib
import pstats
import sys

from typing import Callable

import pytest
import torch

import fusebackend
from fusebackend import ir, lowering, scheduler

DATA = pathlib.Path(__file__).parent / "data" / "schedules"

# (zoo model, mode) pairs with a golden file; the tiny configurations of every transformers
# model in the zoo that loads on a CPU machine.
CASES = [
    (model, mode)
    for model in ("gpt2", "bert", "distilbert", "llama", "qwen2", "gpt_neox", "t5", "whisper_encoder", "vit",
                  "clip_vision", "swin", "convnext", "resnet", "mobilenet_v2", "efficientnet")
    for mode in ("inference", "train")
]
# (MobileNetV2's inference and Llama's training step, 8 s and 6 s, left the sample for the full
# run: EfficientNet's inference has the depthwise windows, ResNet's training step the residuals,
# GPT-2's a language model's training step)
SAMPLE = {("gpt2", "train"), ("t5", "inference"), ("efficientnet", "inference"), ("resnet", "train"),
          ("swin", "inference")}


def describe(model: str, mode: str) -> str:
    """The golden text of one model and mode: per graph, its IR node count and schedule steps."""
    from benchmarks.compile_scaling import capture_graphs, compile_stages

    out = []
    for g in capture_graphs(model, "tiny", train=mode == "train"):
        compiled = compile_stages(g, generate=False)
        out.append(f"graph {g.name}: {len(compiled.graph.nodes)} IR nodes")
        out.extend(_steps(compiled.schedule))
    return "\n".join(out) + "\n"


def _steps(sched: scheduler.Schedule) -> list[str]:
    """``Schedule.report``'s step lines: one per kernel (nodes, bytes, stored) or extern call (the
    source nodes under each are left out: they name Dynamo's nodes, not what is scheduled)."""
    steps = [line for line in sched.report().splitlines() if line.startswith(("  kernel ", "  extern "))]
    assert len(steps) == len(sched.steps)
    return steps


def _path(model: str, mode: str) -> pathlib.Path:
    return DATA / f"{model}_{mode}.txt"


def regenerate(names: list[str]) -> None:
    """Write the golden files (those of ``names``, as ``model_mode``; all where empty)."""
    DATA.mkdir(parents=True, exist_ok=True)
    for model, mode in CASES:
        if names and f"{model}_{mode}" not in names:
            continue
        text = describe(model, mode)
        _path(model, mode).write_text(text)
        print(f"wrote {_path(model, mode)} ({text.count(chr(10))} lines)", flush=True)


def _selected() -> list:
    """Every case; those outside SAMPLE marked full (pytest --full), unless FUSE_SCHEDULES=all."""
    every = os.environ.get("FUSE_SCHEDULES") == "all"
    return [pytest.param(m, k, id=f"{m}_{k}", marks=() if every or (m, k) in SAMPLE else pytest.mark.full)
            for m, k in CASES]


@pytest.mark.parametrize("model,mode", _selected())
def test_schedules_unchanged(model: str, mode: str) -> None:
    pytest.importorskip("transformers")
    path = _path(model, mode)
    if not path.exists():
        pytest.skip(f"no golden file {path.name}: python -m tests.test_schedule_stability --regenerate")
    want, got = path.read_text(), describe(model, mode)
    if got != want:
        diff = "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(), "golden", "now", lineterm=""))
        pytest.fail(f"the schedules of {model} ({mode}) changed; if meant, regenerate "
                    f"(python -m tests.test_schedule_stability --regenerate {model}_{mode}):\n{diff}")


def test_golden_detects_a_regrouping() -> None:
    """The comparison fails when kernels are grouped otherwise: the same graphs with fusion
    limited to two nodes per kernel give other step lines than the golden file."""
    pytest.importorskip("transformers")
    path = _path("gpt2", "inference")
    if not path.exists():
        pytest.skip(f"no golden file {path.name}")
    with fusebackend.config.patch(max_fusion_size=2):
        got = describe("gpt2", "inference")
    assert got != path.read_text()


# ------------------------------------------------------------------------------ scaling


def _ladder(blocks: int) -> ir.IRGraph:
    """A residual stack of ``blocks`` transformer-like blocks, lowered: per block a matrix
    product (an extern call, as in a real model), a layer norm's row statistics and
    normalization, an activation and a residual add, the weight of the norm shared by all."""

    def fn(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        for _ in range(blocks):
            h = x @ w
            mean = h.mean(dim=-1, keepdim=True)
            var = ((h - mean) ** 2).mean(dim=-1, keepdim=True)
            x = torch.relu((h - mean) * torch.rsqrt(var + 1e-5) * g) + x
        return x

    args = (torch.randn(8, 32), torch.randn(32, 32), torch.randn(32))
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*args)
    graph, _ = lowering.lower(gm, list(args), f"ladder_{blocks}")
    return graph


def _optimizer_ladder(params: int) -> ir.IRGraph:
    """An Adam-like step over ``params`` parameters, functionalized as AOTAutograd leaves it: the
    parameters, moments and step counts copied back in place by their kernels, and each
    parameter's history of losses (rolled by one: it reads its input at another element) copied
    back by ATen, a mutation that orders every node before it against every node after it."""

    def fn(*tensors: torch.Tensor) -> None:
        for p, m, step, history in zip(tensors[0::4], tensors[1::4], tensors[2::4], tensors[3::4]):
            step.add_(1)
            m.mul_(0.9).add_(p * 0.1)
            p.sub_(0.01 * m / (1 - 0.9 ** step))
            history.copy_(history.roll(1))

    args = [t for _ in range(params)
            for t in (torch.randn(4, 3), torch.randn(4, 3), torch.tensor(1.0), torch.randn(5))]
    functional = torch.func.functionalize(fn, remove="mutations_and_views")
    gm = torch.fx.experimental.proxy_tensor.make_fx(functional)(*args)
    graph, _ = lowering.lower(gm, list(args), f"optimizer_{params}")
    assert sum(isinstance(n, ir.Extern) and n.mutates for n in graph.nodes) == params
    assert len(graph.mutations) == 3 * params
    return graph


def _work(graph: ir.IRGraph) -> dict[str, int]:
    """What ``scheduler.schedule(graph)`` does, counted: legality checks (``fusion.why_not``),
    and Python function calls in all (cProfile's count, deterministic where seconds are not).
    Scheduled once before counting, so that the memoized index arithmetic starts warm."""
    from fusebackend.scheduler import fusion

    scheduler.schedule(graph)
    checks = 0
    why_not = fusion.why_not

    def counted(*args: object) -> str | None:
        nonlocal checks
        checks += 1
        return why_not(*args)

    profile = cProfile.Profile()
    fusion.why_not = counted
    try:
        profile.enable()
        scheduler.schedule(graph)
        profile.disable()
    finally:
        fusion.why_not = why_not
    return {"legality checks": checks, "calls": pstats.Stats(profile).total_calls}


@pytest.mark.parametrize("ladder", [_ladder, _optimizer_ladder], ids=["residual-stack", "optimizer-step"])
def test_fusion_work_is_linear(ladder: Callable[[int], ir.IRGraph]) -> None:
    """Per IR node, scheduling a stack of 4N blocks does about the work of N blocks: candidates
    are found through kept indexes and each check costs what its two groups hold, not what
    the graph holds. (The ratio is a little above 1: the first and last blocks fuse less.) An
    optimizer step's N mutations by ATen order the graph with N edges, not one to every node
    before each."""
    small, large = ladder(8), ladder(32)
    n_small, n_large = len(small.nodes), len(large.nodes)
    assert n_large > 3 * n_small
    work_small, work_large = _work(small), _work(large)
    for what in work_small:
        per_small, per_large = work_small[what] / n_small, work_large[what] / n_large
        # linear: a ratio near 1 (1.1 at 17af22d's algorithm); a pass over the graph per node: 4
        assert per_large <= 1.4 * per_small, (what, work_small[what], n_small, work_large[what], n_large)


if __name__ == "__main__":
    if "--regenerate" not in sys.argv[1:]:
        sys.exit("usage: python -m tests.test_schedule_stability --regenerate [model_mode ...]")
    regenerate([a for a in sys.argv[1:] if a != "--regenerate"])
