"""The benchmark harness's output check (``benchmarks/check.py``): a wrong output must fail it."""

from __future__ import annotations

import pytest
import torch

from benchmarks.check import Mismatch, compare


def test_fp32_output_is_held_to_fp32_tolerance() -> None:
    expected = torch.randn(1000)
    compare(expected * (1 + 1e-6), expected)
    with pytest.raises(Mismatch, match="output 0"):
        compare(expected * (1 + 1e-3), expected)


def test_precision_loosens_to_the_compute_dtype_and_never_tightens() -> None:
    # a bf16 model's fp32 loss: bf16 rounding is expected, a wrong value is not
    expected = torch.randn(1000)
    compare(expected * (1 + 1e-3), expected, precision=torch.bfloat16)
    with pytest.raises(Mismatch):
        compare(expected * 1.5, expected, precision=torch.bfloat16)
    half = torch.randn(1000, dtype=torch.bfloat16)
    compare((half.float() * (1 + 5e-3)).bfloat16(), half, precision=torch.float32)


def test_structure_and_nan_mismatches_fail() -> None:
    x = torch.randn(10)
    with pytest.raises(Mismatch, match="output tensors"):
        compare((x, x), (x,))
    y = x.clone()
    y[3] = float("nan")
    with pytest.raises(Mismatch, match="NaN"):
        compare(y, x)
