"""Matrix products with unaligned output rows, padded (``lowering/matmuls.py``).

On a GPU (``FUSE_PAD_MM=auto``) large half-precision products whose output columns are not a
multiple of 16 bytes are padded; here ``pad_mm="always"`` turns the same rewrite on for the
CPU's float32. Each test compares with eager and asserts what the wrapper hands the ATen call,
how many kernels the graph becomes, and the layout of the user's outputs: a padded product
returned as it is keeps its padded rows, as Inductor's does; anything else keeps eager's layout.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusebackend
from fusebackend.lowering.matmuls import padded_columns
from helpers import assert_same, compile_fn, kernel_count


def wrapper_source() -> str:
    return "\n".join(a.wrapper for a in fusebackend.history())


def ir_text() -> str:
    return "\n".join(a.ir for a in fusebackend.history())


def test_a_language_model_head_is_padded_and_read_through_its_view() -> None:
    """logits = h @ W.t() + b with 30 columns: W and b padded to 32, the product into a [M, 32]
    buffer, the scaled logits read from its first 30 columns by one kernel."""
    torch.manual_seed(0)
    h, w, bias = torch.randn(6, 16), torch.randn(30, 16), torch.randn(30)
    fn = lambda h: torch.nn.functional.linear(h, w, bias) * 2  # noqa: E731
    with fusebackend.config.patch(pad_mm="always"):
        out = compile_fn(fn)(h)
    assert_same(out, fn(h))
    assert out.stride() == (30, 1)
    source = wrapper_source()
    assert "aten_addmm(" in source
    assert ir_text().count("aligned columns for a matrix product") == 2  # the weight and the bias
    assert "f32[6, 32] strides [32, 1] = extern aten.addmm.default" in ir_text()
    assert kernel_count() == 3  # pad W, pad b, the scale (reading the view, writing [6, 30])
    assert fusebackend.metrics.eager_graphs == 0


@pytest.mark.parametrize("transposed", [False, True], ids=["row_major", "transposed"])
def test_mm_output_returned_directly_keeps_its_padded_rows(transposed: bool) -> None:
    """Returned as Inductor returns it: eager's order of dims, rows 16 elements apart, no copy."""
    torch.manual_seed(0)
    a = torch.randn(5, 8)
    b = torch.randn(13, 8).t() if transposed else torch.randn(8, 13)
    fn = lambda a, b: a @ b  # noqa: E731
    with fusebackend.config.patch(pad_mm="always"):
        out = compile_fn(fn)(a, b)
    assert_same(out, fn(a, b))
    assert out.stride() == (16, 1)
    assert "f32[5, 16] strides [16, 1] = extern aten.mm.default" in ir_text()
    assert "an output in eager's layout" not in ir_text()
    assert kernel_count() == 1  # the padding of b; nothing after the product


def test_a_language_model_heads_logits_are_returned_without_a_copy() -> None:
    """h [B, S, K] through a linear layer with 30 outputs: the logits are the padded product's
    view, [B, S, 30] with rows 32 apart; merging B and S (as a loss does) needs no copy."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 30)
    h = torch.randn(3, 7, 16)
    with fusebackend.config.patch(pad_mm="always"):
        out = compile_fn(head)(h)
    expected = head(h)
    assert_same(out, expected)
    assert out.stride() == (7 * 32, 32, 1)
    assert out.view(-1, 30).stride() == (32, 1)
    assert "an output in eager's layout" not in ir_text()
    assert kernel_count() == 2  # the padded weight and bias


def test_a_padded_product_permuted_before_it_is_returned_is_copied_into_eagers_layout() -> None:
    """(a @ b).t() + 0 is a new tensor: eager lays it out [13, 5] contiguous, an order the
    product's rows do not have, so the kernel writes eager's layout."""
    torch.manual_seed(0)
    a, b = torch.randn(5, 8), torch.randn(8, 13)
    fn = lambda a, b: (a @ b).t().contiguous()  # noqa: E731
    with fusebackend.config.patch(pad_mm="always"):
        out = compile_fn(fn)(a, b)
    assert_same(out, fn(a, b))
    assert out.is_contiguous()


def assert_grads_as(module: torch.nn.Module, expected: list[torch.Tensor]) -> None:
    """Each parameter's gradient equals eager's, in eager's layout."""
    for p, g in zip(module.parameters(), expected):
        assert_same(p.grad, g)
        assert p.grad.stride() == g.stride()


def test_training_through_a_padded_head() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 30)
    x = torch.randn(4, 16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)

    def loss(x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(head(x), -1).sum()

    expected = loss(x_ref)
    expected.backward()
    grads_ref = [p.grad.clone() for p in head.parameters()]
    head.zero_grad()
    with fusebackend.config.patch(pad_mm="always"):
        actual = compile_fn(loss)(x)
        actual.backward()
    assert_same(actual, expected)
    assert_same(x.grad, x_ref.grad)
    assert_grads_as(head, grads_ref)


def test_training_with_the_padded_logits_returned() -> None:
    """The logits leave the graph with padded rows; eager's loss reads them and its gradient,
    contiguous, comes back into the backward graph."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 30)
    h = torch.randn(3, 7, 16, requires_grad=True)
    h_ref = h.detach().clone().requires_grad_(True)
    target = torch.randint(0, 30, (21,))
    expected = torch.nn.functional.cross_entropy(head(h_ref).view(-1, 30), target)
    expected.backward()
    grads_ref = [p.grad.clone() for p in head.parameters()]
    head.zero_grad()
    with fusebackend.config.patch(pad_mm="always"):
        logits = compile_fn(head)(h)
        assert logits.stride() == (7 * 32, 32, 1)
        actual = torch.nn.functional.cross_entropy(logits.view(-1, 30), target)
        actual.backward()
    assert_same(actual, expected)
    assert_same(h.grad, h_ref.grad)
    assert_grads_as(head, grads_ref)
    assert fusebackend.metrics.eager_graphs == 0


def test_aligned_or_small_products_are_left_alone() -> None:
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    with fusebackend.config.patch(pad_mm="auto"):
        assert padded_columns(cuda, bf16, 8192, 768, 30522) == 30528  # BERT's head
        assert padded_columns(cuda, bf16, 4096, 768, 50257) == 50264  # GPT-2's
        assert padded_columns(cuda, bf16, 8192, 768, 30528) is None   # aligned already
        assert padded_columns(cuda, bf16, 64, 768, 2) is None         # a tiny classifier
        assert padded_columns(torch.device("cpu"), bf16, 8192, 768, 30522) is None
        assert padded_columns(cuda, torch.float32, 8192, 768, 30522) is None
    with fusebackend.config.patch(pad_mm="never"):
        assert padded_columns(cuda, bf16, 8192, 768, 30522) is None
    with fusebackend.config.patch(pad_mm="always"):
        assert padded_columns(torch.device("cpu"), torch.float32, 2, 3, 5) == 8
    torch.manual_seed(0)
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    with fusebackend.config.patch(pad_mm="always"):
        assert_same(compile_fn(lambda a, b: a @ b)(a, b), a @ b)
    assert "aligned columns" not in ir_text() and "f32[4, 16] strides [16, 1] = extern aten.mm.default" in ir_text()


def test_a_badly_aligned_reduction_dim_is_padded_with_zeros_in_both_matrices() -> None:
    """The gradients of a language model's head: g [M, V] @ W [V, H] reduces over V, and
    g.t() @ h reads g's rows as columns, V apart. g is padded once, to [8, 32] with zero columns;
    the first product reads all of it against W with zero rows up to 32, the second its first
    30 columns, transposed (columns 32 apart: aligned)."""
    torch.manual_seed(0)
    g, w, h = torch.randn(8, 30), torch.randn(30, 16), torch.randn(8, 16)
    fn = lambda g, w, h: (g @ w, g.t() @ h)  # noqa: E731
    with fusebackend.config.patch(pad_mm="always"):
        out = compile_fn(fn)(g, w, h)
    assert_same(out, fn(g, w, h))
    text = ir_text()
    assert text.count("zeros along K for a matrix product") == 2  # g and W, each once
    assert "aligned rows" not in text  # g.t() is a view of g's padded copy
    source = wrapper_source()
    assert re.search(r"aten_mm\(buf\d+, buf\d+\)", source)  # [8, 32] x [32, 16]
    assert re.search(r"aten_mm\(view\(buf\d+, \(30, 8\), \(1, 32\), 0\), arg2\)", source), source
    assert kernel_count() == 2
    assert fusebackend.metrics.eager_graphs == 0


def test_a_badly_aligned_row_stride_alone_is_aligned_by_a_copy() -> None:
    """x.t() @ y, x [8, 30]: K (8) and N (16) are aligned, but x.t()'s columns start 30
    elements apart. The product reads a copy of x with rows 32 apart, transposed."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 30), torch.randn(8, 16)
    fn = lambda x, y: x.t() @ y  # noqa: E731
    with fusebackend.config.patch(pad_mm="always"):
        out = compile_fn(fn)(x, y)
    assert_same(out, fn(x, y))
    assert ir_text().count("aligned rows for a matrix product") == 1
    assert re.search(r"aten_mm\(view\(buf\d+, \(30, 8\), \(1, 32\), 0\), arg1\)", wrapper_source())
    assert out.stride() == (16, 1)
