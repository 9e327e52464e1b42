"""Runs of foreach calls over long lists as one generated kernel over every tensor
(``fusebackend/lowering/foreach_lists.py``): optimizer steps compiled with ``torch.compile(opt.step)``
over more tensors than ``foreach.MAX_TENSORS``, of odd sizes, against eager's optimizer; what the
kernel holds; and the runs it leaves as ATen calls, still right."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch

import fusebackend
from fusebackend import foreach
from fusebackend.lowering import foreach_call, foreach_lists

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam_amsgrad": lambda params: torch.optim.Adam(params, lr=1e-2, amsgrad=True, foreach=True),
    "sgd_nesterov": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True, foreach=True),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=1e-3, momentum=0.5, foreach=True),
}
SHAPES = [(3, 5), (7,), (2, 3, 4), (1,), (1100,), (33, 31)]  # odd sizes; one longer than a block


def _steps(name: str, shapes: list[tuple[int, ...]], steps: int = 3, make: Callable[..., Any] = torch.randn,
           twin: Callable[[Any], torch.optim.Optimizer] | None = None
           ) -> tuple[list[torch.Tensor], list[torch.Tensor], Any, Any]:
    """Parameters of ``shapes`` and their twins after ``steps`` steps of optimizer ``name``: compiled
    for the parameters, eager for the twins (optimizer ``twin`` where given)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    params = [torch.nn.Parameter(make(shape)) for shape in shapes]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, twin_opt = OPTIMIZERS[name](params), (twin or OPTIMIZERS[name])(twins)
    step = torch.compile(opt.step, backend="fuse")
    for _ in range(steps):
        for p, q in zip(params, twins):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        with fusebackend.config.patch(graph_cache=False):
            step()
        twin_opt.step()
    return params, twins, opt, twin_opt


def _assert_same(params, twins, opt, twin_opt) -> None:
    for got, want in zip(params, twins):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        for key, state in twin_opt.state[want].items():  # moments, step counts, momentum buffers
            torch.testing.assert_close(opt.state[got][key], state, atol=1e-5, rtol=1e-4)


def _externs(schedule: str) -> list[str]:
    return [line.split("|")[0].split(": ", 1)[1].strip() for line in schedule.splitlines()
            if line.startswith("  extern ")]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_step_over_many_tensors_is_one_kernel(name: str) -> None:
    shapes = (SHAPES * 4)[: foreach.MAX_TENSORS + 4]
    params, twins, opt, twin_opt = _steps(name, shapes)
    _assert_same(params, twins, opt, twin_opt)
    assert fusebackend.metrics.eager_graphs == 0
    steady = fusebackend.last_compiled().schedule  # the step after the states were made
    externs = _externs(steady)
    assert externs.count("fusebackend.foreach_lists.default") == 1, steady
    # what stays ATen: the step counts' += 1 (each position's programs would read the count
    # another one had written), as eager makes it
    assert [e for e in externs if e != "fusebackend.foreach_lists.default"] in (
        [], ["aten._foreach_add_.Scalar"]), steady
    assert "foreach_lists" not in fusebackend.metrics.fallbacks


# PyTorch's other foreach optimizers: a run the kernel cannot take whole (calls over step counts
# alone, ops it does not generate, results read by a later ATen call) is cut into the longest
# parts it can; the rest stays ATen calls. Each step must be right, and no graph eager.
OTHERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    "adamax": lambda ps: torch.optim.Adamax(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    "nadam": lambda ps: torch.optim.NAdam(ps, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, foreach=True),
    "radam": lambda ps: torch.optim.RAdam(ps, lr=1e-2, foreach=True),
    "adadelta": lambda ps: torch.optim.Adadelta(ps, lr=1.0, weight_decay=0.1, foreach=True),
    "asgd": lambda ps: torch.optim.ASGD(ps, lr=1e-2, foreach=True),
    "rprop": lambda ps: torch.optim.Rprop(ps, lr=1e-2, foreach=True),
    "adam_maximize": lambda ps: torch.optim.Adam(ps, lr=1e-2, maximize=True, weight_decay=0.1, foreach=True),
}


@pytest.mark.parametrize("name", list(OTHERS))
def test_other_optimizers_stay_right(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(OPTIMIZERS, name, OTHERS[name])
    params, twins, opt, twin_opt = _steps(name, (SHAPES * 4)[: foreach.MAX_TENSORS + 2])
    _assert_same(params, twins, opt, twin_opt)
    assert fusebackend.metrics.eager_graphs == 0
    assert "fusebackend.foreach_lists" in fusebackend.last_compiled().schedule


def test_the_kernel_reads_and_writes_each_list_once() -> None:
    sources: list[str] = []
    plan_source = foreach_lists._Plan.source

    def keep(plan: Any) -> str:
        sources.append(plan_source(plan))
        return sources[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(foreach_lists._Plan, "source", keep)
        _steps("adamw", (SHAPES * 4)[: foreach.MAX_TENSORS + 1])
    source = sources[-1]
    # parameters, first and second moments written; gradients and step counts read; the body
    # twice: a whole block's, unmasked, and a tensor's last block's
    assert source.count("if first + BLOCK <= numel:") == 1 and source.count("mask = offs < numel") == 1
    assert source.count("tl.store(") == 2 * 3
    assert source.count("tl.load(p") == 2 * 5  # the four lists and the step counts (one value a tensor)
    assert source.count(" + offs)") == 4 and source.count(" + offs, mask=mask)") == 4  # each list once
    assert source.count(", mask=mask)") == 4 + 3  # and the stores
    # each address as a distance from the table's (whose alignment Triton knows), the lists' told
    # a multiple of 16 bytes where every tensor's is (fp32: 4 elements); the step counts' not
    assert source.count(" = tl.multiple_of(d") == 4 and source.count(", 4)") == 4
    assert source.count("= table_ptr.to(tl.pointer_type(tl.float32)) + d") == 5
    assert "th.sqrt(" in source and "th.div(" in source


def test_the_wrapper_calls_the_function_and_one_source_serves_lists_of_any_length() -> None:
    from fusebackend.kernels.wrapper_calls import aten_call

    # the wrapper's call skips the dispatcher (each list of tensors made C++ values and back)
    assert aten_call(foreach_lists.CALL) is foreach_call._foreach_lists
    # two steps whose runs are the same source over lists of different lengths: each length its
    # own launcher (Triton specializes the int N), both right
    for count in (foreach.MAX_TENSORS + 1, foreach.MAX_TENSORS + 3):
        params, twins, opt, twin_opt = _steps("adamw", (SHAPES * 4)[:count])
        _assert_same(params, twins, opt, twin_opt)
    lengths = [n for (_, n, _) in foreach_call._launchers]
    assert {foreach.MAX_TENSORS + 1, foreach.MAX_TENSORS + 3} <= set(lengths)


@pytest.mark.parametrize("case", ["non-contiguous", "float64", "off"])
def test_runs_it_does_not_generate_stay_aten_calls(case: str) -> None:
    shapes = (SHAPES * 4)[: foreach.MAX_TENSORS + 2]
    if case == "non-contiguous":  # a parameter made transposed: its elements are not the list's order
        def make(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.randn(*reversed(shape)).transpose(0, -1) if len(shape) > 1 else torch.randn(shape)

        result = _steps("adamw", shapes, make=make)
    elif case == "float64":
        result = _steps("adamw", shapes, make=lambda shape: torch.randn(shape, dtype=torch.float64))
    else:
        with fusebackend.config.patch(foreach_lists=False):
            result = _steps("adamw", shapes)
    _assert_same(*result)
    steady = fusebackend.last_compiled().schedule
    assert "foreach_lists" not in steady and "_foreach_addcdiv_" in steady, steady


def test_a_tensor_learning_rate_is_read_by_the_kernel() -> None:
    # capturable AdamW with the learning rate a tensor (a scheduler changes it without a
    # recompile): one scalar tensor read at every position of the lists. Eager's twin takes the
    # rate as a float (capturable steps run eagerly only on a GPU)
    OPTIMIZERS["adamw_tensor_lr"] = lambda params: torch.optim.AdamW(
        params, lr=torch.tensor(0.02), weight_decay=0.1, foreach=True, capturable=True)
    try:
        params, twins, opt, _ = _steps("adamw_tensor_lr", (SHAPES * 4)[: foreach.MAX_TENSORS + 3],
                                       twin=lambda ps: torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1, foreach=True))
    finally:
        del OPTIMIZERS["adamw_tensor_lr"]
    for got, want in zip(params, twins):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    steady = fusebackend.last_compiled().schedule
    assert _externs(steady).count("fusebackend.foreach_lists.default") == 1, steady
    assert "_foreach_addcdiv" not in steady and "_foreach_mul" not in steady, steady


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_lists_round_each_result_as_the_graph_does(dtype: torch.dtype) -> None:
    # parameters and states in bf16 or fp16, computed in fp32 with each call's results rounded
    # to the dtype. The first step's moments, from zero, are one rounding each as the traced
    # graph computes them: exp_avg is lerp's decomposition, m + (g - m) * w with w a fill of the
    # dtype, and exp_avg_sq 0.999 * 0 + 0.001 * g * g. Three steps stay within the dtype's
    # tolerance of eager's (whose lerp is one op, its weight an fp32 value)
    shapes = (SHAPES * 4)[: foreach.MAX_TENSORS + 2]
    make = lambda shape: torch.randn(shape, dtype=dtype)  # noqa: E731
    params, _, opt, _ = _steps("adamw", shapes, steps=1, make=make)
    source = next(v for k, v in fusebackend.last_compiled().kernels.items() if k.startswith("foreach_lists"))
    assert ("th.round_bf16(" if dtype == torch.bfloat16 else ".to(tl.float16).to(tl.float32)") in source
    # a quotient or root rounded to the dtype at once is Triton's approximate one (the second
    # moment's root, its divisions by the bias corrections' scalars); addcdiv's quotient, added
    # to the parameter before it is rounded, stays correctly rounded; so do the fp32 scalars'
    whole = source.split("else:  # the tensor's last block")[0]
    rounded = "th.round_bf16(" if dtype == torch.bfloat16 else ""
    assert f"{rounded}(tl.sqrt(" in whole and whole.count(" / v") == 2, source
    assert whole.count("th.div(") == 3 and whole.count("th.sqrt(") == 1, source  # addcdiv's; two and one scalars'
    fill = torch.tensor(1 - 0.9, dtype=dtype).float()
    for p in params:
        g = p.grad.float()
        assert opt.state[p]["exp_avg"].dtype == dtype
        assert torch.equal(opt.state[p]["exp_avg"], (g * fill).to(dtype))
        assert torch.equal(opt.state[p]["exp_avg_sq"], (g * g * (1 - 0.999)).to(dtype))
    params, twins, _, _ = _steps("adamw", shapes, make=make)
    for got, want in zip(params, twins):
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_tables_are_host_tensors_under_a_default_device() -> None:
    # CUDA graph trees warm a graph up under ``torch.device(cuda)``: the pointer and block tables
    # are made on the host first (to be pinned and copied without a wait), whatever the default
    with torch.device("meta"):
        table, keep = foreach_call._on_device([3, 1, 4], torch.device("cpu"))
    assert table.device.type == "cpu" and table.tolist() == [3, 1, 4] and keep is None
    blocks, numels, _ = foreach_call._block_tables(torch.device("cpu"), (foreach_call.BLOCK + 1, 5))
    assert blocks.tolist() == [0, 0, 0, foreach_call.BLOCK, 1, 0] and numels.tolist() == [foreach_call.BLOCK + 1, 5]


def test_the_table_holds_distances_from_itself_and_whether_every_address_is_aligned() -> None:
    flat = torch.randn(40)
    tensors = [torch.randn(10), torch.randn(3, dtype=torch.bfloat16), torch.tensor(2.0), flat[1:5]]
    pointers = tuple(t.data_ptr() for t in tensors)
    table, _, aligned = foreach_call._pointer_table(tensors, pointers, torch.device("cpu"))
    assert [table.data_ptr() + d * t.element_size() for d, t in zip(table.tolist(), tensors)] == list(pointers)
    assert not aligned  # flat[1:5] lies 4 bytes past a multiple of 16
    assert foreach_call._pointer_table(tensors[:3], pointers[:3], torch.device("cpu"))[2]


@pytest.mark.parametrize("offset", [0, 1])
def test_whole_blocks_and_last_blocks_at_any_alignment(offset: int) -> None:
    # tensors of one block and a bit, of whole blocks, and of less than one, as views whose
    # addresses lie `offset` elements past an allocation's: the kernel's two paths (a whole block
    # unmasked, a last block masked) under either ALIGNED, right
    block = foreach_call.BLOCK
    shapes = [(block + 3,), (2 * block,), (7, 5), (block - 1,)] * (foreach.MAX_TENSORS // 4 + 1)
    make = lambda shape: torch.randn(math.prod(shape) + offset)[offset:].view(shape)  # noqa: E731
    foreach_call._launchers.clear()
    params, twins, opt, twin_opt = _steps("adamw", shapes, make=make)
    assert all((p.data_ptr() % 16 != 0) == bool(offset) for p in params)
    _assert_same(params, twins, opt, twin_opt)
    assert {aligned for (_, _, aligned) in foreach_call._launchers} == {not offset}
