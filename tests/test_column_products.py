"""Matrix products of one column (a matrix times a vector: mm, addmm, bmm) generated as sum
reductions over K (``lowering/matmuls.py``, ``_column_product``), fused with what makes and
reads them. Each result is compared with a float64 reference, and with eager's own distance
from it in bf16."""

from __future__ import annotations

import pytest
import torch

import fusebackend
from helpers import compile_fn, kernel_count

bf16 = torch.bfloat16


def _compiled(fn, *args, on: bool = True):
    fusebackend.metrics.reset()
    with fusebackend.config.patch(column_products=on, graph_cache=False):
        torch._dynamo.reset()
        return compile_fn(fn)(*args)


def _close(fn, out: torch.Tensor, args: tuple[torch.Tensor, ...]) -> None:
    reference = fn(*[a.double() if a.is_floating_point() else a for a in args])
    eager = fn(*args)
    low = any(a.dtype == bf16 for a in args) or eager.dtype == bf16
    limit = 2 * float((eager.double() - reference).abs().max()) + 1e-2 if low else 1e-5
    assert float((out.double() - reference).abs().max()) <= limit


def _scan(dA: torch.Tensor, dBu: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """A selective scan as transformers' Mamba writes it without its CUDA kernels: per position,
    the state's update and its product with that position's projection (a bmm of one column)."""
    state = torch.zeros_like(dA[:, :, 0])
    outs = []
    for i in range(dA.shape[2]):
        state = dA[:, :, i] * state + dBu[:, :, i]
        outs.append(torch.matmul(state.to(C.dtype), C[:, i].unsqueeze(-1))[:, :, 0])
    return torch.stack(outs, -1)


@pytest.mark.parametrize("b, d, n, steps", [(2, 24, 8, 4), (1, 5, 3, 3), (3, 1, 1, 2)], ids=["even", "odd", "tiny"])
def test_a_scans_products_fuse_with_its_state(b: int, d: int, n: int, steps: int) -> None:
    torch.manual_seed(0)
    dA, dBu = torch.rand(b, d, steps, n) * 0.9, torch.randn(b, d, steps, n)
    C = torch.randn(b, steps, n, dtype=bf16)
    out = _compiled(_scan, dA, dBu, C)
    _close(_scan, out, (dA, dBu, C))
    assert not fusebackend.metrics.fallbacks, fusebackend.metrics.fallbacks
    assert kernel_count() <= steps, fusebackend.last_compiled().schedule
    sources = list(fusebackend.last_compiled().kernels.values())
    assert any(src.count("th.reduce_sum") == steps for src in sources)  # every position's product
    _compiled(_scan, dA, dBu, C, on=False)
    assert fusebackend.metrics.fallbacks.get("bmm", 0) == steps  # the library's, one a position


@pytest.mark.parametrize("dtype", [torch.float32, bf16], ids=["fp32", "bf16"])
def test_a_linear_of_one_output_and_addmm_with_a_bias(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x, w, bias = torch.randn(33, 20, dtype=dtype), torch.randn(1, 20, dtype=dtype), torch.randn(1, dtype=dtype)

    def head(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.nn.functional.linear(torch.relu(x), w, bias))

    def scaled(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, x, w.t(), beta=0.5, alpha=2.0)

    for fn in (head, scaled):
        out = _compiled(fn, x, w, bias)
        _close(fn, out, (x, w, bias))
        assert fusebackend.last_compiled().kernel_count == 1 and not fusebackend.metrics.fallbacks


def test_strided_batches_and_a_matrix_read_across_k() -> None:
    torch.manual_seed(0)
    a = torch.randn(6, 7, 12)[::2]  # batches 2 apart, K contiguous: generated
    v = torch.randn(3, 12, 1)

    def bmm(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, v) * 3

    _close(bmm, _compiled(bmm, a, v), (a, v))
    assert not fusebackend.metrics.fallbacks
    across = torch.randn(3, 12, 7).transpose(1, 2)  # K across the rows: left to the library
    _close(bmm, _compiled(bmm, across, v), (across, v))
    assert fusebackend.metrics.fallbacks.get("bmm", 0) == 1
    wide = torch.randn(3, 12, 2)  # two columns: the library's
    _close(bmm, _compiled(bmm, a, wide), (a, wide))
    assert fusebackend.metrics.fallbacks.get("bmm", 0) == 1


def test_a_scans_gradients_match_float64() -> None:
    torch.manual_seed(0)
    dA = (torch.rand(2, 6, 3, 4) * 0.9).requires_grad_()
    dBu, C = torch.randn(2, 6, 3, 4, requires_grad=True), torch.randn(2, 3, 4, requires_grad=True)
    grads = torch.autograd.grad(_compiled(_scan, dA, dBu, C).square().sum(), (dA, dBu, C))
    leaves = [t.detach().double().requires_grad_() for t in (dA, dBu, C)]
    expected = torch.autograd.grad(_scan(*leaves).square().sum(), leaves)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("columns", [1, 6], ids=["one column", "six"])
def test_a_batched_product_over_symbolic_sizes_compiles_once(columns: int) -> None:
    # bmm's lowering declines symbolic sizes (the library's call, as traced): the graph is still
    # compiled once for every size under FUSE_SYMBOLIC=auto, not once per shape
    def fn(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, v).relu()

    fusebackend.metrics.reset()
    with fusebackend.config.patch(symbolic="auto", graph_cache=False):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="fuse", dynamic=True)
        for n in (5, 7, 9):
            a, v = torch.randn(3, n, 8), torch.randn(3, 8, columns)
            torch.testing.assert_close(compiled(a, v), fn(a, v))
    assert fusebackend.metrics.graphs_compiled == 1 and not fusebackend.metrics.not_symbolic
    assert fusebackend.metrics.eager_graphs == 0
