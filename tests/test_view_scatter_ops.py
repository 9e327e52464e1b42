"""Pads, flips, repeats, rolls and scatters into views (``lowering/views.py``) as generated
kernels: each op against eager over dtypes, odd and tiny shapes, non-contiguous inputs and
negative dims and pads, with no ATen fallback; fusion with producers and consumers by kernel
count; and the generated source (clamped, never out-of-range, source indices; no gathers).

The matrices of cases x dtype run each case in one dtype by default, the dtypes taken in turn
(``by_dtype``); ``pytest --full`` runs each case in every dtype."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import Args, check, check_lowered, diagonal, kernel_count, kernels

f32, bf16, i64, b1 = torch.float32, torch.bfloat16, torch.int64, torch.bool
DTYPES = [f32, bf16, i64]


def make(shape: tuple[int, ...], dtype: torch.dtype = f32, layout: str = "contiguous") -> torch.Tensor:
    """Fresh random values of ``shape`` in ``dtype``, laid out contiguously, transposed (the
    last two dims swapped in memory) or as a strided slice of a larger tensor."""
    def values(s: tuple[int, ...]) -> torch.Tensor:
        if dtype == b1:
            return torch.rand(s) > 0.5
        if dtype == i64:
            return torch.randint(-100, 100, s)
        return torch.randn(s).to(dtype)

    if layout == "transposed":
        return values(shape[:-2] + (shape[-1], shape[-2])).transpose(-1, -2)
    if layout == "sliced":
        return values(shape[:-1] + (2 * shape[-1] + 1,))[..., 1::2]
    return values(shape)


def lowered(fn: Callable[..., Any], *args: Any, kernels_expected: int | None = 1) -> str:
    """``check_lowered``, the kernel count, and the generated source (no gather in it: views
    read their inputs at computed indices, never through loaded positions)."""
    check_lowered(fn, *args)
    if kernels_expected is not None:
        assert kernel_count() == kernels_expected
    source = "\n".join(kernels().values())
    assert "device_assert" not in source
    return source


LAYOUTS = ["contiguous", "transposed", "sliced"]


def by_dtype(cases: list[Any], spread: bool = False, join: str = "-") -> list[Any]:
    """Params of each case (with ``spread``, a tuple of several arguments) and a dtype of DTYPES,
    the last argument: by default each case in one dtype, taken in turn (``helpers.diagonal``)."""
    return diagonal({join.join(map(str, c)) if spread or join != "-" else str(c): Args(c) if spread else c
                     for c in cases}, {str(d): d for d in DTYPES})

# ------------------------------------------------------------------------------------ pads


@pytest.mark.parametrize("pad,dtype", by_dtype([(1, 2), (1, 2, -1, 1), (0, 0, 2, 0), (-1, -2), (3, -1, 0, 2, 1, 1)],
                                               join="_"))
def test_constant_pad(dtype: torch.dtype, pad: tuple[int, ...]) -> None:
    value = 7 if dtype == i64 else -1.5
    source = lowered(lambda x: F.pad(x, pad, value=value), make((3, 4, 5), dtype))
    if any(p > 0 for p in pad):
        assert "tl.where(" in source  # the input index is clamped into range


@pytest.mark.parametrize("layout", LAYOUTS)
def test_constant_pad_of_non_contiguous_input(layout: str) -> None:
    lowered(lambda x: F.pad(x, (2, 1, 1, 3)), make((3, 5, 4), f32, layout))


@pytest.mark.parametrize("shape,pad", [((1,), (2, 3)), ((1, 1), (0, 1, 1, 0)), ((2,), (-1, 1)), ((7, 1), (1, 1))])
def test_constant_pad_of_tiny_tensors(shape: tuple[int, ...], pad: tuple[int, ...]) -> None:
    lowered(lambda x: F.pad(x, pad, value=3.0), make(shape))


def test_constant_pad_of_bool() -> None:
    lowered(lambda x: F.pad(x, (1, 1), value=True), make((3, 4), b1))


def test_pad_then_pointwise_is_one_kernel() -> None:
    source = lowered(lambda x: F.pad(x, (1, 2, 0, 1)) * 2 + 1, make((4, 6)))
    assert source.count("tl.load(") == 1 and source.count("tl.store(") == 1


def test_pad_of_a_computed_tensor_is_one_kernel() -> None:
    # the pad's producer is inlined at the clamped index: nothing is stored in between
    source = lowered(lambda x, b: F.pad(torch.relu(x + b), (1, 1, 1, 1)), make((2, 3, 5)), make((5,)))
    assert source.count("tl.store(") == 1


def test_pad_fuses_into_a_reduction() -> None:
    lowered(lambda x: F.pad(x, (2, 3), value=1.0).sum(-1), make((6, 5)))


def test_pads_backward_crops() -> None:
    # constant_pad_nd's gradient is a constant_pad_nd with negative pads (a crop)
    x = make((3, 4, 5)).requires_grad_()
    w = make((3, 6, 8))

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (F.pad(x, (1, 2, 0, 2)) * w).sum()

    expected = torch.autograd.grad(loss(x, w), x)[0]
    compiled = torch.compile(loss, backend="fuse", fullgraph=True)
    actual = torch.autograd.grad(compiled(x, w), x)[0]
    torch.testing.assert_close(actual, expected)
    assert not fusebackend.metrics.fallbacks


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("shape,pad", [((2, 5), (2, 1)), ((1, 2, 4, 3), (1, 2, 2, 0)), ((1, 1, 3, 3, 2), (1, 1, 2, 2, 1, 0))],
                         ids=["1d", "2d", "3d"])
def test_reflection_and_replication_pads(mode: str, shape: tuple[int, ...], pad: tuple[int, ...]) -> None:
    lowered(lambda x: F.pad(x, pad, mode=mode), make(shape))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_reflection_and_replication_pads_bf16_transposed(mode: str) -> None:
    lowered(lambda x: F.pad(x, (2, 2, 1, 1), mode=mode) + 1, make((2, 5, 4), bf16, "transposed"))


# ------------------------------------------------------------------- flip, repeat, roll


@pytest.mark.parametrize("dims,dtype", by_dtype([(0,), (-1,), (0, 2), (0, 1, 2)]))
def test_flip(dtype: torch.dtype, dims: tuple[int, ...]) -> None:
    lowered(lambda x: torch.flip(x, dims), make((3, 4, 5), dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_flip_of_non_contiguous_input(layout: str) -> None:
    lowered(lambda x: torch.flip(x, (-1, -2)) * x, make((3, 4, 5), f32, layout))


@pytest.mark.parametrize("repeats,dtype", by_dtype([(2, 1), (1, 3), (2, 1, 2), (1, 1)]))
def test_repeat(dtype: torch.dtype, repeats: tuple[int, ...]) -> None:
    lowered(lambda x: x.repeat(*repeats), make((3, 5), dtype))


@pytest.mark.parametrize("fn,shape,layout", [
    (lambda x: x.repeat(2, 1, 3) + 1, (3, 4), "transposed"),
    (lambda x: torch.tile(x, (2,)), (3, 4), "sliced"),
    (lambda x: x.repeat(3, 2), (1, 1), "contiguous"),
], ids=["repeat_transposed", "tile_sliced", "repeat_one_element"])
def test_repeat_and_tile_of_non_contiguous_inputs(fn: Callable[..., Any], shape: tuple[int, ...], layout: str) -> None:
    lowered(fn, make(shape, f32, layout))


@pytest.mark.parametrize("shifts,dims,dtype", by_dtype([(2, 1), (-1, 0), ((1, -2), (0, -1)), (7, 2), (3, None),
                                                       (-13, None)], spread=True))
def test_roll(dtype: torch.dtype, shifts: Any, dims: Any) -> None:
    lowered(lambda x: torch.roll(x, shifts, dims), make((3, 4, 5), dtype))


def test_roll_of_a_computed_transposed_tensor_is_one_kernel() -> None:
    lowered(lambda x: torch.roll(x.exp(), (1, 2), (0, 1)) * 2, make((4, 6), f32, "transposed"))


# --------------------------------------------------------------------------- scatters


@pytest.mark.parametrize("dim,start,end,step,dtype", by_dtype(
    [(1, 1, 4, 1), (1, 1, 6, 2), (-1, -3, None, 1), (0, None, 2, 1), (2, 0, 7, 3), (0, 2, 3, 1)], spread=True))
def test_slice_scatter(dtype: torch.dtype, dim: int, start: Any, end: Any, step: int) -> None:
    x = make((3, 6, 7), dtype)
    src = make(tuple(x[(slice(None),) * (dim % 3) + (slice(start, end, step),)].shape), dtype)
    lowered(lambda x, s: torch.slice_scatter(x, s, dim, start, end, step), x, src)


def test_slice_scatter_of_non_contiguous_inputs() -> None:
    x, src = make((4, 5), f32, "transposed"), make((4, 2), f32, "sliced")
    lowered(lambda x, s: torch.slice_scatter(x, s, 1, 1, 5, 2) * 3, x, src)


def test_in_place_slice_update_is_one_kernel() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[:, 1:3] += 1
        y[:, -1] = x[:, 0]
        y[1:, ::2].fill_(0.5)
        return y

    lowered(fn, make((3, 5)))


@pytest.mark.parametrize("dim,index,dtype", by_dtype([(0, 1), (1, -1), (-1, 0), (2, 4)], spread=True))
def test_select_scatter(dtype: torch.dtype, dim: int, index: int) -> None:
    x = make((3, 4, 5), dtype)
    src = make(tuple(x.select(dim, index).shape), dtype)
    lowered(lambda x, s: torch.select_scatter(x, s, dim, index), x, src)


@pytest.mark.parametrize("offset,dim1,dim2,dtype", by_dtype([(0, 0, 1), (1, 0, 1), (-2, 0, 1), (1, -1, 0), (0, 2, 0),
                                                             (-1, 1, 2)], spread=True))
def test_diagonal_scatter(dtype: torch.dtype, offset: int, dim1: int, dim2: int) -> None:
    x = make((4, 5, 3), dtype)
    src = make(tuple(torch.diagonal(x, offset, dim1, dim2).shape), dtype)
    lowered(lambda x, s: torch.diagonal_scatter(x, s, offset, dim1, dim2), x, src)


@pytest.mark.parametrize("n,layout", [(4, "transposed"), (1, "contiguous")])
def test_diagonal_scatter_transposed_and_tiny(n: int, layout: str) -> None:
    lowered(lambda x, s: torch.diagonal_scatter(x, s, 0), make((n, n), f32, layout), make((n,)))


@pytest.mark.parametrize("size,stride,offset,dtype", by_dtype(
    [((2, 2), (5, 2), 1), ((3,), (4,), 2), ((2, 3), (1, 6), 0), ((1, 4), (9, 1), 21), ((2, 2, 2), (12, 4, 1), 3)],
    spread=True))
def test_as_strided_scatter(dtype: torch.dtype, size: tuple[int, ...], stride: tuple[int, ...], offset: int) -> None:
    x = make((5, 5), dtype)
    src = make(size, dtype)
    lowered(lambda x, s: torch.as_strided_scatter(x, s, size, stride, offset), x, src)


def test_as_strided_scatter_of_an_overlapping_window_stays_aten() -> None:
    x, src = make((4, 4)), make((2, 3))
    check(lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (2, 1), 0), x, src)
    assert fusebackend.metrics.fallbacks["as_strided_scatter"] == 1


def test_scatter_then_reduce_is_one_kernel() -> None:
    x, src = make((6, 8)), make((6, 3))
    lowered(lambda x, s: torch.slice_scatter(x, s.exp(), 1, 2, 5).sum(-1), x, src)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)


def _rotary_after_the_first_token(x, w, qb, vb, rope):
    # EVA-02's attention (timm): q and k from one projection, rotary on every token but the first
    b, n, c = x.shape
    qkv = F.linear(x, w, torch.cat((qb, torch.zeros_like(qb), vb)))
    q, k, v = qkv.reshape(b, n, 3, 2, -1).permute(2, 0, 3, 1, 4).unbind(0)
    sin, cos = rope.chunk(2, -1)
    q = torch.cat([q[:, :, :1], q[:, :, 1:] * cos + _rotate_pairs(q[:, :, 1:]) * sin], dim=2)
    k = torch.cat([k[:, :, :1], k[:, :, 1:] * cos + _rotate_pairs(k[:, :, 1:]) * sin], dim=2)
    return F.scaled_dot_product_attention(q, k, v)


def test_a_slice_backward_that_shifts_an_index_below_zero() -> None:
    # The backward of q[:, :, 1:] over the projection's reshape indexed (i - 1023) % 16 and
    # (i - 1023) // 16: right for floor division, which the index rules assume, and NaN gradients
    # where a kernel's % and // truncated. The constant's floor remainder now stays inside.
    args = [torch.randn(2, 17, 32), torch.randn(96, 32), torch.randn(32), torch.randn(32), torch.randn(16, 32)]
    for a in args[:4]:
        a.requires_grad_(True)
    grad = torch.randn(2, 2, 17, 16)
    want = torch.autograd.grad(_rotary_after_the_first_token(*args), args[:4], grad)
    got = torch.autograd.grad(torch.compile(_rotary_after_the_first_token, backend="fuse")(*args), args[:4], grad)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    assert fusebackend.metrics.eager_graphs == 0


def _stacked_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # attention's q, k and v gradients stacked along a dim of 3 by select_scatters into zeros,
    # stored, and summed over the rows (the qkv projection's bias gradient)
    out = torch.zeros(q.shape[0], 3, q.shape[1], dtype=q.dtype)
    for i, part in enumerate((q * 0.5, k, v)):
        out = torch.select_scatter(out, part, 1, i)
    return out, out.sum(0)


@pytest.mark.parametrize("rows, width", [(64, 96), (37, 40), (5, 3)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_part_of_a_select_scatter_is_read_only_where_it_is_taken(rows: int, width: int,
                                                                      dtype: torch.dtype) -> None:
    # every element takes one of the three parts; each part's load is masked by its condition
    # (tl.load(..., cond & xmask)), so that a block of another part's columns reads nothing
    # of it. k arrives transposed (non-contiguous).
    q, v = torch.randn(rows, width, dtype=dtype), torch.randn(rows, width, dtype=dtype)
    k = torch.randn(width, rows, dtype=dtype).t()
    check(_stacked_gradients, q, k, v)
    assert kernel_count() == 1, fusebackend.last_compiled().schedule
    (src,) = kernels().values()
    part_loads = [line for line in src.splitlines() if "tl.load(" in line]
    assert len(part_loads) == 3, src
    conditions = [re.search(r"\), (tmp\d+) & [xr]mask", line) for line in part_loads]
    assert all(conditions), src  # a condition before the block's mask
    assert len({c.group(1) for c in conditions}) == 3, src


def test_a_where_on_data_keeps_its_loads_unmasked() -> None:
    # a ReLU's backward: where(x > 0, g, 0) decides by a loaded value, lane by lane; g's load
    # keeps the block's mask alone
    check(lambda x, g: torch.where(x > 0, g, 0.0), torch.randn(33, 7), torch.randn(33, 7))
    (src,) = kernels().values()
    loads = [line for line in src.splitlines() if "tl.load(" in line]
    assert len(loads) == 2 and all(line.rstrip(")").endswith("xmask, other=0") for line in loads), src


def _bn_pad_depthwise(x, mean, var, w, b, taps):
    # inference batch norm and ReLU6, zero-padded, then a 3x3 depthwise convolution (the
    # blocks of transformers' MobileNetV2 and EfficientNet, which pad as TensorFlow does)
    y = F.hardtanh((x - mean[:, None, None]) * torch.rsqrt(var[:, None, None] + 1e-3) * w[:, None, None]
                   + b[:, None, None], 0.0, 6.0)
    return F.conv2d(F.pad(y, (1, 1, 1, 1)), taps, groups=x.shape[1])


# float32 only: in bf16 the batch norm and ReLU6 (21 instructions an element) are stored before the
# window, not evaluated at its 9 taps (17-27 instructions per byte saved, above OPS_PER_BYTE_SAVED);
# a (1, 3, 5, 4) image fused in bf16 only while a tensor under half its reader's size (the image,
# 60 elements, against its pad's 126) counted as read broadcast (ONE_TO_ONE was 2)
@pytest.mark.parametrize("shape, dtype, layout", [((2, 8, 9, 11), f32, "contiguous"), ((1, 3, 5, 4), f32, "sliced"),
                                                   ((2, 4, 1, 7), f32, "transposed")], ids=str)
def test_a_padded_window_reads_each_per_channel_value_once(shape: tuple[int, ...], dtype: torch.dtype,
                                                          layout: str) -> None:
    # each of the convolution's 9 taps is a branch of the pad's where; the batch norm's four
    # per-channel values are read unmasked by it (inside the tensor everywhere, and small), so
    # that one load serves every tap: no per-channel address is loaded twice (x, the first
    # load, is read at each tap, at one address for several where the image is one row high)
    c = shape[1]
    x = make(shape, dtype, layout)
    mean, w, b = (torch.randn(c, dtype=dtype) for _ in range(3))
    var, taps = (torch.rand(c) + 0.5).to(dtype), torch.randn(c, 1, 3, 3, dtype=dtype)
    check(_bn_pad_depthwise, x, mean, var, w, b, taps)
    assert kernel_count() == 1 and not fusebackend.metrics.fallbacks, fusebackend.last_compiled().schedule
    (src,) = kernels().values()
    addresses = [re.search(r"tl\.load\((in_ptr\d+ \+ \(.*?\))(?:, |\)$)", line).group(1)
                 for line in src.splitlines() if "tl.load(" in line]
    image = addresses[0].split(" + ")[0]
    per_channel = [a for a in addresses if not a.startswith(image + " + ")]
    assert len(per_channel) == len(set(per_channel)) == 4 + 9, src  # the four values, the 9 taps' weights


@pytest.mark.parametrize("shape, kernel, stride, padding", [((2, 4, 9, 11), 3, 1, 1), ((1, 3, 12, 7), 3, 2, 1),
                                                         ((2, 2, 10, 10), 5, 2, 2), ((1, 5, 2, 3), 5, 1, 2)], ids=str)
def test_a_padded_window_addresses_its_taps_without_clamps(shape: tuple[int, ...], kernel: int, stride: int,
                                                          padding: int) -> None:
    # each tap's source index (a * w + s) is inside the image where the tap is taken, which
    # its bounds prove (codegen.branches.branch_facts): no tap's load clamps its index
    c = shape[1]
    x, taps = make(shape, f32, "transposed"), torch.randn(c, 1, kernel, kernel)
    check(lambda x, t: F.conv2d(torch.relu(x), t, stride=stride, padding=padding, groups=c), x, taps)
    assert kernel_count() == 1 and not fusebackend.metrics.fallbacks, fusebackend.last_compiled().schedule
    (src,) = kernels().values()
    loads = [line for line in src.splitlines() if "tl.load(" in line]
    assert len(loads) >= kernel * kernel and not [line for line in loads if "tl.where(" in line], src


@pytest.mark.parametrize("shape", [(2, 4, 9, 11), (1, 3, 2, 3), (3, 2, 16, 8)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_a_zero_pads_taps_are_their_masked_loads(shape: tuple[int, ...], dtype: torch.dtype, layout: str) -> None:
    # a zero pad's where(inside, x, 0): x's load is masked by `inside` with other=0, so the
    # where adds nothing and is not rendered (codegen.branches.where_in_branches); a pad of
    # another value keeps it
    c = shape[1]
    x, taps = make(shape, dtype, layout), torch.randn(c, 1, 3, 3, dtype=dtype)
    check(lambda x, t: F.conv2d(F.pad(x * 2, (1, 1, 1, 1)), t, groups=c), x, taps)
    sources = list(kernels().values())  # the pad in the window's kernel, or stored before it
    assert sum(src.count("other=0") for src in sources) >= 1, sources
    assert not any("tl.where(" in src for src in sources), sources
    check(lambda x: F.pad(x * 2, (1, 1, 1, 1), value=3.0) + 1, x)
    sources = list(kernels().values())
    assert any("tl.where(" in src for src in sources), sources
    # a negated load gives -0 outside, the pad +0: the where stays (1 / +0 is +inf, 1 / -0 -inf)
    check(lambda x: 1 / F.pad(-x, (1, 1, 1, 1)), x)
    out = torch.compile(lambda x: 1 / F.pad(-x, (1, 1, 1, 1)), backend="fuse")(x)
    assert (out[..., 0, :] == float("inf")).all()


def _pairs_backward(g: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    # the backward of an interleaved rotary embedding (x * cos + rot(x) * sin, rot(x) pairing
    # (-x[2i + 1], x[2i])): t = g * sin read in pairs, scattered into every other position
    t = (g * sin).unflatten(-1, (-1, 2))
    z = torch.zeros_like(g)
    evens = torch.slice_scatter(z, t[..., 1], dim=-1, start=0, step=2)
    odds = torch.slice_scatter(z, -t[..., 0], dim=-1, start=1, step=2)
    return g * cos + evens + odds


@pytest.mark.parametrize("shape", [(6, 3, 64), (5, 16), (2, 7, 6)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_scatter_with_a_step_of_two_reads_its_pairs_at_once(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    # Where a branch of the where is taken its slice_scatter's source index is in the slice
    # (no clamp: codegen.branches.branch_facts), and the pairs are read by one contiguous load each,
    # their element taken in registers (th.pair_take), not element by element at 2 * (d // 2)
    # + 1 and at the odd lanes' 2 * ((d + 1) // 2) - 2. g arrives transposed in its first dims
    # (3-d), or as a slice of wider rows (2-d).
    if len(shape) == 3:
        g = torch.randn(shape[1], shape[0], shape[2], dtype=dtype).transpose(0, 1)
    else:
        g = torch.randn(shape[0], shape[1] + 2, dtype=dtype)[:, 2:]
    sin, cos = torch.randn(shape[-1], dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    check(_pairs_backward, g, sin, cos)
    assert kernel_count() == 1, fusebackend.last_compiled().schedule
    (src,) = kernels().values()
    loads = [line for line in src.splitlines() if "tl.load(" in line]
    assert all("tl.where(" not in line and "// 2)" not in line for line in loads), src
    assert src.count("th.pair_take") == 4, src  # g and sin, element 1 for the evens and 0 for the odds


def test_a_pair_read_whose_other_element_leaves_the_tensor_stays_a_gather() -> None:
    # x[:, ::2] of rows of 7, each element twice: the pairs' other elements are x[:, 1::2] and,
    # after the last, the next row's first, past the tensor's end after the last row; the load
    # reads 2 * (d // 2) as it is
    x = torch.randn(3, 7)
    check(lambda x: torch.stack([x[:, ::2], -x[:, ::2]], -1).flatten(1) * 2.0, x)
    (src,) = kernels().values()
    assert "pair_take" not in src and "2*((xindex % 8) // 2)" in src, src
    # rows of 8: every pair is whole, and the load is one contiguous block
    check(lambda x: torch.stack([x[:, ::2], -x[:, ::2]], -1).flatten(1) * 2.0, torch.randn(3, 8))
    assert any("pair_take" in s for s in kernels().values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_pairs_are_read_at_once_in_a_column_reduction(dtype: torch.dtype) -> None:
    # EVA-02's bias gradient: the rotary backward of three heads of 16, summed over the tokens
    # of each batch, a head's 16 columns a block (their quotient by the head is the block's)
    g = torch.randn(40, 3 * 16, dtype=dtype)
    sin, cos = torch.randn(16, dtype=dtype), torch.randn(16, dtype=dtype)

    def bias_gradient(g: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dx = _pairs_backward(g.unflatten(-1, (3, 16)), sin, cos).flatten(-2)
        return dx, dx.float().sum(0)

    check(bias_gradient, g, sin, cos)
    sources = "\n".join(kernels().values())
    assert "tl.reduce" in sources and sources.count("th.pair_take_2d(") >= 4, sources
