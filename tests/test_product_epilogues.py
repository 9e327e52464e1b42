"""A product's ReLU or tanh-GELU folded into one ``aten._addmm_activation`` call (cuBLASLt's
epilogue on a GPU; ``lowering/product_epilogues.py``). On the CPU the tests ask for it
(``product_epilogues="always"``); ATen computes the call as the product, then the activation."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import check

bf16 = torch.bfloat16


def new_gelu(x: torch.Tensor) -> torch.Tensor:  # transformers' NewGELUActivation (GPT-2, Phi, GPT-J): eight ops
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def fast_gelu(x: torch.Tensor) -> torch.Tensor:  # transformers' FastGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _mlp(act: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return act(F.linear(x, w1, b1)) @ w2  # [batch, length, 32] -> 64 -> 16

    return mlp


def _inputs(dtype: torch.dtype = torch.float32, grad: bool = False) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32, dtype=dtype)
    w1, b1, w2 = torch.randn(64, 32, dtype=dtype) / 6, torch.randn(64, dtype=dtype), torch.randn(64, 16, dtype=dtype) / 8
    return (x, *(t.requires_grad_(grad) for t in (w1, b1, w2)))


def _calls() -> list[str]:
    schedule = fusebackend.last_compiled().schedule
    return [line.split("|")[0].split(": ", 1)[1].strip() for line in schedule.splitlines() if line.startswith("  extern ")]


def _fused(calls: list[str]) -> list[str]:
    return [c for c in calls if "_addmm_activation" in c]


@pytest.mark.parametrize("dtype", [torch.float32, bf16])
def test_relu_is_the_products_epilogue(dtype: torch.dtype) -> None:
    with fusebackend.config.patch(product_epilogues="always", graph_cache=False):
        tol = {} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
        check(_mlp(torch.relu), *_inputs(dtype), **tol)
    calls = _calls()
    assert len(_fused(calls)) == 1 and not [c for c in calls if "addmm.default" in c and "_addmm_activation" not in c], calls
    source = fusebackend.last_compiled().aten_graph
    assert "use_gelu = False" in source and "relu" not in source.replace("_addmm_activation", ""), source


@pytest.mark.parametrize("act", [lambda v: F.gelu(v, approximate="tanh"), new_gelu, fast_gelu],
                         ids=["gelu_tanh", "new_gelu", "fast_gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, bf16])
def test_tanh_gelu_written_any_way_is_found(act: Callable[..., Any], dtype: torch.dtype,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the rewrite of the traced graph (on a GPU the call computes the tanh GELU; ATen's CPU
    # kernel the exact one, so on the CPU it is only checked, not run), and its value
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusebackend.decompositions import decomposition_table
    from fusebackend.lowering import product_epilogues

    inputs = _inputs(dtype)
    gm = make_fx(_mlp(act), decomposition_table=decomposition_table())(*inputs)
    with fusebackend.config.patch(product_epilogues="always"):
        assert product_epilogues.fold_activations(gm) == 0  # the CPU's kernel: not this GELU
        monkeypatch.setattr(product_epilogues, "tanh_gelu_epilogue", lambda device: True)
        assert product_epilogues.fold_activations(gm) == 1
    (call,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten._addmm_activation.default]
    assert call.kwargs == {"use_gelu": True}
    assert not [n for n in gm.graph.nodes if n.target in (torch.ops.aten.tanh.default, torch.ops.aten.gelu.default,
                                                          torch.ops.aten.addmm.default)], gm.graph
    x, w1, b1, w2 = inputs
    want = F.gelu(torch.addmm(b1, x.view(-1, 32), w1.t()), approximate="tanh").view(3, 5, 64) @ w2
    call.target = lambda b, x, w, use_gelu: F.gelu(torch.addmm(b, x, w), approximate="tanh")  # as a GPU computes it
    gm.recompile()
    tol = {} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(gm(*inputs), want, **tol)


@pytest.mark.parametrize("case", ["exact gelu", "pre-activation read too", "auto on the cpu", "never"])
def test_products_it_leaves_as_traced(case: str) -> None:
    mode = {"auto on the cpu": "auto", "never": "never"}.get(case, "always")
    act: Callable[..., Any] = F.gelu if case == "exact gelu" else torch.relu  # (exact: never the epilogue's)
    fn = _mlp(act)
    if case == "pre-activation read too":
        def fn(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
            h = F.linear(x, w1, b1)
            return (torch.relu(h) + h) @ w2
    with fusebackend.config.patch(product_epilogues=mode, graph_cache=False):
        check(fn, *_inputs())
    assert not _fused(_calls()), _calls()


def test_a_training_step_with_the_epilogue_matches_eager() -> None:
    # ReLU's gradient reads its output (its ``le`` mask, computed from the output after the
    # chain's end), which the call returns: the forward takes the call, the gradients are eager's
    x, w1, b1, w2 = _inputs(grad=True)
    twins = [t.detach().clone().requires_grad_() for t in (w1, b1, w2)]
    with fusebackend.config.patch(product_epilogues="always", graph_cache=False):
        torch.compile(_mlp(torch.relu), backend="fuse")(x, w1, b1, w2).square().sum().backward()
    _mlp(torch.relu)(x, *twins).square().sum().backward()
    for got, want in zip((w1, b1, w2), twins):
        torch.testing.assert_close(got.grad, want.grad)
    assert fusebackend.metrics.eager_graphs == 0
    forward = next(g.aten_graph for g in fusebackend.history() if g.name.startswith("forward"))
    assert "_addmm_activation.default(" in forward and "aten.relu" not in forward, forward


def test_a_misaligned_product_is_left_for_padding() -> None:
    # 30 fp32 columns: rows 120 bytes apart, a product ``matmuls`` pads on a GPU
    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(F.linear(x, w, b))

    with fusebackend.config.patch(product_epilogues="always", graph_cache=False):
        check(fn, torch.randn(6, 32), torch.randn(30, 32), torch.randn(30))
    assert not _fused(_calls()), _calls()


def test_an_unknown_mode_is_named_in_the_fallback_warning() -> None:
    with fusebackend.config.patch(product_epilogues="sometimes", graph_cache=False):
        with pytest.warns(UserWarning, match="FUSE_PRODUCT_EPILOGUES='sometimes'"):
            out = torch.compile(_mlp(torch.relu), backend="fuse")(*_inputs())
    torch.testing.assert_close(out, _mlp(torch.relu)(*_inputs()))
    assert fusebackend.metrics.eager_graphs == 1
