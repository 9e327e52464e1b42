"""Matrix products of few rows generated as sum reductions over K (``lowering/matmuls.py``,
``_row_product``, on where ``config.row_products`` >= the rows): a decode step's products, with
their casts and epilogues in the reduction's kernel. Each result is compared with a float64
reference, and with eager's own distance from it in bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import assert_same, compile_fn, kernel_count


def _linear_silu_residual(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return F.silu(F.linear(x, w, b)) + r


def _compiled(fn, *args, rows: int = 2):
    fusebackend.metrics.reset()
    with fusebackend.config.patch(row_products=rows, graph_cache=False):
        torch._dynamo.reset()
        return compile_fn(fn)(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m, k, n", [(1, 64, 48), (2, 37, 19), (1, 130, 300)], ids=["square", "odd", "long"])
def test_a_product_of_few_rows_is_one_kernel_with_its_epilogue(m: int, k: int, n: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    args = [torch.randn(m, k), torch.randn(n, k) / k**0.5, torch.randn(n), torch.randn(m, n)]
    args = [a.to(dtype) for a in args]
    out = _compiled(_linear_silu_residual, *args)
    reference = _linear_silu_residual(*[a.double() for a in args])
    eager = _linear_silu_residual(*args)
    limit = 1e-5 if dtype == torch.float32 else 2 * float((eager.double() - reference).abs().max()) + 1e-2
    assert float((out.double() - reference).abs().max()) <= limit
    assert kernel_count() == 1 and not fusebackend.metrics.fallbacks, fusebackend.last_compiled().schedule
    assert "fused_red" in next(iter(fusebackend.last_compiled().kernels.values()))


def test_a_strided_input_and_a_weight_read_along_k() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 40)[::2]  # two rows, 80 elements apart
    w = torch.randn(24, 40).t()  # [K, N], K contiguous (a Linear's weight)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).tanh()

    assert_same(_compiled(fn, x, w), fn(x, w), atol=1e-5, rtol=1e-5)
    assert kernel_count() == 1 and not fusebackend.metrics.fallbacks


def test_a_weight_read_across_its_rows_stays_with_the_library() -> None:
    """[K, N] with N contiguous: each output's reduction would read a column; not the measured case."""
    torch.manual_seed(0)
    x, w = torch.randn(1, 40), torch.randn(40, 24)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).tanh()

    assert_same(_compiled(fn, x, w), fn(x, w), atol=1e-5, rtol=1e-5)
    assert fusebackend.metrics.fallbacks.get("mm", 0) == 1


def test_more_rows_than_the_setting_stay_with_the_library() -> None:
    torch.manual_seed(0)
    args = [torch.randn(3, 16), torch.randn(8, 16), torch.randn(8), torch.randn(3, 8)]
    assert_same(_compiled(_linear_silu_residual, *args, rows=2), _linear_silu_residual(*args), atol=1e-5, rtol=1e-5)
    assert fusebackend.metrics.fallbacks.get("addmm", 0) == 1
    assert_same(_compiled(_linear_silu_residual, *args, rows=0), _linear_silu_residual(*args), atol=1e-5, rtol=1e-5)
    assert fusebackend.metrics.fallbacks.get("addmm", 0) == 1


def test_a_decode_step_generates_its_products() -> None:
    pytest.importorskip("transformers")
    from benchmarks import generate

    model = generate.build("llama", "tiny", torch.device("cpu"), torch.float32)
    ids = generate.prompt(model, 1, 6, torch.device("cpu"))
    with torch.no_grad():
        expected = generate.Lean(model, None, None).generate(ids, 3)
        fusebackend.metrics.reset()
        torch._dynamo.reset()
        with fusebackend.config.patch(row_products=1, graph_cache=False):
            tokens = generate.Lean(model, fusebackend.fuse, None).generate(ids, 3)
    assert torch.equal(tokens, expected)
    decode = fusebackend.history()[-1]
    assert "aten.mm" not in decode.schedule and "aten.addmm" not in decode.schedule, decode.schedule


@pytest.mark.parametrize("bias_size", [6, 1], ids=["row", "one-value"])
def test_addmm_scales_and_a_broadcast_bias(bias_size: int) -> None:
    torch.manual_seed(0)
    x, w, bias = torch.randn(1, 5), torch.randn(6, 5).t(), torch.randn(bias_size)

    def fn(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, x, w, beta=0.5, alpha=2.0)

    assert_same(_compiled(fn, x, w, bias, rows=1), fn(x, w, bias), atol=1e-5, rtol=1e-5)
    assert kernel_count() == 1 and not fusebackend.metrics.fallbacks
