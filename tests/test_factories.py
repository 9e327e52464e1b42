"""Factories (``full``, ``arange``, ``*_like``) inside a compiled graph: lowered to constants and
index values that fuse with their readers. Every test compares with eager. Each factory names
its device: Dynamo does not apply the default device a GPU test run sets."""

from __future__ import annotations

import pytest
import torch

import fusebackend
from helpers import check, kernel_count


# ------------------------------------------------------------------ factories inside a graph


def test_full_inside_compiled_fn() -> None:
    x = torch.randn(4, 5)
    check(lambda x: x * torch.full((4, 5), 2.5, device=x.device)
          - torch.full((4, 5), 1.0, dtype=torch.float64, device=x.device), x)
    assert not fusebackend.metrics.fallbacks
    assert kernel_count() == 1


def test_full_broadcast_inside_compiled_fn() -> None:
    x = torch.randn(4, 5)
    check(lambda x: x * torch.full((5,), 2.5, device=x.device) + torch.full((4, 1), -1.0, device=x.device), x)
    assert not fusebackend.metrics.fallbacks


def test_full_int_and_bool() -> None:
    x = torch.randint(-5, 5, (9,))
    check(lambda x: (x + torch.full((9,), 7, dtype=torch.int64, device=x.device),
                     torch.full((9,), True, device=x.device) & (x > 0)), x)
    assert not fusebackend.metrics.fallbacks


@pytest.mark.parametrize("args", [(10,), (2, 12), (1, 8, 3), (0.5, 3.0, 0.25)], ids=str)
def test_arange_inside_compiled_fn(args: tuple) -> None:
    n = len(torch.arange(*args))
    x = torch.randn(n)
    check(lambda x: x + torch.arange(*args, device=x.device) * 2, x)
    assert not fusebackend.metrics.fallbacks


def test_arange_broadcast_mask() -> None:
    x = torch.randn(6, 6)
    check(lambda x: torch.where(torch.arange(6, device=x.device)[:, None] >= torch.arange(6, device=x.device),
                                x, 0.0), x)


@pytest.mark.parametrize("factory", [torch.ones_like, torch.zeros_like, lambda x: torch.full_like(x, 3.0)],
                         ids=["ones_like", "zeros_like", "full_like"])
def test_like_factories_inside_compiled_fn(factory: Callable[[torch.Tensor], torch.Tensor]) -> None:
    x = torch.randn(3, 7).t()
    out = check(lambda x: factory(x) * 2 + x, x)
    assert out.stride() == (factory(x) * 2 + x).stride()
    assert kernel_count() >= 1
