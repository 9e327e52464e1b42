"""``torch.cat`` (and ``stack``, which decomposes to it) as a pointwise node: each output element
is read, with a masked load, from the one input its position falls in, so a concatenation fuses
with what reads it instead of being an ATen copy. Every test compares with eager."""

from __future__ import annotations

import pytest
import torch

import fusebackend
from helpers import check, check_lowered, kernel_count, kernels


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_cat_of_three_inputs(dim: int, dtype: torch.dtype) -> None:
    shapes = {0: [(2, 5, 3), (7, 5, 3), (1, 5, 3)], 1: [(4, 1, 3), (4, 6, 3), (4, 2, 3)],
              -1: [(4, 5, 9), (4, 5, 1), (4, 5, 4)]}[dim]

    def make(shape: tuple[int, ...]) -> torch.Tensor:
        if dtype == torch.bool:
            return torch.rand(shape) > 0.5
        if dtype == torch.int64:
            return torch.randint(-100, 100, shape)
        return torch.randn(shape).to(dtype)

    check_lowered(lambda a, b, c: torch.cat([a, b, c], dim), *(make(s) for s in shapes))
    assert kernel_count() == 1


def test_cat_fuses_with_its_reader_and_reads_each_element_once() -> None:
    a, b = torch.randn(6, 5), torch.randn(6, 3)
    check_lowered(lambda a, b: torch.relu(torch.cat([a, b], 1)) * 2, a, b)
    assert kernel_count() == 1
    (source,) = kernels().values()
    loads = [line for line in source.splitlines() if "tl.load(" in line]
    assert len(loads) == 2 and all("other=0" in line for line in loads)  # masked: one input per element
    report = fusebackend.last_compiled().schedule
    assert "read 192 B" in report  # (30 + 18) fp32 elements, each read once


def test_stack_then_permute_is_one_kernel() -> None:
    # the backward of unbind in attention: stack the three gradients, then the qkv layout
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    check_lowered(lambda q, k, v: torch.stack([q, k, v], 0).permute(1, 3, 0, 2, 4).contiguous(), q, k, v)
    assert kernel_count() == 1


def test_non_contiguous_inputs_and_promotion() -> None:
    a = torch.randn(5, 8).t()  # 8 x 5, transposed
    b = torch.randint(0, 10, (8, 3))
    check_lowered(lambda a, b: torch.cat([a, b], 1), a, b)


def test_signed_zero_and_nan_survive() -> None:
    a = torch.tensor([1.0, -0.0, float("nan")])
    b = torch.tensor([-0.0, float("-inf"), 2.0])
    out = check_lowered(lambda a, b: torch.cat([a, b]), a, b)
    assert torch.equal(torch.signbit(out), torch.signbit(torch.cat([a, b])))


def test_legacy_empty_input_is_skipped() -> None:
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    check(lambda a, e, b: torch.cat([a, e, b]), a, torch.empty(0), b)


def test_cat_of_computed_inputs_stores_them_first() -> None:
    # a concatenation reads its inputs from memory: producers in the graph are stored first
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    check_lowered(lambda a, b: torch.cat([a * 2, b + 1], 0).sum(0), a, b)
    assert "must be in memory" in fusebackend.last_compiled().schedule


def test_stack_with_a_transposed_input_is_tiled() -> None:
    # k arrives transposed (contiguous along the sequence): the fused kernel is tiled so that k is
    # read along its contiguous dim and q, v and the output along theirs
    q, v = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    k = torch.randn(2, 4, 16, 8).transpose(-1, -2)
    check_lowered(lambda q, k, v: torch.stack([q, k, v], 0).permute(1, 3, 0, 2, 4).contiguous(), q, k, v)
    assert kernel_count() == 1
    (source,) = kernels().values()
    assert "# tiled: 8 (y) by 192 (x)" in source
    k_load = next(line for line in source.splitlines() if "in_ptr1 +" in line)
    assert "(y_index + " in k_load  # k's elements one apart along y
