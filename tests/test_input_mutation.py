"""In-place writes into graph inputs: ``aten.copy_`` into an input is stored by the kernel that
computes the value, in the input's memory, only where no other read of the input could see it.
Every test compares the mutated inputs with eager as well as the outputs."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch

import fusebackend
from helpers import assert_same, compile_fn


def _run_both(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Call ``fn`` eagerly and compiled on clones of ``args``; check outputs; return the args."""
    eager_args = [a.clone() for a in args]
    compiled_args = [a.clone() if a.is_contiguous() else a.clone().as_strided(a.shape, a.stride()) for a in args]
    expected = fn(*eager_args)
    actual = compile_fn(fn)(*compiled_args)
    assert_same(actual, expected)
    assert fusebackend.metrics.eager_graphs == 0
    return eager_args, compiled_args


def _schedule() -> str:
    return "\n".join(a.schedule for a in fusebackend.history())


def test_batch_norm_training_writes_running_stats_in_place() -> None:
    # AOTAutograd leaves the updates of running_mean / running_var / num_batches_tracked to the
    # forward graph as copy_ into its inputs; the kernels computing them store them there
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    reference = copy.deepcopy(model)
    compiled = compile_fn(model)
    for _ in range(2):
        x = torch.randn(2, 3, 10, 10) * 2 + 0.5
        out, expected = compiled(x), reference(x)
        assert_same(out, expected)
        out.sum().backward()
        expected.sum().backward()
    assert fusebackend.metrics.eager_graphs == 0
    for (name, a), (_, b) in zip(model.named_buffers(), reference.named_buffers()):
        assert_same(a, b), name
    assert int(model[1].num_batches_tracked) == 2
    forward = next(a for a in fusebackend.history() if a.name.startswith("forward"))
    assert forward.schedule.count("(into input") == 3, forward.schedule
    assert "copy_" not in forward.schedule  # no ATen copy left
    assert forward.wrapper.count("aten.copy_ into the input, in place") == 3
    assert "copy_" not in str(fusebackend.metrics.fallbacks)


def test_num_batches_tracked_of_two_layers_share_a_kernel() -> None:
    # each layer's counter update reads only its own input and moves 16 bytes: small siblings
    # (both read graph inputs only), merged into one launch
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(6), torch.nn.Tanh(), torch.nn.BatchNorm1d(6))
    reference = copy.deepcopy(model)
    x = torch.randn(32, 6)
    assert_same(compile_fn(model)(x), reference(x))
    for (name, a), (_, b) in zip(model.named_buffers(), reference.named_buffers()):
        assert_same(a, b), name
    lines = next(a for a in fusebackend.history() if a.name.startswith("forward")).schedule.splitlines()
    counters = [line for line in lines if line.startswith("  kernel") and "read 16 B, write 16 B" in line]
    assert len(counters) == 1 and counters[0].count("(into input") == 2, lines
    assert any("no bytes saved, one launch fewer" in line for line in lines)


def test_add_into_an_input_in_place() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(y * 2)
        return y.sum()

    (xe, _), (xc, _) = _run_both(fn, torch.randn(37, 5), torch.randn(37, 5))
    assert_same(xc, xe)
    assert "(into input arg0)" in _schedule()


def test_a_transposed_input_is_written_with_its_own_strides() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.mul_(3)
        return x.new_ones(())

    x = torch.randn(7, 5).t()
    xe, xc = x.clone().t().contiguous().t(), x.clone().t().contiguous().t()
    assert xc.stride() == (1, 5)
    fn(xe)
    compile_fn(fn)(xc)
    assert xc.stride() == (1, 5)
    assert_same(xc, xe)
    assert "(into input arg0)" in _schedule()


@pytest.mark.parametrize("fn", [
    lambda x: x.copy_(x.flip(0)).new_ones(()),  # reads the input at another element
    lambda x: x.copy_(x - x.mean(0)).new_ones(()),  # a reduction reads the input
    lambda x: x.copy_(x.sort(0).values).new_ones(()),  # an extern reads the input
], ids=["flip", "reduction", "extern"])
def test_copy_that_reads_other_elements_is_made_after_everything(fn: Callable[..., Any]) -> None:
    # written in place, lanes would read elements other lanes have already overwritten
    (xe,), (xc,) = _run_both(fn, torch.randn(64, 3))
    assert_same(xc, xe)
    assert "into input" not in _schedule()
    assert fusebackend.metrics.fallbacks["copy_"] == 1


def test_input_value_that_is_also_returned_is_not_written_in_place() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x * 3

    (xe,), (xc,) = _run_both(fn, torch.randn(9, 4))
    assert_same(xc, xe)


def test_a_slice_of_a_larger_tensor_is_copied_by_aten() -> None:
    # a non-dense input: no kernel writes that layout, so ATen copies into it
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.copy_(y + 1)
        return y.sum()

    base_e, base_c = torch.randn(6, 8), None
    base_c = base_e.clone()
    y = torch.randn(6, 3)
    fn(base_e[:, 2:5], y)
    compile_fn(fn)(base_c[:, 2:5], y)
    assert_same(base_c, base_e)  # the columns outside the slice untouched
    assert fusebackend.metrics.eager_graphs == 0


def test_in_place_reason_names_what_blocks_it() -> None:
    from fusebackend import indexing, ir
    from fusebackend.lowering.mutations import in_place_reason

    x = ir.Buffer("arg0", torch.float32, (8,), (1,))
    (i,) = indexing.loop_vars("i", 1)

    def pointwise(name: str, body: ir.Expr) -> ir.Pointwise:
        return ir.Pointwise(ir.Buffer(name, torch.float32, (8,), (1,)), body, name)

    scaled = pointwise("buf0", ir.op("mul", ir.Load(x.whole(), (i,)), ir.Constant(0.9, torch.float32)))
    write = pointwise("buf1", ir.Load(scaled.buffer.whole(), (i,)))
    shifted = pointwise("buf2", ir.Load(x.whole(), ((i + 1) % 8,)))
    write_shifted = pointwise("buf3", ir.Load(shifted.buffer.whole(), (i,)))

    def graph(*nodes: ir.Node, outputs: tuple[ir.Buffer, ...] = ()) -> ir.IRGraph:
        return ir.IRGraph("g", torch.device("cpu"), [x], list(nodes), [b.whole() for b in outputs])

    assert in_place_reason(graph(scaled, write), write, x) is None
    assert "another element" in in_place_reason(graph(shifted, write_shifted), write_shifted, x)
    assert "result of its own" in in_place_reason(graph(scaled, write, outputs=(scaled.buffer,)), write, x)
    assert "returns it" in in_place_reason(graph(scaled, write, outputs=(x,)), write, x)


def test_two_inputs_swapped_in_place() -> None:
    # each copy reads the other's input at its own element: one kernel reads both, then stores both
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        old = x.clone()
        x.copy_(y * 2)
        y.copy_(old + 1)
        return x.new_ones(())

    (xe, ye), (xc, yc) = _run_both(fn, torch.randn(33, 4), torch.randn(33, 4))
    assert_same(xc, xe)
    assert_same(yc, ye)
    schedule = _schedule()
    assert "(into input arg0)" in schedule and "(into input arg1)" in schedule
    assert not fusebackend.metrics.fallbacks


def test_a_schedule_that_reads_an_input_after_writing_it_is_lowered_again_with_aten_copies(monkeypatch) -> None:
    import fusebackend.pipeline as pipeline

    seen: list[dict[str, str]] = []
    real = pipeline.order_hazards

    def first_time_hazard(steps: Any, graph: Any) -> set[str]:
        seen.append(dict(graph.mutations))
        return set(graph.mutations.values()) if len(seen) == 1 else real(steps, graph)

    monkeypatch.setattr(pipeline, "order_hazards", first_time_hazard)

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.mul_(y)
        return y.sum()

    (xe, _), (xc, _) = _run_both(fn, torch.randn(17, 3), torch.randn(17, 3))
    assert_same(xc, xe)
    assert seen[0] == {next(iter(seen[0])): "arg0"} and seen[1] == {}
    assert "not in place: the schedule read the input after the kernel writing it" in _schedule()
    assert fusebackend.metrics.fallbacks["copy_"] == 1


def test_order_hazards_finds_a_read_after_the_write() -> None:
    import types

    from fusebackend import indexing, ir
    from fusebackend.lowering.mutations import order_hazards

    x = ir.Buffer("arg0", torch.float32, (8,), (1,))
    y = ir.Buffer("arg1", torch.float32, (8,), (1,))
    (i,) = indexing.loop_vars("i", 1)

    def pointwise(name: str, body: ir.Expr) -> ir.Pointwise:
        return ir.Pointwise(ir.Buffer(name, torch.float32, (8,), (1,)), body, name)

    write_x = pointwise("buf0", ir.op("mul", ir.Load(x.whole(), (i,)), ir.Constant(0.5, torch.float32)))
    halved = pointwise("buf1", ir.op("add", ir.Load(x.whole(), (i,)), ir.Load(y.whole(), (i,))))
    write_y = pointwise("buf2", ir.Load(halved.buffer.whole(), (i,)))
    graph = ir.IRGraph("g", torch.device("cpu"), [x, y], [write_x, halved, write_y], [],
                       mutations={"buf0": "arg0", "buf2": "arg1"})
    step = lambda *nodes, anchor=None: types.SimpleNamespace(nodes=nodes, space=types.SimpleNamespace(anchor=anchor))  # noqa: E731
    assert order_hazards([step(halved, write_y), step(write_x)], graph) == set()
    assert order_hazards([step(write_x), step(halved, write_y)], graph) == {"arg0"}
    assert order_hazards([step(write_x, halved, write_y)], graph) == set()  # pointwise: loads before stores
    # in a reduction's kernel a store may come before a later load: x read for y's copy is a hazard
    assert order_hazards([step(write_x, halved, write_y, anchor=object())], graph) == {"arg0"}


def test_order_hazards_refuses_a_count_written_by_a_kernel_whose_other_lanes_read_it() -> None:
    import types

    from fusebackend import indexing, ir
    from fusebackend.lowering.mutations import order_hazards

    p = ir.Buffer("arg0", torch.float32, (8,), (1,))
    count = ir.Buffer("arg1", torch.float32, (), ())
    (i,) = indexing.loop_vars("i", 1)
    bumped = ir.Pointwise(ir.Buffer("buf0", torch.float32, (), ()),
                          ir.op("add", ir.Load(count.whole(), ()), ir.Constant(1.0, torch.float32)), "buf0")
    write_p = ir.Pointwise(ir.Buffer("buf1", torch.float32, (8,), (1,)),
                           ir.op("mul", ir.Load(p.whole(), (i,)), ir.Load(count.whole(), ())), "buf1")
    graph = ir.IRGraph("g", torch.device("cpu"), [p, count], [bumped, write_p], [],
                       mutations={"buf0": "arg1", "buf1": "arg0"})
    step = lambda *nodes: types.SimpleNamespace(nodes=nodes, space=types.SimpleNamespace(anchor=None))  # noqa: E731
    assert order_hazards([step(write_p), step(bumped)], graph) == set()  # read by every lane, then written
    assert order_hazards([step(bumped), step(write_p)], graph) == {"arg1"}  # read after the write
    assert order_hazards([step(write_p, bumped)], graph) == {"arg1"}  # one lane writes what the others read


def _cache_update(cache: torch.Tensor, position: torch.Tensor, new: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # a static key-value cache's step: the new key written at its position, then attention-like
    # reads of the whole cache (the new value)
    cache.index_copy_(2, position, new.tanh())
    return (q @ cache.transpose(-1, -2)).softmax(-1)


@pytest.mark.parametrize("shape", [(2, 3, 12, 8), (1, 2, 5, 4)], ids=["cache", "odd"])
def test_a_scatter_into_an_input_writes_the_input_in_place(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    cache = torch.randn(shape)
    position = torch.tensor([shape[2] - 2])
    new, q = torch.randn(*shape[:2], 1, shape[3]), torch.randn(*shape[:2], 1, shape[3])
    with fusebackend.config.patch(graph_cache=False):
        eager_args, compiled_args = _run_both(_cache_update, cache, position, new, q)
    assert_same(compiled_args[0], eager_args[0])  # the cache, written
    schedule = _schedule()
    # the scatter stores into the cache's memory: no copy of the cache before it, none back after
    assert "(into input arg0)" in schedule and "aten.copy_" not in schedule, schedule
    source = fusebackend.last_compiled().wrapper
    assert "= arg0  # aten.copy_ into the input, in place" in source, source
    stored = [line for line in schedule.splitlines() if "(into input arg0)" in line]
    cache_bytes = float(cache.numel() * 4)
    assert all(f"write {cache_bytes / 1024:.2f} KiB" not in line for line in stored), schedule


def _reads_old_and_new(cache: torch.Tensor, position: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    old = cache * 2  # a reader of the old values whose result meets the new ones
    cache.index_copy_(0, position, new)
    return old + cache


def _reads_old_after(cache: torch.Tensor, position: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    total = cache.sum(0)  # a reduction of the old values, which the scatter waits for
    cache.index_copy_(0, position, new)
    return cache.mean(0) - total


@pytest.mark.parametrize("fn", [_reads_old_and_new, _reads_old_after], ids=["old-and-new", "old-reduced"])
def test_a_scatter_into_an_input_runs_after_the_readers_of_the_old_values(fn: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    cache, position, new = torch.randn(6, 5), torch.tensor([4, 1]), torch.randn(2, 5)
    with fusebackend.config.patch(graph_cache=False):
        eager_args, compiled_args = _run_both(fn, cache, position, new)
    assert_same(compiled_args[0], eager_args[0])
    schedule = _schedule()
    assert "(into input arg0)" in schedule, schedule
    steps = [line for line in schedule.splitlines() if line.startswith("  kernel")]
    scatter = next(k for k, line in enumerate(steps) if "(into input arg0)" in line)
    # the kernel reading the old values (2 * cache, its sum) runs first, with no read of arg0 after
    assert scatter >= 1 and "read 120 B" in steps[0], schedule
