"""Convolutions that are cheaper as kernels of ours than as cuDNN calls: depthwise windows and
products over one position.

Most convolutions stay ATen calls (cuDNN's tensor-core kernels; ``graph.py`` makes their inputs
channels-last on a GPU, ``layouts.py``). Two kinds do not need them, and in a mobile network they
are half of the convolutions:

- **depthwise** (``groups`` equal to the input's channels): every output element is a sum over
  its own channel's window, ``kh * kw`` products, as an average pool with a weight per position.
  It is a pointwise node here, unrolled like a pool (``windows.taps``), so the batch norm and
  activation after it fuse into its kernel, and the kernel before it writes nothing it would
  not have written for cuDNN. On a GPU its input is channels-last and its kernel is tiled rows
  by channels (``codegen/pointwise.column_tile``); where no such tiles divide it, it stays
  cuDNN's. So do windows of more than ``MAX_DEPTHWISE_TAPS`` positions: ConvNeXt's 7x7 ones
  took 320 against cuDNN's 202 us at 64x96x56x56 (H100, bf16), where up to 5x5 (MobileNetV3's,
  with their batch norm and activation) took 0.43 to 1.12 times eager's time
  (``benchmarks/studies/conv_study.py``).
- **a product over one position**: a 1x1 convolution of an input whose spatial dims are all 1 (a
  squeeze-and-excitation block's two layers, after the pool to 1x1) is ``[N, C] x [C, O]``. Small
  ones (``MAX_POINT_MACS`` multiply-adds) are a sum reduction over ``C`` here, its bias and
  activation fused after it.

Why (H100, torch 2.11, bf16, MobileNetV3-Large b64, 2026-11-24): the step issued 62 cuDNN
calls; the wrapper less its launches and allocations, mostly those calls, took 2.2 ms of the
host's 3.95 ms per step (``benchmarks.host_cost``), against 1.76 ms of GPU time, so the step
was bound by the host and its time moved with the host's speed between processes (2.40 to 2.58 ms
on an H200). One ``torch.convolution`` call cost 17-29 us of host time whatever its size, and
``torch.mm`` on the same shapes 16-28 us (so a 1x1 convolution as a cuBLAS product saves no host
time); a launch of a generated kernel costs a few. On the GPU the squeeze-and-excitation products
took 5.6-7.8 us each through cuDNN.

The sums are in fp32 (fp64 for fp64 inputs) and rounded once, to the output's dtype: closer to
the exact value than eager's, which rounds the convolution before adding its bias.

A third kind is faster as cuBLAS products than as cuDNN's kernels: **grouped 1-d convolutions of
many taps** (``gemm_taps``). wav2vec 2.0's and HuBERT's positional convolution (768 channels in 16
groups, 128 taps, padding 64, over b8 x 499 frames, bf16) took cuDNN 13.2 ms forward and 14.2
ms forward and backward, in legacy kernels (``implicit_convolve_sgemm``, one launch per
group), whatever the layout or ``cudnn.benchmark``, where gathering each group's windows into a
``[frames, channels x taps]`` matrix and multiplying by the weight, ``[channels x taps, out]``,
took 1.4 and 4.6 ms as eager ATen ops (H100, torch 2.11, 2026-11-28): 35% of the model's
training step was that convolution. Here the gathered windows (``_windows``) are a pointwise
node, the product a ``bmm`` over the groups, the bias and the output's layout a pointwise node
after it; the backward gathers again for the weight's gradient (the forward saves the input, not
the windows), multiplies the output's gradient by the weight, and sums each input position's
taps back (``_fold``). The gathered matrix is ``taps`` times the input: a convolution whose
matrix would exceed ``MAX_WINDOWS_BYTES`` stays cuDNN's. Integer, transposed, strided and other
grouped convolutions stay ATen calls.

From how many taps (``MIN_GEMM_TAPS``; ``benchmarks/studies/grouped_conv1d_study.py``, H100,
bf16, 2026-11-28, against the same graph with the convolution an ATen call): at 768 x 16 groups
over b8 x 499, forward / forward and backward in ms, 8 taps 0.079 / 0.855 against products'
0.086 / 0.928, 16 taps 0.212 / 1.023 against 0.129 / 0.819, 32 taps 0.349 / 1.036 against
0.176 / 0.836, 64 taps 0.627 / 1.764 against 0.322 / 1.093, 128 taps 13.18 / 14.24 against
0.58 / 2.01; at 512 x 8 groups over b8 x 1000, 32 taps 0.276 / 0.897 against 0.247 / 0.822,
128 taps 0.418 / 96.7 against 0.802 / 2.69 (cuDNN's forward fast there, its backward not).
cuDNN's times jump by shape; the products' follow their bytes.
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch

from fusebackend import ir, sizevars
from fusebackend.config import config
from fusebackend.indexing import FloorDiv
from fusebackend.kernels import runtime
from fusebackend.lowering import layouts
from fusebackend.ir import Expr, cast, op
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_composite
from fusebackend.lowering.windows import (
    Window, clamped, expand, in_range, masked, ranges_of, spatial_load, taps, total, windows_of,
)

aten = torch.ops.aten

MAX_DEPTHWISE_TAPS = 25  # up to 5x5 windows
MAX_POINT_MACS = 1 << 24  # N * C * O: a squeeze-and-excitation layer of MobileNetV3 is 64 * 960 * 240
GROUPED_CONV1D_MODES = ("auto", "gemm", "cudnn")
MIN_GEMM_TAPS = 32  # with ``auto``, the fewest taps of a grouped 1-d convolution made products
MAX_WINDOWS_BYTES = 1 << 30  # the largest gathered windows matrix (wav2vec 2.0's, b8: 786 MB)


@register_composite(aten.convolution.default)
def convolution(b: GraphLowering, input: TensorArg, weight: TensorArg, bias: TensorArg | None, stride: Any,
                padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int) -> TensorArg:
    if transposed:
        raise Unsupported("a transposed convolution")
    if not isinstance(input, TensorArg) or not isinstance(weight, TensorArg):
        raise Unsupported("a convolution of a non-tensor")
    if not (input.dtype.is_floating_point and not input.dtype.is_complex):
        raise Unsupported(f"a convolution of {input.dtype}")
    if input.dtype != weight.dtype or (bias is not None and bias.dtype != input.dtype):
        raise Unsupported("a convolution of mixed dtypes")
    nd = len(input.sizes) - 2
    if nd < 1 or len(weight.sizes) != nd + 2 or b.out_meta.numel() == 0:
        raise Unsupported(f"a convolution of a {len(input.sizes)}-dim input")
    channels, out_channels = input.sizes[1], weight.sizes[0]
    if groups > 1 and groups == channels and weight.sizes[1] == 1 and out_channels % groups == 0:
        return _depthwise(b, input, weight, bias, nd, stride, padding, dilation)
    if groups == 1 and all(s == 1 for s in input.sizes[2:]) and all(k == 1 for k in weight.sizes[2:]) \
            and all(p == 0 for p in expand(padding, nd, "padding")):
        return _point_product(b, input, weight, bias)
    window = gemm_taps(b.device, input, weight, b.out_meta, stride, padding, dilation, groups)
    if window is not None:
        return _grouped_products(b, input, weight, bias, window, groups)
    raise Unsupported("a convolution for cuDNN")


@register_composite(aten.convolution_backward.default)
def convolution_backward(b: GraphLowering, grad_output: TensorArg, input: TensorArg, weight: TensorArg,
                         bias_sizes: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                         output_padding: Any, groups: int, output_mask: Any) -> tuple[Any, ...]:
    """The backward of a convolution made products (``gemm_taps``); every other one declines to
    the ATen call (``graph.py`` prepares it)."""
    if transposed or not all(isinstance(t, TensorArg) for t in (grad_output, input, weight)):
        raise Unsupported("a convolution for cuDNN")
    if grad_output.dtype != input.dtype or input.dtype != weight.dtype:
        raise Unsupported("a convolution of mixed dtypes")
    window = gemm_taps(b.device, input, weight, grad_output.meta, stride, padding, dilation, groups)
    if window is None:
        raise Unsupported("a convolution for cuDNN")
    grad_input = grad_weight = grad_bias = None
    if output_mask[0] or output_mask[1]:
        gy = _per_group_rows(b, grad_output, groups)  # [G, N * L_out, O / G]
    if output_mask[1]:
        windows = _windows(b, input, window, groups)
        # [G, O / G, C / G * K]
        products = _bmm(b, gy.permuted((0, 2, 1)), windows, "a grouped convolution's weight gradient")
        grad_weight = b.view((products,), products.meta.view(tuple(weight.sizes)))
    if output_mask[0]:
        w = _weight_rows(b, weight, groups)  # [G, O / G, C / G * K]
        # [G, C / G * K, N * L_out]: the fold reads it along the positions
        columns = _bmm(b, w.permuted((0, 2, 1)), gy.permuted((0, 2, 1)),
                       "a grouped convolution's input gradient, by window")
        grad_input = _fold(b, columns, input, window, groups)
    if output_mask[2]:
        grad_bias = b.bias_gradient(grad_output)
    return (grad_input, grad_weight, grad_bias)


def gemm_taps(device: torch.device, x: TensorArg, weight: TensorArg, out_meta: torch.Tensor, stride: Any,
              padding: Any, dilation: Any, groups: int) -> Window | None:
    """The window of a grouped 1-d convolution to make products (module docstring), or None
    where it stays cuDNN's (``config.grouped_conv1d``)."""
    mode = config.grouped_conv1d
    if mode not in GROUPED_CONV1D_MODES:
        raise ValueError(f"FUSE_GROUPED_CONV1D={mode!r}: choose from {', '.join(GROUPED_CONV1D_MODES)}")
    if mode == "cudnn" or (mode == "auto" and device.type != "cuda"):
        return None
    if len(x.sizes) != 3 or len(weight.sizes) != 3 or not x.dtype.is_floating_point or x.dtype.is_complex:
        return None
    if sizevars.symbolic(tuple(x.sizes) + tuple(weight.sizes)) or out_meta.numel() == 0:
        return None
    channels, out_channels, taps_ = x.sizes[1], weight.sizes[0], weight.sizes[2]
    if not 1 < groups < channels or channels % groups or out_channels % groups or weight.sizes[1] != channels // groups:
        return None  # ungrouped, or depthwise (``_depthwise``)
    if mode == "auto" and taps_ < MIN_GEMM_TAPS:
        return None
    (window,) = windows_of(x, tuple(out_meta.shape), 1, [taps_], stride, padding, dilation)
    if window.stride != 1:
        return None
    if x.sizes[0] * window.out_size * channels * taps_ * x.dtype.itemsize > MAX_WINDOWS_BYTES:
        return None
    return window


def _windows(b: GraphLowering, x: TensorArg, window: Window, groups: int) -> TensorArg:
    """Each group's windows of ``x`` [N, C, L] as a matrix, [G, N * L_out, C / G * K]: row (n, l)
    holds the group's channels' taps around output position l, zeros in the padding.

    The windows read a copy of ``x`` with its padding written as zeros (``taps`` times smaller
    than the windows), so that every load is in range and a window's taps are consecutive
    addresses: read with a clamped index and a mask instead, wav2vec 2.0's windows (786 MB,
    bf16) took 765 us, 34% of their floor (H100, 2026-11-28), their loads issued an element at
    a time."""
    n, channels, length = x.sizes
    cg, k, lout = channels // groups, window.kernel, window.out_size
    if window.padding:  # an ATen call: a kernel of ours would fuse into the windows' and clamp again
        pad = aten.constant_pad_nd.default
        meta = torch.empty((n, channels, length + 2 * window.padding), dtype=x.dtype, device="meta")
        x = b.extern(pad, (x, [window.padding, window.padding], 0.0), {}, meta, counted=False,
                     reason="a grouped convolution's padding, for its windows")

    def body(ctx: LoweringContext) -> Expr:
        g, i, l, c, j = ctx.vars
        return ir.Load(x.view, (i, g * cg + c, l + j * window.dilation))

    gathered = b.pointwise((groups, n, lout, cg, k), x.dtype, body)
    return b.view((gathered,), gathered.meta.view(groups, n * lout, cg * k))


def _weight_rows(b: GraphLowering, weight: TensorArg, groups: int) -> TensorArg:
    """The weight [O, C / G, K] as [G, O / G, C / G * K], copied where it is not contiguous."""
    if not weight.meta.is_contiguous():
        weight = b.pointwise(tuple(weight.sizes), weight.dtype, lambda ctx: ctx.load(weight))
    o, cg, k = weight.sizes
    return b.view((weight,), weight.meta.view(groups, o // groups, cg * k))


def _per_group_rows(b: GraphLowering, y: TensorArg, groups: int) -> TensorArg:
    """An output (or its gradient) [N, O, L_out] as [G, N * L_out, O / G]."""
    n, o, lout = y.sizes
    og = o // groups
    rows = b.pointwise((groups, n, lout, og), y.dtype, lambda ctx: ir.Load(
        y.view, (ctx.vars[1], ctx.vars[0] * og + ctx.vars[3], ctx.vars[2])))
    return b.view((rows,), rows.meta.view(groups, n * lout, og))


def _bmm(b: GraphLowering, first: TensorArg, second: TensorArg, why: str) -> TensorArg:
    bmm = aten.bmm.default
    return b.extern(bmm, (first, second), {}, bmm(first.meta, second.meta), reason=why)


def _grouped_products(b: GraphLowering, x: TensorArg, weight: TensorArg, bias: TensorArg | None, window: Window,
                      groups: int) -> TensorArg:
    """``conv1d(x, weight, bias, groups=G)`` as ``bmm(windows, weight rows transposed)``, then
    the bias in one pointwise node, which stores the [N, O, L_out] output channels fastest (its
    memory [N, L_out, O]): it reads the product's rows along, and wav2vec 2.0 reads the output
    transposed, [N, L_out, O], for a layer norm over the channels (stored [N, O, L_out], that
    norm read each row 500 elements apart)."""
    meta = b.out_meta
    n, o, lout = meta.shape
    og = o // groups
    w = _weight_rows(b, weight, groups)
    windows = _windows(b, x, window, groups)
    products = _bmm(b, windows, w.permuted((0, 2, 1)), "a grouped convolution, by window")  # [G, N * L_out, O / G]
    acc = ir.compute_dtype(x.dtype)

    def body(ctx: LoweringContext) -> Expr:
        i, l, g, c = ctx.vars
        out = cast(ir.Load(products.view, (g, i * lout + l, c)), acc)
        if bias is not None:
            out = op("add", out, cast(ir.Load(bias.view, (g * og + c,)), acc))
        return out

    result = b.pointwise((n, lout, groups, og), meta.dtype, body)
    return b.view((result,), result.meta.view(n, lout, o).transpose(1, 2))


def _fold(b: GraphLowering, columns: TensorArg, x: TensorArg, window: Window, groups: int) -> TensorArg:
    """The input's gradient [N, C, L] from the windows' gradient ``columns`` [G, C / G * K,
    N * L_out] (transposed, so that consecutive input positions read consecutive windows): each
    input position sums the taps of the windows that read it, a reduction over the K taps
    (stride 1: output position ``l = t + padding - j * dilation`` reads it at tap ``j``)."""
    n, channels, length = x.sizes
    cg, k, lout = channels // groups, window.kernel, window.out_size
    cols = columns.view
    # the reduction's domain [N, G, C / G, L, K], over the windows' gradient
    rows = n * lout
    domain = TensorArg(ir.View(cols.buffer, (n, groups, cg, length, k), (lout, cg * k * rows, k * rows, 1, rows),
                               cols.offset),
                       torch.empty((n, groups, cg, length, k), dtype=x.dtype, device="meta"))
    acc = ir.compute_dtype(x.dtype)

    def body(ctx: LoweringContext) -> Expr:
        i, g, c, t, j = ctx.vars
        ranges = ranges_of(ctx)
        at = t + window.padding - j * window.dilation
        valid = in_range(at, 0, lout, ranges)
        if valid is False:
            return ir.Constant(0.0, acc)
        return masked(valid, cast(ir.Load(cols, (g, c * k + j, i * lout + clamped(at, lout, ranges))), acc), 0.0)

    sums = b.reduce(domain, [4], False, "sum", x.dtype, body)
    return b.view((sums,), sums.meta.view(n, channels, length))


def _depthwise(b: GraphLowering, x: TensorArg, weight: TensorArg, bias: TensorArg | None, nd: int, stride: Any,
               padding: Any, dilation: Any) -> TensorArg:
    """Each output channel ``o`` reads input channel ``o // multiplier`` (``out_channels /
    channels``, usually 1), over its window."""
    meta = b.out_meta
    windows = windows_of(x, tuple(meta.shape), nd, list(weight.sizes[2:]), stride, padding, dilation)
    positions = math.prod(w.reach for w in windows)
    if positions > MAX_DEPTHWISE_TAPS:
        raise Unsupported(f"a depthwise window of more than {MAX_DEPTHWISE_TAPS} positions")
    if b.channels_last and nd == 2:
        # channels-last, as for cuDNN: a block of channels of a row of positions shares the
        # row's index arithmetic, and the weights are loaded once per column of the block
        # (codegen/pointwise.column_tile); untiled, the kernel computes every position's index,
        # bounds and mask per element and was 4-16 times slower than cuDNN (H100, 2026-11-24)
        rows = meta.numel() // meta.shape[1]
        if runtime.column_tile_config(rows, meta.shape[1], positions) is None:
            raise Unsupported(f"a depthwise convolution of {meta.shape[1]} channels x {rows} positions: no tiles")
        x = b.as_channels_last(x, "input")
        meta = layouts.result_layout(aten.convolution.default, (x.meta, weight.meta), meta, b.device)
    multiplier = weight.sizes[0] // x.sizes[1]
    acc = ir.compute_dtype(x.dtype)

    def body(ctx: LoweringContext) -> Expr:
        n, o, *out_vars = ctx.vars
        channel: sympy.Expr = o if multiplier == 1 else FloorDiv(o, multiplier)
        terms = [op("mul", masked(valid, spatial_load(x, (n, channel), index, acc), 0.0),
                    cast(ir.Load(weight.view, (o, sympy.Integer(0), *map(sympy.Integer, offsets))), acc))
                 for offsets, index, valid in taps(windows, out_vars, ranges_of(ctx))]
        out = total(terms, acc)
        if bias is not None:
            out = op("add", out, cast(ir.Load(bias.view, (o,)), acc))
        return out

    return b.pointwise(tuple(meta.shape), meta.dtype, body, tuple(meta.stride()))


def _point_product(b: GraphLowering, x: TensorArg, weight: TensorArg, bias: TensorArg | None) -> TensorArg:
    """``out[n, o] = sum_c x[n, c] * weight[o, c] (+ bias[o])`` over inputs of one position."""
    meta = b.out_meta
    n_size, channels = x.sizes[0], x.sizes[1]
    out_channels = weight.sizes[0]
    if n_size * channels * out_channels > MAX_POINT_MACS:
        raise Unsupported(f"a product of more than {MAX_POINT_MACS} multiply-adds: cuBLAS's")
    acc = ir.compute_dtype(x.dtype)
    zeros = (sympy.Integer(0),) * (len(x.sizes) - 2)
    # the reduction's domain [N, O, C]: x broadcast along O, read at (n, c)
    view = x.view
    domain = TensorArg(ir.View(view.buffer, (n_size, out_channels, channels), (view.strides[0], 0, view.strides[1]),
                               view.offset),
                       torch.empty_strided((n_size, out_channels, channels), (channels, 0, 1), dtype=x.dtype,
                                           device="meta"))

    def products(ctx: LoweringContext) -> Expr:
        n, o, c = ctx.vars
        return op("mul", cast(ir.Load(view, (n, c, *zeros)), acc), cast(ir.Load(weight.view, (o, c, *zeros)), acc))

    sums = b.reduce(domain, [2], False, "sum", acc, products)

    def result(ctx: LoweringContext) -> Expr:
        n, o = ctx.vars[0], ctx.vars[1]
        out = ir.Load(sums.view, (n, o))
        if bias is not None:
            out = op("add", out, cast(ir.Load(bias.view, (o,)), acc))
        return out

    return b.pointwise(tuple(meta.shape), meta.dtype, result, tuple(meta.stride()))
