"""Training on several processes: functional collectives inside a graph, DDP and FSDP2.

- Collectives in a traced graph are ATen calls in the graph's order, and the memory of their
  inputs and results is never given to another buffer (a collective reads and writes it on
  another stream until its wait; ``wait_tensor`` returns its argument). Checked in one process
  with a process group of one (gloo).
- DDP and FSDP2 train the zoo's tiny Llama for 5 steps in two processes (gloo, kernels in Triton's
  interpreter) with the losses of eager DDP and FSDP2 (``benchmarks.zoo.distributed``).
"""

from __future__ import annotations

import re

import pytest

import torch
import torch.distributed as dist

import fusebackend
from fusebackend import ir
from helpers import assert_same, compile_fn

# gloo on CPU tensors (FUSE_TEST_DEVICE=cuda leaves this file out: the GPU run is the benchmark's)
pytestmark = pytest.mark.skipif(not dist.is_available() or torch.get_default_device().type != "cpu",
                                reason="torch.distributed is not built here, or tensors are not on the CPU")


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _collective_buffers(source: str) -> set[str]:
    """The buffers a collective call of the wrapper reads or returns."""
    out = set()
    for result, args in re.findall(r"^\s*(buf\d+) = _c10d_functional_\w+\(([^)]*)\)", source, re.M):
        out |= {result, *re.findall(r"\bbuf\d+\b", args)}
    return out


def test_the_memory_of_a_collective_is_never_given_to_another_buffer(world_of_one) -> None:
    import torch.distributed._functional_collectives as funcol

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        reduced = funcol.wait_tensor(funcol.all_reduce(x * 2, "sum", world_of_one))
        u = torch.mm(x, w)
        # a new buffer of the collective's size after its wait, while the wait's result (the
        # collective's own memory) is still to be read: taking that memory would overwrite it
        relu = u.relu()
        return reduced * torch.mm(relu, w) + u

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    assert_same(compile_fn(fn)(x, w), fn(x, w))
    source = fusebackend.last_compiled().wrapper
    collective = _collective_buffers(source)
    assert {"_c10d_functional_all_reduce", "_c10d_functional_wait_tensor"} <= set(re.findall(r"_c10d_functional_\w+",
                                                                                              source))
    taken = re.findall(r"^\s*buf\d+ = (?:view\()?(buf\d+)\b", source, re.M)  # takeovers and writes over an input
    assert len(collective) == 4 and not collective & set(taken), source
    assert fusebackend.metrics.fallbacks["all_reduce"] == 1 and fusebackend.metrics.eager_graphs == 0


def test_collectives_run_in_the_graph_order(world_of_one) -> None:
    import torch.distributed._functional_collectives as funcol

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gathered = funcol.all_gather_single(y.cos(), 0, world_of_one)
        reduced = funcol.all_reduce(x.sin(), "sum", world_of_one)
        return reduced + 1, gathered * 3

    x, y = torch.randn(5, 7), torch.randn(3, 7)
    assert_same(compile_fn(fn)(x, y), fn(x, y))
    calls = re.findall(r"= _c10d_functional_(\w+)\(", fusebackend.last_compiled().wrapper)
    assert [c for c in calls if c != "wait_tensor"] == ["all_gather_into_tensor", "all_reduce"]
    assert calls.count("wait_tensor") == 2 and calls[0] != "wait_tensor"


def test_a_graph_with_collectives_is_kept_in_aotautograds_cache(world_of_one) -> None:
    import torch.distributed._functional_collectives as funcol

    def fn(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x.sin(), "sum", world_of_one) + 1

    x = torch.randn(6, 5)
    for _ in range(2):  # the second time from the caches, as a second process would
        torch._dynamo.reset()
        assert_same(compile_fn(fn)(x), fn(x))
    m = fusebackend.metrics
    assert (m.cache_misses, m.cache_hits, m.aot_cache_hits, m.eager_graphs) == (1, 1, 1, 0)


def test_the_schedule_orders_each_collective_after_the_one_before() -> None:
    from fusebackend.scheduler.fusion import Groups

    def buffer(name: str) -> ir.Buffer:
        return ir.Buffer(name, torch.float32, (8,), (1,))

    def call(name: str, op: torch._ops.OpOverload, arg: ir.Buffer, *more: object) -> ir.Extern:
        return ir.Extern(name, op, (arg.whole(), *more), (), (((), buffer(name)),), False, name)

    x, y = buffer("arg0"), buffer("arg1")
    c10d = torch.ops._c10d_functional
    first = call("buf0", c10d.all_reduce.default, x, "sum", "0")
    other = call("buf1", torch.ops.aten.relu.default, y)
    second = call("buf2", c10d.all_reduce.default, y, "sum", "0")
    wait = call("buf3", c10d.wait_tensor.default, second.outputs[0][1])
    groups = Groups(ir.IRGraph("g", torch.device("cpu"), [x, y], [first, other, second, wait], []))
    assert groups.group_pred("buf2") == {"buf0"}  # no data between them: the order alone
    assert groups.group_pred("buf1") == set()  # other ATen calls stay free to move
    assert [ir.is_collective(n) for n in (first, other, second, wait)] == [True, False, True, True]
    assert ir.may_alias_arguments(wait) and not ir.may_alias_arguments(first)


def _train(setup: str, tmp_path, monkeypatch: pytest.MonkeyPatch, **options: object) -> list:
    from benchmarks.zoo.distributed import Options, run

    monkeypatch.setenv("FUSE_CACHE_DIR", str(tmp_path / "cache"))  # the processes' own cache folder
    return run([setup], ["fuse"], size="tiny", steps=5, out_dir=str(tmp_path), together=True,
               options=Options(**options))


def test_ddp_trains_with_eager_ddps_losses(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # buckets of 50 KiB: Dynamo's DDP optimizer splits the tiny Llama's graph into several
    eager, fused = _train("ddp", tmp_path, monkeypatch, bucket_mb=0.05)
    assert (eager.variant, fused.variant, fused.world) == ("eager", "fuse", 2)
    assert len(fused.losses) == 5 and fused.losses[-1] != fused.losses[0]
    assert fused.loss_rdiff <= 1e-5, (fused.losses, eager.losses)
    assert fused.graphs >= 6 and fused.eager_graphs == 0  # a forward and a backward per split, at least 3


@pytest.mark.full  # 35 s on 2 cores; DDP's runs by default: pytest --full
def test_fsdp2_trains_with_eager_fsdp2s_losses(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.zoo.distributed import table

    # both models in the same processes, stepped in turn (the benchmark's paired timing)
    eager, fused = _train("fsdp2", tmp_path, monkeypatch, interleave=True)
    assert len(fused.losses) == 5 and fused.losses[-1] != fused.losses[0]
    assert fused.loss_rdiff <= 1e-5, (fused.losses, eager.losses)
    # the blocks share one compiled forward and backward; nothing ran eagerly
    assert fused.graphs == 2 and fused.eager_graphs == 0
    assert eager.interleaved and fused.interleaved and len(fused.times_ms) == len(eager.times_ms) == 5
    text = table([eager, fused], torch.float32)
    assert "n/a (interleaved)" in text and "fsdp2, stepped in turn" in text and "    fuse: " in text


def test_the_chart_reads_each_runs_results(tmp_path) -> None:
    # a run's <setup>-<variant>.json in a folder of runs: one group per run and setup
    import json

    from benchmarks.zoo import distributed

    for run, speed in (("r1", 100.0), ("r2", 120.0)):
        (tmp_path / run).mkdir()
        for variant, factor in (("eager", 1.0), ("fuse", 1.5)):
            (tmp_path / run / f"ddp-{variant}.json").write_text(
                json.dumps({"setup": "ddp", "variant": variant, "tokens_per_s": speed * factor}))
    path = distributed.chart(str(tmp_path), str(tmp_path / "d.png"), "title")
    assert path is not None and (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert distributed.chart(str(empty), str(tmp_path / "none.png"), "title") is None
