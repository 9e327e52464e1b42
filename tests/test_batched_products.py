"""Batched products with an addend (``baddbmm``): the product stays in the inputs' dtype."""

from __future__ import annotations

import pytest
import torch

import fusebackend
from helpers import compile_fn, kernel_count, kernels


@pytest.mark.parametrize("beta, alpha", [(1, 0.125), (0.5, 1.0), (0, 2.0)], ids=str)
def test_half_precision_baddbmm_is_a_half_precision_product(beta: float, alpha: float) -> None:
    # ALiBi attention scores (BLOOM): biases [b*h, 1, s] broadcast over the queries. Core's
    # decomposition casts bf16 inputs to fp32, making the product an fp32 GEMM and the scores
    # fp32; here the bmm takes the bf16 inputs and the scaling and the addend fuse into the
    # softmax that reads the product, with no casts of the inputs; the bias scaled by beta
    # (96 values) is computed where the softmax reads it: one kernel
    torch.manual_seed(0)
    bias = torch.randn(4, 1, 24, dtype=torch.bfloat16)
    q, k = torch.randn(4, 9, 8, dtype=torch.bfloat16), torch.randn(4, 24, 8, dtype=torch.bfloat16).transpose(1, 2)

    def fn(bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.softmax(bias.baddbmm(q, k, beta=beta, alpha=alpha), -1, dtype=torch.float32).to(q.dtype)

    fusebackend.dump.clear()
    got = compile_fn(fn)(bias, q, k)
    assert kernel_count() == 1, list(kernels())
    assert "aten.bmm" in "".join(a.wrapper for a in fusebackend.history())
    assert "to_f32" not in fusebackend.history()[-1].ir.split("aten.bmm")[0]  # no input cast before it
    exact = fn(bias.double(), q.double(), k.double())
    ours, eager = (got.double() - exact).abs().max(), (fn(bias, q, k).double() - exact).abs().max()
    assert ours <= 2 * eager + 1e-3, (ours, eager)  # the product rounded to bf16 once more than eager


def test_fp32_baddbmm_keeps_cores_decomposition() -> None:
    bias, a, b = torch.randn(3, 5, 7), torch.randn(3, 5, 4), torch.randn(3, 4, 7)
    got = compile_fn(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0))(bias, a, b)
    torch.testing.assert_close(got, torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0))
