"""Pooling and upsampling as generated kernels (``lowering/pooling.py``, ``lowering/upsampling.py``).

Every op is compared with eager forward and backward (gradients through a compiled function
whose weighted output sum is backpropagated), over f32 and bf16, odd sizes (7x9), kernel /
stride / padding / dilation / ceil_mode combinations and channels-last inputs, asserting that
kernels were generated and no op fell back to ATen. Fusion tests check the kernel count and the
generated source.

The matrices of window configurations x dtype x layout run each configuration once by default,
in one dtype and layout, the pairs taken in turn (``helpers.diagonal``): every configuration,
dtype, layout and pair of dtype and layout runs; ``pytest --full`` runs every combination.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import assert_same, check, check_lowered, compile_fn, diagonal, kernel_count, kernels

DTYPES = [torch.float32, torch.bfloat16]
# dtype x layout, the other axes of the matrices below
DTYPE_IDS = {str(d): d for d in DTYPES}
LAYOUT_IDS = {"nchw": False, "nhwc": True}


def check_backward(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> None:
    """Gradients of ``(fn(x) * w).sum()`` compiled equal eager's; no ATen fallback in either graph."""
    out = fn(x)
    out = out[0] if isinstance(out, tuple) else out
    w = torch.randn(out.shape, dtype=out.dtype)

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = fn(x)
        y = y[0] if isinstance(y, tuple) else y
        return (y * w).float().sum()

    # eager on the CPU is the reference. On a GPU eager's own channels-last avg_pool2d gradient
    # with padding is wrong: torch 2.11+cu130 on an H100, 2026-11-24, it was up to 1.03 off the
    # gradient of the same tensors in float64, on the CPU and in either layout, and in float64 on
    # the GPU too; the CPU's channels-last gradient equals the contiguous one, and so does fuse's.
    expected_x = x.detach().cpu().clone().requires_grad_(True)
    loss(expected_x, w.cpu()).backward()
    actual_x = x.detach().clone().requires_grad_(True)
    fusebackend.metrics.reset()
    compile_fn(loss)(actual_x, w).backward()
    assert_same(actual_x.grad.cpu(), expected_x.grad)
    fallbacks = dict(fusebackend.metrics.fallbacks)
    assert not fallbacks, f"ATen fallbacks: {fallbacks}"
    assert fusebackend.metrics.eager_graphs == 0


def check_op(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> None:
    check_lowered(fn, x)
    torch._dynamo.reset()
    check_backward(fn, x)


def make(dtype: torch.dtype, channels_last: bool = False, shape: tuple[int, ...] = (2, 3, 7, 9)) -> torch.Tensor:
    x = torch.randn(shape).to(dtype)
    return x.to(memory_format=torch.channels_last) if channels_last else x


# ------------------------------------------------------------------------------ max pooling

MAX_POOLS = {
    "k3s2p1": dict(kernel_size=3, stride=2, padding=1),
    "k3s2p1_ceil": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    "k2s2": dict(kernel_size=2, stride=2),
    "k2s2_ceil": dict(kernel_size=2, stride=2, ceil_mode=True),
    "k3s1p1": dict(kernel_size=3, stride=1, padding=1),
    "k2x3_s1x2_p1x0_ceil": dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), ceil_mode=True),
    "k3s2p1_dilation2": dict(kernel_size=3, stride=2, padding=1, dilation=2),
    "k4s3p2_ceil": dict(kernel_size=4, stride=3, padding=2, ceil_mode=True),
}


@pytest.mark.parametrize("name,dtype,channels_last", diagonal({n: n for n in MAX_POOLS}, DTYPE_IDS, LAYOUT_IDS))
def test_max_pool2d_with_indices(name: str, dtype: torch.dtype, channels_last: bool) -> None:
    args = MAX_POOLS[name]
    x = make(dtype, channels_last)
    check_op(lambda x: F.max_pool2d(x, return_indices=True, **args), x)


def test_max_pool_keeps_channels_last() -> None:
    x = make(torch.float32, channels_last=True)
    out, idx = check_lowered(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert idx.is_contiguous(memory_format=torch.channels_last)


def test_max_pool_nan_inf_and_ties_pick_eagers_index() -> None:
    # eager keeps the first maximum, and on NaN the last NaN of the window
    x = torch.randn(2, 3, 7, 9)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = x[0, 0, 2, 2] = float("nan")
    x[0, 1] = float("-inf")
    x[1, 0, :3, :3] = 1.0
    x[1, 1, 4, 4] = float("inf")
    for dtype in DTYPES:
        check_lowered(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x.to(dtype))
        check_lowered(lambda x: F.max_pool2d(x, 3, 1, 0, dilation=2, return_indices=True), x.to(dtype))


def test_max_pool_1d_3d_unbatched_and_strided_inputs() -> None:
    check_op(lambda x: F.max_pool1d(x, 3, 2, 1, return_indices=True), torch.randn(2, 3, 11))
    check_op(lambda x: F.max_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), dilation=(1, 2, 1), ceil_mode=True),
             torch.randn(2, 2, 5, 6, 7))
    check_op(lambda x: F.max_pool2d(x, 3, 2, 1), torch.randn(3, 7, 9))  # no batch dim
    check_op(lambda x: F.max_pool2d(x, 3, 2, 1), torch.randn(2, 9, 7, 3).permute(0, 3, 2, 1))
    check_op(lambda x: F.max_pool2d(x, 2), torch.randn(2, 3, 9, 12)[:, :, 1:8, 2:11])


def test_integer_max_pool_stays_an_aten_call() -> None:
    x = torch.randint(-50, 50, (2, 3, 7, 9))
    if x.device.type == "cuda":
        pytest.skip("eager's CUDA max pool has no integer kernel")
    check(lambda x: F.max_pool2d(x, 3, 2, 1), x)
    assert fusebackend.metrics.fallbacks["max_pool2d_with_indices"] == 1


# -------------------------------------------------------------------------- average pooling

AVG_POOLS = {
    "k3s2p1": dict(kernel_size=3, stride=2, padding=1),
    "k3s2p1_ceil": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    "k3s2p1_ceil_exclude_pad": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    "k2s2": dict(kernel_size=2, stride=2),
    "k2x3_s1x2_p1x0_ceil_exclude_pad": dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), ceil_mode=True,
                                            count_include_pad=False),
    "k3s2p1_divisor5": dict(kernel_size=3, stride=2, padding=1, divisor_override=5),
    "k4s3p2_ceil": dict(kernel_size=4, stride=3, padding=2, ceil_mode=True),
}


@pytest.mark.parametrize("name,dtype,channels_last", diagonal({n: n for n in AVG_POOLS}, DTYPE_IDS, LAYOUT_IDS))
def test_avg_pool2d(name: str, dtype: torch.dtype, channels_last: bool) -> None:
    args = AVG_POOLS[name]
    check_op(lambda x: F.avg_pool2d(x, **args), make(dtype, channels_last))


def test_avg_pool_1d_3d() -> None:
    check_op(lambda x: F.avg_pool1d(x, 3, 2, 1, count_include_pad=False), torch.randn(2, 3, 11))
    check_op(lambda x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), torch.randn(2, 2, 5, 6, 7))
    check_op(lambda x: F.avg_pool3d(x, 2, 2, divisor_override=3), torch.randn(2, 2, 5, 6, 7))


# ------------------------------------------------------------------------- adaptive pooling


ADAPTIVE_SIZES = [(3, 4), (7, 3), (4, 5), (5, 2), (14, 18)]


@pytest.mark.parametrize("size,dtype,channels_last",
                         diagonal({str(s): s for s in ADAPTIVE_SIZES}, DTYPE_IDS, LAYOUT_IDS))
def test_adaptive_avg_pool2d(size: tuple[int, int], dtype: torch.dtype, channels_last: bool) -> None:
    check_op(lambda x: F.adaptive_avg_pool2d(x, size), make(dtype, channels_last))


def test_adaptive_avg_pool_1d_3d() -> None:
    check_op(lambda x: F.adaptive_avg_pool1d(x, 4), torch.randn(2, 3, 11))
    check_op(lambda x: F.adaptive_avg_pool3d(x, (2, 4, 3)), torch.randn(2, 2, 5, 6, 7))


def test_adaptive_pool_of_whole_windows_has_no_masks() -> None:
    # 8x12 -> 4x3: windows of 2x4 everywhere, a plain pool
    check_lowered(lambda x: F.adaptive_avg_pool2d(x, (4, 3)), torch.randn(2, 3, 8, 12))
    (source,) = kernels().values()
    assert "tl.where" not in source and "tl.minimum" not in source
    assert source.count("tl.load(") == 8


def test_large_windows_that_tile_the_input_are_a_reduction() -> None:
    # 16x16 windows: summed by a reduction over a (window, position) view, not unrolled
    check_op(lambda x: F.adaptive_avg_pool2d(x, 2), torch.randn(2, 3, 32, 32))
    forward = fusebackend.history()[0]
    assert forward.kernel_count == 1 and all(name.startswith("fused_red") for name in forward.kernels)
    torch._dynamo.reset()
    check_lowered(lambda x: F.avg_pool2d(x, 8, divisor_override=7), torch.randn(2, 3, 17, 16))


def test_kernel_larger_than_the_input_unrolls_what_the_input_holds() -> None:
    # transformers' EfficientNet: AvgPool2d(1280, ceil_mode=True) over a 7x7 map, a mean of the map
    x = torch.randn(2, 5, 7, 7)
    check_op(lambda x: F.avg_pool2d(x, 1280, ceil_mode=True), x)
    assert fusebackend.history()[0].kernel_count == 1
    for kwargs in (dict(ceil_mode=True, count_include_pad=False, padding=4), dict(ceil_mode=True, padding=3)):
        torch._dynamo.reset()
        check_op(lambda x: F.avg_pool2d(x, 9, **kwargs), torch.randn(2, 3, 7, 6))
        torch._dynamo.reset()
        check_op(lambda x: F.max_pool2d(x, 9, padding=kwargs["padding"], ceil_mode=True, return_indices=True),
                 torch.randn(2, 3, 7, 6))


def test_window_too_large_to_unroll_stays_an_aten_call() -> None:
    check(lambda x: F.max_pool2d(x, 17), torch.randn(1, 2, 17, 17))
    assert fusebackend.metrics.fallbacks["max_pool2d_with_indices"] == 1


# ------------------------------------------------------------------------------- upsampling

UPSAMPLES = {
    "nearest_x2": dict(scale_factor=2, mode="nearest"),
    "nearest_to_10x13": dict(size=(10, 13), mode="nearest"),
    "nearest_down_5x4": dict(size=(5, 4), mode="nearest"),
    "nearest_x1.5": dict(scale_factor=1.5, mode="nearest"),
    "nearest_exact_to_10x13": dict(size=(10, 13), mode="nearest-exact"),
    "nearest_exact_x0.5x2.5": dict(scale_factor=(0.5, 2.5), mode="nearest-exact"),
    "bilinear_x2": dict(scale_factor=2, mode="bilinear"),
    "bilinear_to_10x13": dict(size=(10, 13), mode="bilinear"),
    "bilinear_down_5x4": dict(size=(5, 4), mode="bilinear"),
    "bilinear_x1.7": dict(scale_factor=1.7, mode="bilinear"),
    "bilinear_aligned_x2": dict(scale_factor=2, mode="bilinear", align_corners=True),
    "bilinear_aligned_to_10x13": dict(size=(10, 13), mode="bilinear", align_corners=True),
    "bilinear_aligned_to_3x20": dict(size=(3, 20), mode="bilinear", align_corners=True),
}


@pytest.mark.parametrize("name,dtype,channels_last", diagonal({n: n for n in UPSAMPLES}, DTYPE_IDS, LAYOUT_IDS))
def test_upsample2d(name: str, dtype: torch.dtype, channels_last: bool) -> None:
    args = UPSAMPLES[name]
    check_op(lambda x: F.interpolate(x, **args), make(dtype, channels_last))


def test_upsample_1d_3d() -> None:
    x1, x3 = torch.randn(2, 3, 11), torch.randn(2, 2, 3, 4, 5)
    check_op(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), x1)
    check_op(lambda x: F.interpolate(x, size=17, mode="nearest-exact"), x1)
    check_op(lambda x: F.interpolate(x, size=17, mode="linear", align_corners=True), x1)
    check_op(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), x3)
    check_op(lambda x: F.interpolate(x, size=(5, 7, 9), mode="trilinear"), x3)


def test_upsample_nearest_of_bytes() -> None:
    x = torch.randint(0, 255, (2, 3, 7, 9), dtype=torch.uint8)
    check_lowered(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), x)


def test_upsample_that_no_index_map_fits_stays_an_aten_call() -> None:
    # 42 -> 133 in float32: rounding breaks every small fraction's floor pattern
    x = torch.randn(1, 2, 3, 42)
    out = check(lambda x: F.interpolate(x, size=(3, 133), mode="nearest"), x)
    assert fusebackend.metrics.fallbacks["upsample_nearest2d"] == 1
    assert out.shape == (1, 2, 3, 133)


def test_upsample_keeps_the_op_whole_in_both_graphs() -> None:
    # PyTorch decomposes upsampling in Python before autograd; kept whole, the backward graph
    # holds upsample_nearest2d_backward (a gather here), not index_put with accumulation
    check_backward(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), torch.randn(2, 3, 7, 9))
    forward, backward = fusebackend.history()
    assert "upsample_nearest2d.default" in forward.aten_graph and "index" not in forward.aten_graph
    assert "upsample_nearest2d_backward" in backward.aten_graph and "index_put" not in backward.aten_graph
    # a x2 nearest gradient is the plain sum of a 2x2 block of the output's gradient (here
    # w * the loss's tangent: four loads of w, one of the tangent), unmasked
    (source,) = backward.kernels.values()
    assert source.count("tl.load(") == 5 and "tl.where" not in source


@pytest.mark.parametrize("shape, args", [
    ((2, 3, 5, 4), dict(scale_factor=8, mode="bilinear")),
    ((1, 2, 7, 6), dict(scale_factor=4, mode="bilinear", align_corners=True)),
    ((2, 3, 5, 4), dict(size=(37, 29), mode="bilinear")),
    ((1, 2, 3, 4, 5), dict(scale_factor=4, mode="trilinear")),
], ids=["bilinear_x8", "bilinear_aligned_x4", "bilinear_to_37x29", "trilinear_x4"])
def test_a_large_upsampling_gradient_is_summed_one_dim_at_a_time(shape: tuple[int, ...], args: dict[str, Any]) -> None:
    # a window of more than SEPARABLE_TAPS positions over all dims: a reduction per dim (each
    # looping over its own window), not one node unrolling the product of the windows; a dim's
    # window of at most config.unrolled_reduction positions is a pointwise pass (trilinear_x4's
    # first: lowering/unrolled.py)
    check_backward(lambda x: F.interpolate(x, **args), torch.randn(shape))
    backward = fusebackend.history()[-1]
    nd = len(shape) - 2
    passes = [src for name, src in backward.kernels.items() if "upsample" in name]
    assert len(passes) == nd, list(backward.kernels)
    reductions = [src for src in passes if "tl.reduce" in src]
    assert reductions and all(src.count("tl.load(") <= 2 for src in reductions)
    assert all(src.count("tl.load(") <= fusebackend.config.unrolled_reduction + 1 for src in passes)


def test_a_large_channels_last_upsampling_gradient_is_summed_one_dim_at_a_time() -> None:
    # Segformer's decoder upsamples channels-last features: each pass stored channels-last too
    check_backward(lambda x: F.interpolate(x, scale_factor=8, mode="bilinear") * 2,
                   make(torch.float32, channels_last=True, shape=(2, 5, 4, 3)))
    backward = fusebackend.history()[-1]
    assert sum(1 for name in backward.kernels if name.startswith("fused_red")) == 2, list(backward.kernels)


def test_a_large_bf16_upsampling_gradient_sums_in_fp32_between_dims() -> None:
    check_backward(lambda x: F.interpolate(x, scale_factor=8, mode="bilinear"), torch.randn(2, 3, 5, 4).bfloat16())
    backward = fusebackend.history()[-1]
    assert backward.kernel_count == 2
    assert "torch.float32" in backward.wrapper  # the sum over the last dim, kept in fp32 for the next


# ----------------------------------------------------------------------------------- fusion


def test_relu_max_pool_mul_is_one_kernel() -> None:
    x = torch.randn(2, 3, 7, 9)
    check_lowered(lambda x: F.max_pool2d(torch.relu(x), 3, 2, 1) * 2, x)
    assert kernel_count() == 1
    (source,) = kernels().values()
    # the window reads the input with clamped indices; padding positions are masked to -inf
    assert source.count("tl.load(") == 9
    assert "tl.where(" in source and 'float("-inf")' in source
    assert "read 1.48 KiB" in fusebackend.last_compiled().schedule  # the input, read once: 378 floats


def test_pool_without_padding_has_no_masks() -> None:
    check_lowered(lambda x: F.avg_pool2d(x, 2) + 1, torch.randn(2, 3, 8, 10))
    assert kernel_count() == 1
    (source,) = kernels().values()
    assert "tl.where" not in source and "tl.minimum" not in source


def test_upsample_fuses_with_producer_and_consumer() -> None:
    x = torch.randn(2, 3, 7, 9)
    check_lowered(lambda x: torch.sigmoid(F.interpolate(x * 2, scale_factor=2, mode="bilinear")) + 1, x)
    assert kernel_count() == 1


def test_training_step_backward_is_one_kernel() -> None:
    # max_pool2d_with_indices_backward, relu's backward and the scale fuse into one kernel
    check_backward(lambda x: F.max_pool2d(torch.relu(x * 2), 3, 2, 1), torch.randn(2, 3, 7, 9))
    assert fusebackend.history()[-1].kernel_count == 1


@pytest.mark.parametrize("dilation", [1, 2], ids=lambda d: f"dilation{d}")
def test_training_saves_int8_window_positions(dilation: int) -> None:
    # the forward returns (for the backward) each maximum's position in its window as an int8,
    # not int64 indices, and the backward turns them into indices
    fn = lambda x: F.max_pool2d(torch.relu(x * 2), 3, 2, 1, dilation=dilation)
    check_backward(fn, torch.randn(2, 3, 9, 11))
    forward = next(a for a in fusebackend.history() if a.name.startswith("forward"))
    returned = forward.wrapper.split("return (", 1)[1]
    assert "torch.int8" in forward.wrapper and "torch.int64" not in forward.wrapper, forward.wrapper
    assert returned.count("buf") == 3  # the maximum, relu's output, the positions
    # dilated, 9 windows cover an element: recomputing the indices at each costs more than
    # reading them, and the backward writes them first (two kernels)
    assert fusebackend.history()[-1].kernel_count == (1 if dilation == 1 else 2)


def test_window_loads_are_element_by_element() -> None:
    # Loads whose offset clamps or divides carry contiguity, divisibility and constancy hints of
    # 1 (indexing.window_arithmetic: Triton 3.6 vectorized such a load wrongly on a GPU); a
    # plain load keeps Triton's own analysis.
    x = make(torch.float32, channels_last=True)
    if x.device.type == "cuda":
        pytest.skip("the channels-last average-pool gradient is an ATen call on a GPU (pooling.py)")
    check_op(lambda x: F.avg_pool2d(x, 3, 2, 1) + 1, x)
    backward = [a for a in fusebackend.history() if a.name.startswith("backward")][-1]
    source = "\n".join(backward.kernels.values())
    assert "tl.max_contiguous(" in source and "tl.max_constancy(" in source
    torch._dynamo.reset()
    fusebackend.dump.clear()
    check_lowered(lambda x: x * 2 + 1, make(torch.float32))
    assert "tl.max_contiguous(" not in "\n".join(kernels().values())


class _Inception(torch.nn.Module):
    """GoogLeNet's module in short: four branches (a 1x1 convolution, batch norm and ReLU each,
    one after a 3x3 max pool of stride 1), concatenated; then the same pool over the
    concatenation, as the next module's fourth branch reads it."""

    def __init__(self, c: int = 8, widths: tuple[int, ...] = (8, 16, 4, 4)) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, w, 1, bias=False) for w in widths)
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(w, eps=1e-3) for w in widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = lambda t: F.max_pool2d(t, 3, 1, 1, ceil_mode=True)  # noqa: E731
        parts = [F.relu(n(conv(pool(x) if k == 3 else x))) for k, (conv, n) in enumerate(zip(self.convs, self.norms))]
        return pool(torch.cat(parts, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pool_over_a_concatenation_does_not_evaluate_its_parts_at_each_tap(dtype: torch.dtype) -> None:
    """Each part is an eighth to a half of the concatenation and varies with it
    (``cost_model.ONE_TO_ONE``): its batch norm is computed once an element, never inside the
    pool's window (GoogLeNet on an H100, 2026-12-07: 3% of the floor, 0.55x Inductor)."""
    torch.manual_seed(0)
    model = _Inception().eval().to(dtype)
    with torch.no_grad():
        for n in model.norms:
            n.running_mean.normal_()
            n.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 8, 9, 7, dtype=dtype)
    with torch.no_grad():
        assert_same(compile_fn(model)(x), model(x))
    pools = {k: src for k, src in kernels().items() if "max_pool" in k}
    assert len(pools) == 2, sorted(kernels())
    for name, src in pools.items():
        assert "rsqrt" not in src and "th.sqrt" not in src, name  # no batch norm in a window's kernel
