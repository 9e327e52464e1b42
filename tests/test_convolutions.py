"""Convolutions as kernels of ours (``lowering/convolutions.py``): depthwise windows and products
over one position; and the scheduler rules they brought (``cost_model.window_recompute``): a
producer is not recomputed at every position of a window where that costs more arithmetic than
the bytes it saves, and a wide window stays out of reduction kernels.

Every test compares with eager on fresh random inputs; the fusion tests assert the kernel count,
the ATen calls left and what the generated source or the schedule report says.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusebackend
from fusebackend.lowering import convolutions
from helpers import assert_same, check, check_lowered, compile_fn, kernel_count, kernels

DTYPES = [torch.float32, torch.bfloat16]


def fallbacks() -> dict[str, int]:
    return dict(fusebackend.metrics.fallbacks)


def _conv_args(sizes: tuple[int, ...], wsizes: tuple[int, ...], with_bias: bool,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A convolution's input, weight and (or not) bias, fresh random values."""
    torch.manual_seed(0)
    x, w = torch.randn(sizes, dtype=dtype), torch.randn(wsizes, dtype=dtype)
    return x, w, torch.randn(wsizes[0], dtype=dtype) if with_bias else None


def _gradients_as_close_as_eagers(make: Callable[[], nn.Module], x: torch.Tensor,
                                  **patch: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Train a compiled ``make()`` one step on ``x`` beside an eager copy and a float64 copy:
    every gradient (the input's too) is within 4x eager's distance from float64's, plus 1e-5.
    The (compiled, eager) gradients, the parameters' then the input's."""
    torch.manual_seed(0)
    block = make()
    eager, reference = make(), make().double()
    eager.load_state_dict(block.state_dict())
    reference.load_state_dict(block.state_dict())
    xs = [x.clone().requires_grad_() for _ in range(2)] + [x.double().requires_grad_()]
    with fusebackend.config.patch(**patch):
        compile_fn(block)(xs[0]).square().sum().backward()
    eager(xs[1]).square().sum().backward()
    reference(xs[2]).square().sum().backward()
    triples = [(p.grad, e.grad, r.grad) for p, e, r in zip(block.parameters(), eager.parameters(), reference.parameters())]
    for ours, theirs, exact in triples + [(xs[0].grad, xs[1].grad, xs[2].grad)]:
        eager_error = (theirs.double() - exact).abs().max().item()
        error = (ours.double() - exact).abs().max().item()
        assert error <= 4 * eager_error + 1e-5, (error, eager_error)
    assert fusebackend.metrics.eager_graphs == 0
    return [(ours, theirs) for ours, theirs, _ in triples] + [(xs[0].grad, xs[1].grad)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    # (input sizes, weight sizes, stride, padding, dilation, bias)
    ((2, 6, 9, 11), (6, 1, 3, 3), 1, 1, 1, True),
    ((2, 6, 9, 11), (6, 1, 3, 3), 2, 2, 2, False),
    ((2, 6, 9, 11), (12, 1, 5, 3), (2, 1), (2, 0), 1, True),  # two output channels per input channel
    ((1, 4, 1, 1), (4, 1, 3, 3), 1, 1, 1, True),  # a 1x1 image: every position but the centre is padding
    ((3, 5, 6, 7), (5, 1, 5, 5), 1, 0, 1, False),  # no padding: the windows fit
    ((2, 4, 10), (4, 1, 3), 1, 1, 1, True),  # 1-d
], ids=["3x3", "strided-dilated", "multiplier2", "1x1-image", "5x5-valid", "1d"])
def test_depthwise_convolution_is_one_kernel(case: tuple[Any, ...], dtype: torch.dtype) -> None:
    sizes, wsizes, stride, padding, dilation, with_bias = case
    x, w, b = _conv_args(sizes, wsizes, with_bias, dtype)
    conv = F.conv1d if len(sizes) == 3 else F.conv2d

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return torch.relu(conv(x, w, b, stride, padding, dilation, groups=sizes[1]))

    check_lowered(fn, x, w, b)
    assert kernel_count() == 1  # the convolution, its bias and the ReLU
    (name,) = kernels()
    assert "convolution" in name


def test_depthwise_convolution_of_a_non_contiguous_input() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 11, 9).transpose(2, 3)
    w, b = torch.randn(6, 1, 3, 3), torch.randn(6)
    check_lowered(lambda x: F.conv2d(x, w, b, padding=1, groups=6), x)


@pytest.mark.parametrize("channels, columns", [(16, 16), (24, 8)])
def test_channels_last_depthwise_convolution_is_tiled(channels: int, columns: int) -> None:
    """As on a GPU: channels-last, its index arithmetic once per row of a block and its
    weights once per column (``codegen/pointwise.column_tile``). A window takes blocks of 8
    columns where no wider block divides the channels (MobileNetV3's 72, 120, 184, 200)."""
    torch.manual_seed(0)
    x = torch.randn(4, channels, 6, 6).contiguous(memory_format=torch.channels_last)
    w = torch.randn(channels, 1, 3, 3)
    with fusebackend.config.patch(conv_layout="channels_last"):
        out = check_lowered(lambda x: F.conv2d(x, w, None, padding=1, groups=channels) * 2, x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    (source,) = kernels().values()
    assert f"tiled: 144 rows (y) of {channels} columns (x)" in source
    assert f"x_tiles = {channels} // XBLOCK" in source
    assert fusebackend.last_compiled().wrapper.count(f"XBLOCK={columns},") == 1


def test_untileable_channels_last_depthwise_convolution_stays_cudnns() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 9, 11)
    w = torch.randn(6, 1, 3, 3)
    with fusebackend.config.patch(conv_layout="channels_last"):
        check(lambda x: F.conv2d(x, w, None, padding=1, groups=6), x)
    assert fallbacks() == {"convolution": 1}  # 6 channels: no block of 8 columns divides them


@pytest.mark.parametrize("why", ["grouped", "transposed", "7x7"])
def test_other_convolutions_stay_aten_calls(why: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 9, 9)
    if why == "grouped":
        w = torch.randn(8, 4, 3, 3)
        fn = lambda x: F.conv2d(x, w, padding=1, groups=2)  # noqa: E731
    elif why == "transposed":
        w = torch.randn(8, 1, 3, 3)
        fn = lambda x: F.conv_transpose2d(x, w, padding=1, groups=8)  # noqa: E731
    else:
        w = torch.randn(8, 1, 7, 7)  # slower than cuDNN's on an H100
        fn = lambda x: F.conv2d(x, w, padding=3, groups=8)  # noqa: E731
    check(fn, x)
    assert sum(fallbacks().values()) == 1


class SqueezeExcite(nn.Module):
    """A squeeze-and-excitation block as torchvision's MobileNetV3 has it."""

    def __init__(self, channels: int = 12, squeeze: int = 4) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        scale = F.hardsigmoid(self.fc2(F.relu(self.fc1(scale))))
        return x * scale


@pytest.mark.parametrize("dtype", DTYPES)
def test_squeeze_and_excitation_products_are_reductions(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    block = SqueezeExcite().to(dtype)
    x = torch.randn(3, 12, 5, 7, dtype=dtype)
    with torch.no_grad():
        check_lowered(block, x)
    # the mean; each product with its bias and activation; the scaling
    assert kernel_count() == 4
    products = [src for name, src in kernels().items() if "convolution" in name]
    assert len(products) == 2 and all("tl.reduce(" in src for src in products)


@pytest.mark.parametrize("limit, calls", [(3 * 12 * 4 - 1, 2), (3 * 12 * 4, 0)])
def test_a_large_product_over_one_position_stays_cublass(monkeypatch: pytest.MonkeyPatch, limit: int,
                                                         calls: int) -> None:
    monkeypatch.setattr(convolutions, "MAX_POINT_MACS", limit)  # both products are 3 x 12 x 4
    torch.manual_seed(0)
    block = SqueezeExcite()
    with torch.no_grad():
        check(block, torch.randn(3, 12, 5, 7))
    assert fallbacks() == ({"convolution": calls} if calls else {})


class InvertedResidual(nn.Module):
    """MobileNet's block: 1x1 expansion, batch norm, hard-swish, depthwise 3x3, batch norm,
    hard-swish, squeeze-and-excitation, 1x1 projection."""

    def __init__(self, c: int = 8, e: int = 16) -> None:
        super().__init__()
        self.expand, self.bn1 = nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e)
        self.dw, self.bn2 = nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e)
        self.se = SqueezeExcite(e, 8)
        self.project = nn.Conv2d(e, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.bn1(self.expand(x)))
        y = self.se(F.hardswish(self.bn2(self.dw(y))))
        return x + self.project(y)


def test_a_window_does_not_recompute_a_costly_producer_at_each_position() -> None:
    torch.manual_seed(0)
    block = InvertedResidual().eval()
    with torch.no_grad():
        check(block, torch.randn(2, 8, 6, 6))
    report = fusebackend.last_compiled().schedule
    # batch norm and hard-swish, about 50 operations an element, computed once, not 9 times
    assert "reads buf" in report and "at 9 positions" in report and "per byte saved (most 8)" in report
    # the depthwise convolution's kernel is not the squeeze-and-excitation mean's
    assert "a window stays out of reduction kernels" in report
    assert fallbacks() == {"convolution": 2}  # the expansion and the projection: cuDNN's


class PaddedInvertedResidual(InvertedResidual):
    """The same block padded as TensorFlow pads (transformers' MobileNetV2 and EfficientNet):
    a zero pad, then the depthwise convolution without padding of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.dw.padding = (0, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(F.hardswish(self.bn1(self.expand(x))), (1, 1, 1, 1))
        y = self.se(F.hardswish(self.bn2(self.dw(y))))
        return x + self.project(y)


def test_a_pad_between_a_producer_and_a_window_does_not_hide_the_producer() -> None:
    # the pad has a few more elements than the activation it pads: the activation's operations
    # vary with the pad's elements (cost_model._one_to_one), and are not recomputed at each tap
    torch.manual_seed(0)
    block = PaddedInvertedResidual().eval()
    with torch.no_grad():
        check(block, torch.randn(2, 8, 6, 6))
    report = fusebackend.last_compiled().schedule
    assert "at 9 positions" in report and "per byte saved (most 8)" in report, report


class GhostThenWindow(nn.Module):
    """timm's GhostNet bottleneck: a ghost module (a 1x1 convolution, then a 3x3 depthwise one
    over its output, the two concatenated), then a 5x5 depthwise convolution of stride 2."""

    def __init__(self, c: int = 8, half: int = 8) -> None:
        super().__init__()
        self.primary, self.bn1 = nn.Conv2d(c, half, 1, bias=False), nn.BatchNorm2d(half)
        self.cheap, self.bn2 = nn.Conv2d(half, half, 3, padding=1, groups=half, bias=False), nn.BatchNorm2d(half)
        self.dw, self.bn3 = nn.Conv2d(2 * half, 2 * half, 5, 2, 2, groups=2 * half, bias=False), nn.BatchNorm2d(2 * half)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = F.relu(self.bn1(self.primary(x)))
        x2 = F.relu(self.bn2(self.cheap(x1)))
        return self.bn3(self.dw(torch.cat([x1, x2], 1)))


def test_a_window_does_not_recompute_a_window_at_each_position() -> None:
    """The 5x5 convolution reads the concatenation, whose second half is the 3x3 convolution:
    fused, each of its 25 positions would evaluate the 3x3 one's 9 (``NESTED_WINDOW``). The
    concatenation is stored by the 3x3 convolution's kernel, and the 5x5 one's reads it."""
    torch.manual_seed(0)
    block = GhostThenWindow().eval()
    x = torch.randn(2, 8, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), fusebackend.config.patch(conv_layout="channels_last"):
        check(block, x)
    report = fusebackend.last_compiled().schedule
    assert "recomputed at each position, the windows' taps would multiply" in report
    assert fallbacks() == {"convolution": 1}  # the 1x1 convolution: cuDNN's
    assert kernel_count() == 2
    # the 5x5 kernel gathers each position from the two stored halves (2 x 25 loads), reads 25
    # weights and the norm's 4 per-channel values; fused, it loaded the first half at 9 x 25
    assert max(src.count("tl.load") for src in kernels().values()) == 2 * 25 + 25 + 4


def test_a_relu_before_a_pool_still_fuses() -> None:
    torch.manual_seed(0)
    check_lowered(lambda x: F.max_pool2d(torch.relu(x * 2), 3, 2, 1), torch.randn(2, 4, 9, 9))
    assert kernel_count() == 1


def test_a_batch_norm_and_relu_before_a_strided_pool_still_fuse() -> None:
    """ResNet's stem: the pool reads the normalized activation at 2.25 positions per element;
    the per-channel scale is the same at each and not counted as recomputed."""
    torch.manual_seed(0)
    stem = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1)).eval().to(torch.bfloat16)
    x = torch.randn(2, 8, 12, 12, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        check_lowered(stem, x)
    assert kernel_count() == 1
    assert "positions" not in fusebackend.last_compiled().schedule


def test_training_through_depthwise_and_squeeze_excitation() -> None:
    """Gradients as eager's; both as close to a float64 copy's as eager's are."""
    for ours, eagers in _gradients_as_close_as_eagers(InvertedResidual, torch.randn(2, 8, 6, 6)):
        assert_same(ours, eagers, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------ grouped 1-d convolutions as products


class PositionalConv(nn.Module):
    """wav2vec 2.0's positional convolution, small: grouped, many taps, padded by half of them,
    the last position dropped (its even kernel), then a GELU."""

    def __init__(self, channels: int = 12, groups: int = 3, taps: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, taps, padding=taps // 2, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.conv(x.transpose(1, 2))[:, :, :-1]).transpose(1, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    # (input sizes, weight sizes, padding, dilation, bias, groups)
    ((2, 8, 13), (12, 2, 4), 3, 2, True, 4),  # three output channels per group, dilated
    ((3, 6, 7), (6, 3, 5), 0, 1, False, 2),  # no padding
    ((1, 4, 3), (4, 2, 9), 4, 1, True, 2),  # windows wider than the input: mostly padding
], ids=["dilated", "valid", "wide"])
def test_a_grouped_1d_convolution_is_a_batched_product(case: tuple[Any, ...], dtype: torch.dtype) -> None:
    sizes, wsizes, padding, dilation, with_bias, groups = case
    x, w, b = _conv_args(sizes, wsizes, with_bias, dtype)
    with fusebackend.config.patch(grouped_conv1d="gemm"):
        check(lambda x: torch.relu(F.conv1d(x, w, b, 1, padding, dilation, groups)), x)
    assert fallbacks() == {"bmm": 1}  # the windows, then the bias and ReLU, around one product
    assert kernel_count() == 2
    gather, after = kernels().values()
    # the windows read the zero-padded copy: one load, in range, no mask
    assert gather.count("tl.load(") == 1 and "tl.where" not in gather
    assert "relu" in after.split("def ", 1)[1].split("(", 1)[0]


def test_a_grouped_1d_convolution_of_a_transposed_input() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 11, 6).transpose(1, 2)  # [N, C, L] with the channels contiguous
    w, b = torch.randn(9, 2, 6), torch.randn(9)
    with fusebackend.config.patch(grouped_conv1d="gemm"):
        check(lambda x: F.conv1d(x, w, b, padding=3, groups=3), x)
    assert fallbacks() == {"bmm": 1}


@pytest.mark.parametrize("why, kwargs", [
    ("strided", dict(stride=2, groups=2)),
    ("ungrouped", dict(groups=1)),
    ("depthwise", dict(groups=4)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_other_1d_convolutions_stay_cudnns(why: str, kwargs: dict[str, int]) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 12)
    w = torch.randn(4, 4 // kwargs["groups"], 5)
    with fusebackend.config.patch(grouped_conv1d="gemm"):
        check(lambda x: F.conv1d(x, w, padding=2, **kwargs) * 2, x)
    assert "bmm" not in fallbacks(), why


def test_auto_makes_products_on_a_gpu_only() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 40)
    w = torch.randn(8, 2, convolutions.MIN_GEMM_TAPS)
    check(lambda x: F.conv1d(x, w, padding=4, groups=4), x)
    assert fallbacks() == {"convolution": 1}  # the CPU: cuDNN's rule does not apply


def test_training_through_a_grouped_1d_convolution() -> None:
    """Every gradient as close to a float64 copy's as eager's is; the backward is products and
    our kernels, no convolution call."""
    _gradients_as_close_as_eagers(PositionalConv, torch.randn(2, 10, 12), grouped_conv1d="gemm")
    assert fallbacks() == {"bmm": 3}  # forward; the weight's and the input's gradients
