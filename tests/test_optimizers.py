"""Compiled optimizer steps (``torch.compile(opt.step, backend="fuse")``, as PyTorch's tutorial on
compiling the optimizer writes it) against eager's optimizer on a copy of the same model: the
parameters after three steps, and what is left of the step as ATen calls. Every ``_foreach_*``
op and ``prims.fma`` (lerp's decomposition, in the for-loop AdamW) is lowered
(``fusebackend/foreach.py``); the parameters and moments are written in place by the kernels
that compute them (``lowering/mutations.py``, tested in ``test_input_mutation.py``)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch

import fusebackend
from fusebackend import foreach

OPTIMIZERS: dict[str, Callable[[Any, bool], torch.optim.Optimizer]] = {
    "adamw": lambda params, fe: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=fe),
    "adam_amsgrad": lambda params, fe: torch.optim.Adam(params, lr=1e-2, amsgrad=True, foreach=fe),
    "sgd_momentum": lambda params, fe: torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True, foreach=fe),
    "rmsprop": lambda params, fe: torch.optim.RMSprop(params, lr=1e-3, momentum=0.5, foreach=fe),
}


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 5))


# By default every optimizer with foreach ops, and AdamW's for-loop step (prims.fma); the other
# for-loop steps are per-tensor pointwise ops (pytest --full runs them).
@pytest.mark.parametrize("name, foreach_ops", [
    pytest.param(name, fe, id=f"{name}-{'foreach' if fe else 'for_loop'}",
                 marks=() if fe or name == "adamw" else pytest.mark.full)
    for name in OPTIMIZERS for fe in (True, False)])
def test_compiled_step_matches_eager(name: str, foreach_ops: bool) -> None:
    model, twin, opt, twin_opt = _three_steps(name, foreach_ops)
    for got, want in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        for key, state in twin_opt.state[want].items():  # moments, step counts, momentum buffers
            # fp32 accumulated over three steps in another order: a looser bound than the parameters'
            torch.testing.assert_close(opt.state[got][key], state, atol=1e-5, rtol=1e-4)
    m = fusebackend.metrics
    assert m.eager_graphs == 0 and m.kernels_generated > 0
    left = {op for op in m.fallbacks if op.startswith("_foreach") or op == "fma"}
    assert not left, dict(m.fallbacks)


def _three_steps(name: str, foreach_ops: bool) -> tuple[torch.nn.Module, torch.nn.Module, Any, Any]:
    """A model and its twin after three steps of optimizer ``name``: compiled for the model,
    eager for the twin; returns both with their optimizers."""
    torch.manual_seed(0)
    model = _model()
    twin = copy.deepcopy(model)
    opt, twin_opt = OPTIMIZERS[name](model.parameters(), foreach_ops), OPTIMIZERS[name](twin.parameters(), foreach_ops)
    step = torch.compile(opt.step, backend="fuse")
    for _ in range(3):
        x = torch.randn(7, 12)
        for m in (model, twin):
            m.zero_grad()
            m(x).pow(2).sum().backward()
        step()
        twin_opt.step()
    return model, twin, opt, twin_opt


def test_an_adamw_step_writes_parameters_moments_and_counts_in_place() -> None:
    # the parameter's new value reads the new moments, whose copies overwrite the moments' inputs:
    # each parameter's kernel reads the old moments and stores all three in place. The step
    # counts (0-dim, read by every element of the parameter's update) are written in place by
    # kernels of their own, after the parameters' kernels have read them
    _three_steps("adamw", True)
    (graph,) = fusebackend.history()
    kernels = [line for line in graph.schedule.splitlines() if line.startswith("  kernel")]
    assert sum(line.count("(into input") == 3 for line in kernels) == 4, graph.schedule  # p, m, v
    counters = [k for k, line in enumerate(kernels) if "read 4 B, write 4 B" in line]
    assert len(counters) == 4 and all("(into input" in kernels[k] for k in counters), graph.schedule
    assert min(counters) > max(k for k, line in enumerate(kernels) if line.count("(into input") == 3)
    assert "copy_" not in fusebackend.metrics.fallbacks


def test_every_functional_foreach_overload_has_its_per_tensor_calls() -> None:
    table = foreach.decompositions()
    names = {op._schema.name for op in table}
    assert {"aten::_foreach_add", "aten::_foreach_addcdiv", "aten::_foreach_lerp", "aten::_foreach_sqrt",
            "aten::_foreach_norm", "aten::_foreach_maximum", "aten::_foreach_pow"} <= names
    assert not any(op._schema.is_mutable for op in table)  # in-place and _out overloads are not decomposed
    assert "aten::_foreach_mm" not in names


aten = torch.ops.aten


@pytest.mark.parametrize("op, args, kwargs", [
    (aten._foreach_add.List, ("xs", "ys"), {"alpha": 0.5}),
    (aten._foreach_add.Tensor, ("xs", torch.tensor(3.0)), {"alpha": 2}),
    (aten._foreach_sub.ScalarList, ("xs", [1.0, -2.0]), {}),
    (aten._foreach_mul.Scalar, ("xs", 0.9), {}),
    (aten._foreach_div.List, ("xs", "zs"), {}),
    (aten._foreach_addcmul.Scalar, ("xs", "ys", "zs", 0.3), {}),
    (aten._foreach_addcdiv.ScalarList, ("xs", "ys", "zs", [0.1, -0.2]), {}),
    (aten._foreach_addcdiv.Tensor, ("xs", "ys", "zs", torch.tensor([0.1, -0.2])), {}),
    (aten._foreach_lerp.Scalar, ("xs", "ys", 0.3), {}),
    (aten._foreach_lerp.List, ("xs", "ys", "zs"), {}),
    (aten._foreach_pow.ScalarAndTensor, (2.0, "xs"), {}),
    (aten._foreach_sqrt.default, ("zs",), {}),
    (aten._foreach_norm.Scalar, ("xs", 3), {}),
    (aten._foreach_max.default, ("xs",), {}),
    (aten._foreach_maximum.List, ("xs", "ys"), {}),
    (aten._foreach_clamp_min.Scalar, ("xs", 0.0), {}),
], ids=lambda v: str(v) if isinstance(v, torch._ops.OpOverload) else "")
def test_a_foreach_overload_decomposes_to_what_aten_computes(op: Any, args: tuple, kwargs: dict) -> None:
    torch.manual_seed(1)
    lists = {"xs": [torch.randn(3, 4), torch.randn(5)], "ys": [torch.randn(3, 4), torch.randn(5)],
             "zs": [torch.rand(3, 4) + 0.5, torch.rand(5) + 0.5]}
    real = tuple(lists[a] if isinstance(a, str) else a for a in args)
    want = op(*real, **kwargs)
    got = foreach.decompositions()[op](*real, **kwargs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    if op is aten._foreach_addcdiv.Tensor:
        return  # Dynamo's fake tensors cannot run it (its scalars must be a CPU tensor, a fake one is meta)
    compiled = torch.compile(lambda *a: op(*a, **kwargs), backend="fuse")(*real)
    for g, w in zip(compiled, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
    assert not [k for k in fusebackend.metrics.fallbacks if k.startswith("_foreach")], dict(fusebackend.metrics.fallbacks)


def test_a_step_over_more_tensors_than_decomposed_keeps_the_foreach_calls() -> None:
    # past foreach.MAX_TENSORS the foreach ops are not decomposed per tensor (the compile time
    # would grow with the tensors): the step is one kernel over the lists
    # (tests/test_foreach_lists.py), and right
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)) for _ in range(foreach.MAX_TENSORS + 1)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(params, twins):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    opt, twin_opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True), torch.optim.SGD(twins, lr=0.1, momentum=0.9, foreach=True)
    step = torch.compile(opt.step, backend="fuse")
    for _ in range(2):
        step()
        twin_opt.step()
    for got, want in zip(params, twins):
        torch.testing.assert_close(got, want)
    assert "fusebackend.foreach_lists" in fusebackend.last_compiled().schedule


@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["default", "reduce-overhead"])
def test_a_whole_training_step_compiled_matches_eager(mode: str | None) -> None:
    # forward, backward, opt.step() and zero_grad() in one compiled function, as users write it:
    # Dynamo breaks the graph at backward(); the forward, the backward and the step are compiled
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.LayerNorm(24), torch.nn.GELU(), torch.nn.Linear(24, 5))
    twin = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, foreach=True)

    def train_step(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        o.step()
        o.zero_grad()
        return loss.detach()

    compiled = torch.compile(train_step, backend="fuse", mode=mode)
    for _ in range(3):
        x, y = torch.randn(7, 12), torch.randn(7, 5)
        torch.testing.assert_close(compiled(model, opt, x, y), train_step(twin, twin_opt, x, y), atol=1e-5, rtol=1e-4)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)
        assert p.grad is None
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key], twin_opt.state[q][key], atol=1e-5, rtol=1e-4)
    m = fusebackend.metrics
    assert m.eager_graphs == 0
    names = [a.name.split("_")[0] for a in fusebackend.history()]
    assert {"forward", "backward", "inference"} <= set(names), names
    step_graph = next(a for a in fusebackend.history() if a.name.startswith("inference"))
    assert step_graph.schedule.count("(into input") == 24  # 6 parameters, their two moments and step counts


def test_a_learning_rate_schedule_over_a_tensor_learning_rate_compiles_once() -> None:
    # PyTorch's advice for compiled steps: a tensor learning rate (capturable=True), which a
    # scheduler updates in place, so the compiled step reads it and no guard sees it change
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = _model()
    twin = copy.deepcopy(model)
    x = torch.randn(16, 12)
    # the twin runs the same capturable step's ATen ops (aot_eager: capturable steps run eagerly
    # only on a GPU). A float rate's eager step is no reference: capturable=True computes the
    # bias corrections 1 - beta2**t in fp32 tensors, where 1 - 0.999 is off by up to 6e-5 of
    # itself, and its parameters end about 1e-6 from float64's (fuse, Inductor and aot_eager
    # alike), against 2e-7 for the float rate's step
    opts = [torch.optim.AdamW(m.parameters(), lr=torch.tensor(0.02), foreach=True, capturable=True)
            for m in (model, twin)]
    schedules = [torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=12)
                 for o in opts]
    for m, o, sched, backend in ((twin, opts[1], schedules[1], "aot_eager"), (model, opts[0], schedules[0], "fuse")):
        torch._dynamo.reset()
        counters.clear()
        step = torch.compile(o.step, backend=backend)
        for _ in range(12):
            o.zero_grad()
            m(x).square().mean().backward()
            step()
            sched.step()
    for got, want in zip(model.parameters(), twin.parameters()):  # (6e-8 apart on the CPU, 2026-12-02)
        torch.testing.assert_close(got, want, atol=3e-7, rtol=1e-5)
    assert float(opts[0].param_groups[0]["lr"]) == pytest.approx(0.002)  # the schedule ran to its end
    assert counters["stats"]["unique_graphs"] == 1  # the step compiled once, for all twelve rates
    assert not counters["recompiles"]
    assert fusebackend.metrics.eager_graphs == 0


def test_the_optimizer_benchmark_compares_each_variant_with_eager() -> None:
    """``benchmarks/optimizers.py`` on the CPU: fuse's steps over a synthetic list of tensors match
    eager's foreach steps, its steady step is generated kernels, and the floor's bytes are what an
    AdamW step reads and writes (parameters, gradients, both moments; not the step count)."""
    from benchmarks import optimizers

    rows = optimizers.measure(["synthetic4"], "tiny", ["adamw"], ["eager", "fuse", "fuse@reduce-overhead"],
                              torch.device("cpu"), torch.float32, steps=3, repeats=1, log=lambda _: None)
    eager, fuse, graphs = rows
    assert (eager.status, fuse.status, graphs.status) == ("ok", "ok", "ok") and eager.tensors == fuse.tensors == 4
    assert fuse.max_rel_diff is not None and fuse.max_rel_diff < 1e-5
    # a mode after @ (CUDA graphs on a GPU; on the CPU the graph runs uncaptured): the same step
    assert graphs.max_rel_diff is not None and graphs.max_rel_diff < 1e-5 and graphs.kernels == fuse.kernels
    assert fuse.kernels and not {op for op in fuse.aten_calls if op.startswith("_foreach")}, fuse.aten_calls
    params = [p.requires_grad_() for p in optimizers.parameters("synthetic4", "tiny", torch.device("cpu"), torch.float32)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = optimizers.OPTIMIZERS["adamw"](params, foreach=True)
    opt.step()
    assert optimizers.step_bytes(params, opt) == 7 * 4 * sum(p.numel() for p in params)


def test_whole_training_steps_match_eager_and_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks/training_steps.py`` on the CPU: GPT-2's forward, backward, AdamW step and
    zero_grad compiled as one function by fuse update every weight as eager does, judged against
    a float64 copy; and a compiled step whose update is off fails that judgement."""
    from benchmarks import training_steps

    rows = training_steps.run_model("gpt2", "tiny", ["eager", "fuse"], "adamw", torch.device("cpu"), torch.float32,
                                    steps=1, timing=None, log=lambda _: None)
    assert [r.status for r in rows] == ["ok", "ok"], rows
    assert all(r.worst_ratio is not None and r.worst_ratio <= 1 for r in rows), rows
    assert rows[1].graphs and rows[1].graphs >= 2 and rows[1].eager_graphs == 0  # forward and backward, the step
    # a compiled step whose optimizer takes 1.5x the rate: its updates are not eager's
    adamw = training_steps.OPTIMIZERS["adamw"]
    calls: list[int] = []

    def off_for_the_compiled(params: Any, **kw: Any) -> torch.optim.Optimizer:
        calls.append(1)  # the float64 copy's first, then eager's, then the compiled variant's
        return adamw(params, **kw) if len(calls) < 3 else torch.optim.AdamW(params, lr=1.5e-3, weight_decay=0.01, **kw)

    monkeypatch.setitem(training_steps.OPTIMIZERS, "adamw", off_for_the_compiled)
    rows = training_steps.run_model("gpt2", "tiny", ["eager", "fuse"], "adamw", torch.device("cpu"), torch.float32,
                                    steps=1, timing=None, log=lambda _: None)
    assert rows[0].status == "ok" and rows[1].status.startswith("wrong: "), rows


def test_an_update_is_judged_by_its_norm_not_one_element() -> None:
    """Adam moves an element by about the learning rate whatever its gradient's size: an element
    whose near-zero gradient rounded to the other sign moves the other way, by chance, in eager's
    steps as in a compiler's. One such element passes; the whole update 1.5x too large does not."""
    from benchmarks.training_steps import update_distance

    exact = torch.full((768,), 1e-3, dtype=torch.float64) * torch.randn(768, dtype=torch.float64).sign()
    eager = exact.float() + 1e-6 * torch.randn(768)  # eager: rounding only
    flipped = eager.clone()
    flipped[5] = -flipped[5]
    assert update_distance("b", flipped, eager, exact).ok
    assert (flipped.double() - exact).abs().max() > 2 * (eager.double() - exact).abs().max()  # the largest element: off
    assert not update_distance("b", 1.5 * eager, eager, exact).ok
    assert not update_distance("b", eager[:10], eager, exact).ok  # a shape that differs
    # a parameter too small for the allowance: one element moved the other way is its update
    small = exact[:8].clone()
    one_off = small.float().clone()
    one_off[0] = -one_off[0]
    assert update_distance("s", small.float(), small.float(), small).ok
    assert not update_distance("s", one_off, small.float(), small).ok


def _chain_graph(read_old_after: bool) -> torch.fx.GraphModule:
    """An ATen graph as AOTAutograd gives a momentum update over two tensors: functional foreach
    calls, their last results copied back into the inputs; ``read_old_after``: a later node reads
    an input's old value."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def update(b0: torch.Tensor, b1: torch.Tensor, g0: torch.Tensor, g1: torch.Tensor) -> torch.Tensor:
        scaled = torch._foreach_mul([b0, b1], 0.9)
        summed = torch._foreach_add(scaled, [g0, g1])
        seen = b0 * 2 if read_old_after else summed[0] * 2
        b0.copy_(summed[0])
        b1.copy_(summed[1])
        return seen

    return make_fx(update)(*[torch.randn(3) for _ in range(4)])


@pytest.mark.parametrize("read_old_after", [False, True], ids=["chain", "old-value-read-after"])
def test_a_foreach_chain_copied_back_into_its_inputs_runs_in_place(read_old_after: bool) -> None:
    gm = _chain_graph(read_old_after)
    inputs = [torch.randn(3) for _ in range(4)]
    expected_inputs = [t.clone() for t in inputs]
    expected = gm(*expected_inputs)
    rewritten = foreach.in_place_chains(gm)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    if read_old_after:  # the input's old value is read after the chain began: left functional
        assert rewritten == 0 and torch.ops.aten.copy_.default in targets
    else:
        assert rewritten == 2 and torch.ops.aten.copy_.default not in targets
        assert {torch.ops.aten._foreach_mul_.Scalar, torch.ops.aten._foreach_add_.List} <= targets
    got = gm(*inputs)
    torch.testing.assert_close(got, expected)
    for a, b in zip(inputs, expected_inputs):
        torch.testing.assert_close(a, b)


def test_an_adamw_step_over_more_tensors_than_decomposed_updates_in_place() -> None:
    """Past foreach.MAX_TENSORS AdamW's foreach calls are not decomposed: no copy back into a
    parameter or state is left, and parameters and states match eager's."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)) for _ in range(foreach.MAX_TENSORS + 2)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=True)
    twin_opt = torch.optim.AdamW(twins, lr=1e-2, weight_decay=0.1, foreach=True)
    step = torch.compile(opt.step, backend="fuse")
    for k in range(3):
        for p, q in zip(params, twins):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        step()
        twin_opt.step()
    for got, want in zip(params, twins):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        for key, state in twin_opt.state[want].items():
            torch.testing.assert_close(opt.state[got][key], state, atol=1e-6, rtol=1e-5)
    steady = fusebackend.last_compiled().schedule
    externs = [line.split("|")[0].split(": ", 1)[1].strip() for line in steady.splitlines()
               if line.startswith("  extern ")]
    assert not any("aten.copy_" in line for line in externs), steady
    # the step counts' += 1 as eager makes it, then the rest of the step in one generated kernel
    # over every tensor (tests/test_foreach_lists.py); without it, the in-place foreach calls
    assert externs == ["aten._foreach_add_.Scalar", "fusebackend.foreach_lists.default"], steady
    with fusebackend.config.patch(foreach_lists=False):
        torch._dynamo.reset()
        torch.compile(opt.step, backend="fuse")()
    steady = fusebackend.last_compiled().schedule
    assert "_foreach_addcdiv_" in steady and "foreach_lists" not in steady, steady
