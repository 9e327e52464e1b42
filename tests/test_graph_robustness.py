"""Graphs that real models hand us compile whole, and what cannot be compiled is never wrong.

- tensors the graph module holds (``get_attr``: the empty key-value cache of GPT-2, Llama, T5)
  become buffers bound into the wrapper;
- ops on complex tensors, or on views with a conjugate bit or another dtype, stay ATen calls
  (``torch.fft.ihfft`` once gave a wrong answer here: a ``_conj`` view read as a plain view);
- results of an ATen call that nothing uses are never touched (ATen may return None there);
- an op without a meta kernel takes its layout from the traced value;
- a forward or inference graph that cannot be compiled runs Dynamo's own graph: the original,
  undecomposed ops, as eager would;
- ``FUSE_FUSION=0`` runs graphs that write their inputs in place;
- ``fusebackend.check_kernels`` names the first kernel whose buffer differs from eager's.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fusebackend
from fusebackend.codegen import triton_ops
from helpers import assert_same, check, kernel_count


def test_tensor_constant_in_the_graph_is_a_buffer() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        # lifted: a get_attr node and lift_fresh_copy (the device named: Dynamo makes a tensor
        # literal on the CPU whatever the default device)
        bias = torch.tensor([0.5, -1.0, 2.0, 3.0], device=x.device)
        return torch.cat([torch.tensor([], device=x.device), x]).sigmoid() * bias + bias

    x = torch.randn(4)
    check(fn, x)
    assert kernel_count() >= 1
    wrapper = fusebackend.last_compiled().wrapper
    assert "const_0" in wrapper and "del const_0" not in wrapper
    assert "constant const_0" in fusebackend.last_compiled().ir


def test_gpt2_style_cache_concatenation_compiles_whole() -> None:
    # transformers' attention concatenates an empty past key/value tensor held as a constant
    def fn(k: torch.Tensor) -> torch.Tensor:
        past = torch.tensor([], device=k.device)
        return torch.cat([past, k.flatten()]) * 2

    check(fn, torch.randn(3, 5))


@pytest.mark.parametrize("name", ["ihfft_ortho", "ifft", "view_as_real", "rfft_abs"])
def test_complex_ops_and_conjugate_views_stay_aten_calls(name: str) -> None:
    fns = {
        "ihfft_ortho": lambda x: torch.fft.ihfft(x, norm="ortho"),
        "ifft": lambda x: torch.fft.ifft(x),
        "view_as_real": lambda x: torch.view_as_real(torch.fft.rfft(x)) * 2 + 1,
        "rfft_abs": lambda x: torch.fft.rfft(x).abs() + x[..., :4],
    }
    fn = fns[name]
    x = torch.randn(5, 6, 7)
    out = torch.compile(fn, backend="fuse")(x)
    ref = fn(x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert fusebackend.metrics.eager_graphs == 0


def test_view_as_another_dtype_is_an_aten_call() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x + 1).view(torch.int32) & 0xFFFF

    x = torch.randn(4, 6)
    check(fn, x)
    assert fusebackend.metrics.fallbacks["view"] == 1


def test_unused_results_of_an_aten_call_are_not_touched() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.slogdet(x)[1] * 2

    x = torch.randn(3, 4, 4) + 4 * torch.eye(4)
    check(fn, x)
    wrapper = fusebackend.last_compiled().wrapper
    call = next(line for line in wrapper.splitlines() if "= aten__linalg_slogdet(" in line)
    result = call.split("=")[0].strip()
    bound = [line for line in wrapper.splitlines() if f"{result}[" in line]
    assert len(bound) == 1 and f"{result}[1]" in bound[0], bound


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_a_graph_that_fails_to_compile_runs_dynamos_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(fusebackend.backend, "compile_graph", broken)
    fn = lambda x, w: F.layer_norm(x, (8,), w) * 2  # noqa: E731
    x, w = torch.randn(4, 8), torch.randn(8)
    compiled = torch.compile(fn, backend="fuse")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert_same(compiled(x, w), fn(x, w))
        with _OpRecorder() as recorder:
            assert_same(compiled(x, w), fn(x, w))
    messages = [str(r.message) for r in record if "fusebackend" in str(r.message)]
    assert len(messages) == 1 and "Dynamo's graph" in messages[0], messages
    # eager's own layer norm ran, not the decomposition into a variance and arithmetic
    assert "native_layer_norm" in recorder.ops and "var_mean" not in recorder.ops, recorder.ops
    assert fusebackend.metrics.eager_graphs == 1


def test_a_training_graph_that_fails_runs_dynamos_graph_with_autograd(monkeypatch: pytest.MonkeyPatch) -> None:
    real = fusebackend.backend.compile_graph

    def no_forward(gm: Any, args: Any, name: str, user_outputs: int | None = None) -> Any:
        if name.startswith("forward"):
            raise NotImplementedError("no forward today")
        return real(gm, args, name, user_outputs)

    monkeypatch.setattr(fusebackend.backend, "compile_graph", no_forward)
    w = torch.randn(6, 6, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_()
    fn = lambda x, w: torch.tanh(x @ w).sum()  # noqa: E731
    x = torch.randn(3, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = torch.compile(fn, backend="fuse")(x, w)
    loss.backward()
    ref = fn(x, w_ref)
    ref.backward()
    assert_same(loss.detach(), ref.detach())
    assert_same(w.grad, w_ref.grad)


def test_fusion_off_runs_graphs_that_update_inputs_in_place() -> None:
    bn, bn_ref = torch.nn.BatchNorm2d(3).train(), torch.nn.BatchNorm2d(3).train()
    x = torch.randn(2, 3, 5, 5)
    with fusebackend.config.patch(fusion=False):
        out = torch.compile(bn, backend="fuse")(x)
    assert_same(out, bn_ref(x))
    assert_same(bn.running_mean, bn_ref.running_mean)
    assert_same(bn.running_var, bn_ref.running_var)
    assert fusebackend.metrics.eager_graphs == 0


def test_check_kernels_finds_the_first_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x) @ w  # a kernel, then an ATen call
        return torch.sigmoid(a).sum(-1)  # a kernel with the broken op

    x, w = torch.randn(5, 8), torch.randn(8, 3)
    report = fusebackend.check_kernels(fn, x, w)
    assert report.checks and report.first_wrong is None, str(report)

    monkeypatch.setitem(triton_ops.OP_TEMPLATES, "sigmoid", "th.sigmoid({0}) * 1.001")
    # code generation patched in memory: the cache's key (fusebackend's source files) cannot see it
    with fusebackend.config.patch(graph_cache=False):
        report = fusebackend.check_kernels(fn, x, w)
    wrong = report.first_wrong
    assert wrong is not None and "sigmoid" in wrong.label, str(report)
    before = report.checks[: report.checks.index(wrong)]
    assert before and all(c.ok for c in before)  # the relu kernel and the matmul were checked first


def test_a_lowering_that_fails_leaves_that_op_alone_to_aten(monkeypatch: pytest.MonkeyPatch) -> None:
    from fusebackend.lowering import POINTWISE

    def broken(ctx: Any, self: Any) -> Any:
        raise ZeroDivisionError("simulated lowering bug")

    monkeypatch.setitem(POINTWISE, torch.ops.aten.tanh.default, broken)
    fn = lambda x: torch.tanh(x * 2) + 1  # noqa: E731
    x = torch.randn(6, 5)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = torch.compile(fn, backend="fuse")(x)
    assert_same(out, fn(x))
    messages = [str(r.message) for r in record if "fusebackend" in str(r.message)]
    assert len(messages) == 1 and "aten.tanh" in messages[0] and "ATen call" in messages[0], messages
    assert fusebackend.metrics.fallbacks["tanh"] == 1 and fusebackend.metrics.eager_graphs == 0
    assert kernel_count() == 2  # x * 2 before the ATen tanh, + 1 after it


def test_check_kernels_option_warns_at_the_first_wrong_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(triton_ops.OP_TEMPLATES, "exp", "tl.exp({0}) + 0.01")
    fn = lambda x: torch.exp(x).sum(-1)  # noqa: E731
    with fusebackend.config.patch(check_kernels=True), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        torch.compile(fn, backend="fuse")(torch.randn(4, 7))
    messages = [str(r.message) for r in record if "first wrong buffer" in str(r.message)]
    assert len(messages) == 1 and "WRONG" in messages[0], messages


@pytest.mark.parametrize("causal", [False, True])
def test_attention_training_gradients_match_eager(causal: bool) -> None:
    # the CPU flash attention's decomposition once fed the ATen backward wrong tensors
    q, k, v = (torch.randn(2, 2, 8, 16, requires_grad=True) for _ in range(3))
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fn = lambda q, k, v: (F.scaled_dot_product_attention(q, k, v, is_causal=causal) * 1.5).sum()  # noqa: E731
    torch.compile(fn, backend="fuse")(q, k, v).backward()
    fn(*refs).backward()
    for t, r in zip((q, k, v), refs):
        torch.testing.assert_close(t.grad, r.grad, atol=1e-5, rtol=1e-5)
    assert fusebackend.metrics.eager_graphs == 0 and kernel_count() >= 1


def test_effectful_calls_run_in_order_and_raise_as_eager() -> None:
    # linalg ops check their results through an effectful call AOTAutograd orders by a token
    fn = lambda x: torch.linalg.inv(x) * 2  # noqa: E731
    x = torch.randn(4, 4)
    x = x @ x.T + 4 * torch.eye(4)
    compiled = torch.compile(fn, backend="fuse")
    assert_same(compiled(x), fn(x))
    assert fusebackend.metrics.eager_graphs == 0 and kernel_count() == 1
    singular = torch.zeros(4, 4)
    if singular.device.type == "cuda":
        return  # eager's CUDA inverse reports no singular matrix: there is no error to keep
    with pytest.raises(RuntimeError) as eager_error:
        fn(singular)
    with pytest.raises(RuntimeError) as compiled_error:
        compiled(singular)  # the check still runs, and raises eager's error
    assert str(compiled_error.value).splitlines()[0] == str(eager_error.value).splitlines()[0]


@pytest.mark.parametrize("op", ["logical_and", "logical_or", "logical_xor", "fmax", "eq"])
def test_binary_ops_with_a_zero_dim_operand(op: str) -> None:
    # a comparison of 0-dim loads is a bool tensor, which a block can be combined with
    fn = getattr(torch, op)
    check(fn, torch.randn(7), torch.tensor(0.25))
    check(fn, torch.tensor(0.0), torch.randn(3, 5))


def test_masked_gather_of_one_repeated_address() -> None:
    # cartesian_prod concatenates broadcast columns: a load whose address is the same for every
    # lane, under a block mask (it once ran its graph eagerly in Triton's interpreter)
    check(lambda a, b: torch.cartesian_prod(a, b) * 2, torch.randn(3), torch.randn(4))
    check(lambda a, b: torch.cat([a.expand(5, 1), b], 0) + 1, torch.randn(1, 1), torch.randn(3, 1))


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 2)])
def test_reduction_over_a_broadcast_dim_counts_every_position(dims: tuple[int, ...]) -> None:
    # the value read does not vary along the reduced (stride-0) dim; a mask on the rows alone once
    # reduced it over one position instead of all (cosine_similarity of broadcast inputs)
    check(lambda a: a.expand(4, 5, 3).sum(dims), torch.randn(1, 5, 3))
    check(lambda a: a.expand(2, 5, 3).amax(dims) + a.expand(2, 5, 3).mean(dims), torch.randn(1, 5, 1))
    check(lambda a, b: F.cosine_similarity(a, b, dim=-2), torch.randn(1, 2, 3), torch.randn(2, 1, 3))
