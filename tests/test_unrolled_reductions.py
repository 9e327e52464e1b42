"""Reductions over a few positions (``lowering.unrolled``) are pointwise nodes, each
position loaded and combined in order, fused as any pointwise node; not where a reader takes the
result broadcast over the positions it reduced.

The case that asked for it is the split attention of ResNeSt and its kin: a conv's output of
``radix * C`` channels viewed as ``[B, radix, C, H, W]`` and summed over the radix, once for the
attention's mean and once, weighted, for the output. As reductions their rows of 2 ran in blocks
of one pixel's channels; unrolled, they are pointwise kernels, and the batch norm before them is
recomputed in both readers, not stored (``recompute._pins``: an unrolled read evaluates each
element once).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusebackend
from fusebackend import config
from helpers import check, kernel_count, kernels

f32, bf16 = torch.float32, torch.bfloat16
TOL = {f32: {}, bf16: {"atol": 3e-2, "rtol": 3e-2}}


def _no_fallbacks() -> None:
    assert not fusebackend.metrics.fallbacks, dict(fusebackend.metrics.fallbacks)


@pytest.mark.parametrize("dtype", [f32, bf16])
@pytest.mark.parametrize("shape, channels_last", [((2, 8, 5, 3), True), ((3, 6, 4, 4), False), ((1, 34, 1, 7), True)])
def test_a_sum_over_two_radix_splits_is_a_pointwise_kernel(dtype: torch.dtype, shape: tuple[int, ...],
                                                           channels_last: bool) -> None:
    x = torch.randn(shape, dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)

    def fn(x: torch.Tensor) -> torch.Tensor:
        b, rc, h, w = x.shape
        return torch.relu(x.reshape(b, 2, rc // 2, h, w).sum(dim=1)) * 0.5

    check(fn, x, **TOL[dtype])
    _no_fallbacks()
    assert kernel_count() == 1, fusebackend.last_compiled().schedule
    (name, source), = kernels().items()
    assert name.startswith("fused_pw"), name
    assert "tl.reduce" not in source and "tl.sum" not in source
    assert source.count("tl.load(") == 2  # one load a radix split


@pytest.mark.parametrize("kind", ["amax", "amin", "prod", "sum"])
def test_each_combine_over_three_positions_is_pointwise_and_propagates_nan(kind: str) -> None:
    x = torch.randn(4, 3, 5) + 1.5
    x[1, 2, 3] = float("nan")
    x[2, 0, 0] = -float("inf")
    x = x.transpose(0, 2)  # (5, 3, 4), reduced over the middle dim, non-contiguous

    def fn(x: torch.Tensor) -> torch.Tensor:
        return getattr(torch, kind)(x, dim=1) + 1.0 if kind != "prod" else torch.prod(x, dim=1) + 1.0

    out = check(fn, x)
    assert torch.isnan(out).sum() == 1
    assert kernel_count() == 1 and next(iter(kernels())).startswith("fused_pw"), fusebackend.last_compiled().schedule


def test_integer_sum_and_boolean_any_over_few_positions() -> None:
    ints = torch.randint(-1000, 1000, (7, 4, 2), dtype=torch.int32)
    flags = torch.rand(7, 4, 3) > 0.8

    def fn(ints: torch.Tensor, flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ints.sum(dim=(1, 2)), flags.any(dim=2)

    total, anyof = check(fn, ints, flags)
    assert total.dtype == torch.int64
    assert all(name.startswith("fused_pw") for name in kernels()), list(kernels())


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_a_mean_over_two_dims_of_eight_positions_is_unrolled(dtype: torch.dtype) -> None:
    x = torch.randn(6, 4, 2, 5, dtype=dtype).permute(0, 3, 1, 2)  # (6, 5, 4, 2): reduce dims 2, 3

    def eight(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))

    check(eight, x, **TOL[dtype])
    assert config.unrolled_reduction == 8
    source = next(iter(kernels().values()))
    assert "tl.reduce" not in source and source.count("tl.load(") == 8


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_a_mean_over_nine_positions_stays_a_reduction(dtype: torch.dtype) -> None:
    y = torch.randn(6, 5, 9, dtype=dtype)
    check(lambda y: y.mean(dim=2), y, **TOL[dtype])
    assert any("tl.reduce" in s or "tl.sum" in s for s in kernels().values()), list(kernels())


def test_a_whole_tensor_of_few_elements_stays_a_reduction() -> None:
    x = torch.randn(2, 3)
    check(lambda x: x.sum() * 2, x)
    assert any("tl.reduce" in s for s in kernels().values()), list(kernels())


class SplitAttention(nn.Module):
    """ResNeSt's split attention (as timm's ``SplitAttn``), radix 2, after a grouped conv."""

    def __init__(self, cin: int = 8, c: int = 8, radix: int = 2) -> None:
        super().__init__()
        self.radix = radix
        self.conv = nn.Conv2d(cin, c * radix, 3, padding=1, groups=radix, bias=False)
        self.bn0 = nn.BatchNorm2d(c * radix)
        self.fc1 = nn.Conv2d(c, 4, 1)
        self.bn1 = nn.BatchNorm2d(4)
        self.fc2 = nn.Conv2d(4, c * radix, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn0(self.conv(x)))
        b, rc, h, w = x.shape
        x = x.reshape(b, self.radix, rc // self.radix, h, w)
        gap = x.sum(dim=1).mean((2, 3), keepdim=True)
        attn = self.fc2(F.relu(self.bn1(self.fc1(gap))))
        attn = F.softmax(attn.view(b, 1, self.radix, -1).transpose(1, 2), dim=1).reshape(b, -1, 1, 1)
        return (x * attn.reshape(b, self.radix, rc // self.radix, 1, 1)).sum(dim=1)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_split_attention_reads_the_conv_output_twice_and_stores_no_radix_sum(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = SplitAttention().eval().to(dtype)
    with torch.no_grad():
        for bn in (model.bn0, model.bn1):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, 5, 6, dtype=dtype).to(memory_format=torch.channels_last)
    with torch.no_grad():
        check(model, x, **TOL[dtype])
    assert set(fusebackend.metrics.fallbacks) <= {"convolution"}, dict(fusebackend.metrics.fallbacks)
    compiled = fusebackend.last_compiled()
    schedule = compiled.schedule
    assert "recomputed in each reader" in schedule and "aten.relu.default" in schedule, schedule
    # the conv's output is read by the mean's kernel and by the output's, and nothing of the
    # radix sum's size is written but the output: no stored batch norm, no stored radix sum.
    # The softmax over the radix stays a reduction (its max and sum are read back broadcast):
    # the mean's kernel, fc1's, fc2's, the softmax's and the output's.
    assert compiled.kernel_count == 5, schedule
    out_bytes = 2 * 8 * 5 * 6 * dtype.itemsize
    written = sum(_kib(line.split("write ")[1].split("|")[0]) for line in schedule.splitlines()
                  if line.strip().startswith("kernel "))
    assert out_bytes <= written < out_bytes + 512, schedule


def _kib(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"B": 1, "KiB": 1024, "MiB": 1 << 20}[unit]


def test_statistics_read_back_by_each_position_stay_a_reduction_with_its_epilogue() -> None:
    # a batch norm in training over 2 x 2 x 2 = 8 positions a channel: its mean and variance are
    # read back at each position, so they stay a reduction whose kernel normalizes the output
    x = torch.randn(2, 6, 2, 2)
    check(lambda x: F.batch_norm(x, None, None, training=True) * 2, x)
    ks = kernels()
    assert kernel_count() == 1 and "tl.reduce" in next(iter(ks.values())), (list(ks), fusebackend.last_compiled().schedule)
