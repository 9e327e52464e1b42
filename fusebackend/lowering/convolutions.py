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
the exact value than eager's, which rounds the convolution before adding its bias. Integer,
transposed and other grouped convolutions stay ATen calls.
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch

from fusebackend import ir
from fusebackend.indexing import FloorDiv
from fusebackend.kernels import runtime
from fusebackend.lowering import layouts
from fusebackend.ir import Expr, cast, op
from fusebackend.lowering.graph import GraphLowering, LoweringContext, TensorArg
from fusebackend.lowering.registry import Unsupported, register_composite
from fusebackend.lowering.windows import expand, masked, ranges_of, spatial_load, taps, total, windows_of

aten = torch.ops.aten

MAX_DEPTHWISE_TAPS = 25  # up to 5x5 windows
MAX_POINT_MACS = 1 << 24  # N * C * O: a squeeze-and-excitation layer of MobileNetV3 is 64 * 960 * 240


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
    raise Unsupported("a convolution for cuDNN")


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
