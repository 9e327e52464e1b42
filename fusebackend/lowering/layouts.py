"""Memory formats around 2-d convolutions: channels-last where cuDNN's fast kernels want it.

On NVIDIA GPUs cuDNN's fast convolution kernels read and write channels-last (NHWC) tensors.
Handed NCHW tensors, cuDNN converts tensors to NHWC and back around its kernels, and ATen runs
depthwise convolutions with its own slower NCHW kernel. In torchvision's ResNet-50 (b64, bf16,
H100, torch 2.11, 2026-11-24) those conversions were 69 kernels for 53 convolutions, 1.1 ms of
the step's 4.6 ms of GPU time, each launched by the host inside the ATen call; Inductor, which
makes the tensors around convolutions channels-last, had none. In MobileNetV3 the depthwise
kernel took 1.08 ms where cuDNN's channels-last one took 0.34 ms.

So, on a GPU (``config.conv_layout``: ``auto``), the lowering makes every 2-d convolution's input
channels-last before the call, by a generated copy that fuses into the kernel producing the
input. ATen returns a channels-last result, the pointwise work after it keeps that layout (each
op's meta output follows its inputs), and the next convolution's input is channels-last already:
a chain of convolutions, normalizations and activations converts once, at its start.

A graph where convolutions are a small part of the work (fewer than one in ``OPS_PER_CONVOLUTION``
ops: a vision transformer's patch embedding) keeps eager's layouts: there is no chain to convert
once, and the conversion would copy the image and the weight for one call. In CLIP's image tower
(b64, bf16) that copy was 23 MiB of its 88 MiB peak above the weights, where Inductor, which
makes the same choice for such graphs, converted nothing (H100, torch 2.11, 2026-11-25).

Graph outputs that the user sees keep the layout eager gives them (a generated copy where it
differs, fused into the kernel that computes the value); tensors a forward graph saves for its
backward keep the channels-last layout, and the backward graph, compiled for the tensors it is
handed, works in it too. A convolution's backward call gets its output gradient, input and
weight channels-last from our copies, as the forward does (cuDNN would copy inside the call
any of them that is not), and its bias gradient is a sum of ours (``graph.py``).

The weights' copies run on every call of a graph that takes the weights as inputs; a 3x3
weight, ``(K, C, 3, 3)`` into ``(K, 3, 3, C)``, is a transpose of ``C x 9`` blocks, tiled over
the kernel's 9 positions (``codegen/pointwise.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from fusebackend.config import config

aten = torch.ops.aten

CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)
MODES = ("auto", "channels_last", "keep")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# With ``auto``, a graph with fewer 2-d convolutions than one in this many ops keeps its layouts
OPS_PER_CONVOLUTION = 200


def wants_channels_last(device: torch.device, gm: torch.fx.GraphModule) -> bool:
    """Whether this graph's 2-d convolutions take channels-last inputs (``config.conv_layout``;
    with ``auto``, on a GPU where convolutions are not a small part of the graph)."""
    mode = config.conv_layout
    if mode not in MODES:
        raise ValueError(f"FUSE_CONV_LAYOUT={mode!r}: choose from {', '.join(MODES)}")
    if mode != "auto":
        return mode == "channels_last"
    if device.type != "cuda":
        return False
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    convolutions = sum(1 for n in ops if n.target in CONVOLUTIONS and _is_2d(n))
    return convolutions * OPS_PER_CONVOLUTION >= len(ops)


def _is_2d(node: torch.fx.Node) -> bool:
    """A convolution (or its backward) of 4-dim tensors, by its traced output."""
    val = node.meta.get("val")
    results = val if isinstance(val, (tuple, list)) else (val,)
    return any(isinstance(r, torch.Tensor) and r.dim() == 4 for r in results)


def channels_last_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = sizes
    return (c * h * w, 1, w * c, c)


def is_channels_last(meta: torch.Tensor) -> bool:
    return meta.dim() == 4 and meta.is_contiguous(memory_format=torch.channels_last)


def needs_conversion(meta: torch.Tensor) -> bool:
    """A 4-dim floating tensor, not channels-last, that a 2-d convolution will read."""
    return meta.dim() == 4 and meta.dtype in _FLOATS and meta.numel() > 0 and not is_channels_last(meta)


def result_layout(target: Any, metas: tuple[Any, ...], out_meta: Any, device: torch.device) -> Any:
    """``out_meta`` with the layouts ATen's convolutions give on the device, where the meta
    functions do not know them: cuDNN (and oneDNN on the CPU) return a channels-last result, a
    channels-last input gradient and a channels-last weight gradient when the input or the
    weight is channels-last. Otherwise cuDNN's gradients are contiguous, where the meta backward
    follows a channels-last gradient of the output (a graph's first convolution: the forward
    saved the image itself, not its channels-last copy, for the backward; H200, torch 2.11,
    2026-11-24). The wrapper checks every extern's result against its declared layout and copies
    where they differ, so a wrong guess here costs a copy, never a wrong answer."""
    if target is aten.convolution.default:
        x, weight = metas[0], metas[1]
        if isinstance(out_meta, torch.Tensor) and out_meta.dim() == 4 and (is_channels_last(x) or is_channels_last(weight)):
            return _as_channels_last(out_meta)
        return out_meta
    if target is aten.convolution_backward.default:
        x, weight = metas[1], metas[2]
        grad_input, grad_weight, grad_bias = out_meta
        if x.dim() != 4:
            return out_meta
        if not (is_channels_last(x) or is_channels_last(weight)):
            if device.type != "cuda":
                return out_meta
            return (_as_contiguous(grad_input), _as_contiguous(grad_weight), grad_bias)
        return (_as_channels_last(grad_input), _as_channels_last(grad_weight), grad_bias)
    return out_meta


def _as_channels_last(meta: Any) -> Any:
    if not isinstance(meta, torch.Tensor) or meta.dim() != 4:
        return meta
    shape = tuple(meta.shape)
    return torch.empty_strided(shape, channels_last_strides(shape), dtype=meta.dtype, device="meta")


def _as_contiguous(meta: Any) -> Any:
    if not isinstance(meta, torch.Tensor):
        return meta
    return torch.empty(tuple(meta.shape), dtype=meta.dtype, device="meta")


# Reductions over given dims: ``(self, dim, keepdim, ...)``
REDUCTIONS = (aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default)


def reduction_layout(out_meta: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The layout of a reduction's result: its kept dims in the order of its input's strides.

    ATen's reductions return contiguous results whatever their input's layout. Around
    channels-last convolutions that is the wrong order: ResNeSt's split attention sums the
    radix halves of a channels-last activation, ``x.view(B, 2, C, H, W).sum(1)``, and a
    contiguous ``[B, C, H, W]`` result made each of a kernel's lanes read pixels ``2C`` elements
    apart (16 such sums and 16 weighted ones in timm's ResNeSt-50d, b64, bf16: 12% of their
    floor, 4.2 ms of a 9.8 ms step on an H100, 2026-12-07). The graph's outputs keep eager's
    layout (a copy, fused), and an op that needs the traced layout (a view) gets a copy in it.
    """
    x = args[0] if args else None
    if not (isinstance(out_meta, torch.Tensor) and out_meta.dim() >= 2 and hasattr(x, "meta")):
        return out_meta
    meta = x.meta
    sizes, strides = tuple(meta.shape), tuple(meta.stride())
    if not all(isinstance(v, int) for v in sizes + strides) or meta.is_contiguous():
        return out_meta
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if not dims:
        return out_meta
    reduced = {d % meta.dim() for d in ([dims] if isinstance(dims, int) else dims)}
    kept = [d for d in range(meta.dim()) if keepdim or d not in reduced]  # out dim k <- input dim kept[k]
    if len(kept) != out_meta.dim():
        return out_meta
    # slowest first: by the input's stride, dims of one element last (their stride says nothing)
    order = sorted(range(len(kept)), key=lambda k: (sizes[kept[k]] > 1 and kept[k] not in reduced,
                                                    strides[kept[k]], -k), reverse=True)
    shape = tuple(out_meta.shape)
    out_strides = [0] * len(shape)
    step = 1
    for k in reversed(order):
        out_strides[k] = step
        step *= max(shape[k], 1)
    if all(a == b for a, b, n in zip(out_strides, out_meta.stride(), shape) if n > 1):
        return out_meta  # the same layout (a dim of one element has no stride that matters)
    return torch.empty_strided(shape, tuple(out_strides), dtype=out_meta.dtype, device="meta")


def pointwise_layout(out_meta: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
    """The layout of a pointwise op's result: ATen's, unless its inputs disagree on the order of
    the dims and one of them is row-major over two or more of them: then row-major (contiguous).

    ATen orders a result's dims like its first input's. Whisper's encoder adds positions (a
    contiguous [T, C] table) to the convolutions' output permuted to [B, T, C] (C stride 1 is
    not its order): the sum, and so the whole residual stream after it, is then laid out
    [B, C, T], and every layer norm over C reads its rows strided, one element per T (66 against
    23 us a layer norm on an H200, b8, T 1500, C 512, 2026-11-24). Channels-last results keep
    their layout (``wants_channels_last``: the next convolution wants it).
    """
    if out_meta.dim() < 2 or out_meta.is_contiguous() or is_channels_last(out_meta):
        return out_meta
    shape = tuple(out_meta.shape)
    for t in inputs:
        offset = out_meta.dim() - t.dim()
        if offset < 0:
            continue
        spread = [(offset + i, t.stride(i)) for i in range(t.dim())
                  if t.shape[i] == shape[offset + i] > 1 and t.stride(i) != 0]
        if len(spread) < 2:
            continue
        row_major = all(a[1] > b[1] for a, b in zip(spread, spread[1:]))
        ours = [out_meta.stride(d) for d, _ in spread]
        if row_major and not all(a > b for a, b in zip(ours, ours[1:])):
            return torch.empty(shape, dtype=out_meta.dtype, device="meta")
    return out_meta
