"""Pointwise kernels with a transposed load are tiled: [YBLOCK, XBLOCK] blocks read along the
input's contiguous dim and write along the output's (``codegen/pointwise.py``). Every test
compares with eager; the generated source shows which kernels were tiled and their index math."""

from __future__ import annotations

import re

import pytest
import torch

import fusebackend
from helpers import assert_same, check, kernel_count, kernels

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _source() -> str:
    (source,) = kernels().values()
    return source


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transpose_copy_is_tiled(dtype: torch.dtype) -> None:
    x = torch.randn(48, 80).to(dtype)
    check(lambda x: x.t().contiguous(), x)
    source = _source()
    assert "# tiled: 80 (y) by 48 (x)" in source
    # the input is read along y (its contiguous dim), the output written along x
    assert "tl.load(in_ptr0 + (80*x_inner + y_index))" in source
    assert "tl.store(out_ptr0 + (x_inner + 48*y_index), tmp0)" in source
    assert "xmask" not in source


def test_transpose_with_pointwise_work_and_a_broadcast_vector() -> None:
    def fn(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (torch.sigmoid(x.transpose(1, 2)) * 2 + b).contiguous()

    check(fn, torch.randn(3, 32, 24), torch.randn(32))
    assert kernel_count() == 1
    source = _source()
    assert "tiled: 24 (y) by 32 (x) elements per 3 outer block(s)" in source
    assert "tl.load(in_ptr1 + (x_inner))" in source  # the vector varies along x only


def test_attention_head_split_is_tiled_with_plain_indices() -> None:
    # k of a fused qkv projection, [batch, seq, 3, heads, head_dim] -> [batch, heads, head_dim, seq]
    b, s, h, d = 2, 64, 4, 16
    qkv = torch.randn(b, s, 3 * h * d)

    def fn(qkv: torch.Tensor) -> torch.Tensor:
        k = qkv.view(b, s, 3, h, d).permute(2, 0, 3, 4, 1)[1]
        return k.contiguous()

    check(fn, qkv)
    source = _source()
    assert "tiled: 16 (y) by 64 (x)" in source
    load = next(line for line in source.splitlines() if "tl.load(" in line)
    # x_outer runs over (batch, head); the tile variables appear only as plain terms
    assert load.strip() == ("tmp0 = tl.load(in_ptr0 + (192*x_inner + y_index + 12288*(x_outer // 4)"
                            " + 16*(x_outer % 4) + 64))")


def test_non_contiguous_input_and_two_outputs() -> None:
    # a sliced, transposed input; both outputs stored from the same tile
    x = torch.randn(40, 70)[:, 3:67]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.t()
        return (t * 3).contiguous(), (t + 1).contiguous()

    check(fn, x)
    source = _source()
    assert "tiled:" in source and source.count("tl.store(") == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_outputs_in_different_dim_orders_are_not_fused(dtype: torch.dtype) -> None:
    # an attention's query kept as it is beside its key transposed ([b, s, d] and [b, d, s]):
    # one flat index cannot read both along their rows, and no tile serves both (their dims
    # differ), so the transposed copy is a kernel of its own, tiled, and the fusion is refused
    # with the reason (a shared read is all it would save)
    x = torch.randn(8, 128, 257)[..., 1:].to(dtype)  # 1 MiB or more stored in all, not contiguous
    check(lambda x: (x * 2.0, (x + 1.0).transpose(1, 2).contiguous()), x)
    assert kernel_count() == 2
    assert sum("tiled:" in source for source in kernels().values()) == 1
    assert "outputs laid out in different dim orders" in fusebackend.last_compiled().schedule


def test_outputs_of_small_kernels_in_different_dim_orders_fuse() -> None:
    # under a mebibyte in all a kernel is bound by its launch: one kernel
    x = torch.randn(4, 16, 24)
    check(lambda x: (x * 2.0, (x + 1.0).transpose(1, 2).contiguous()), x)
    assert kernel_count() == 1


def test_ragged_extents_stay_flat() -> None:
    # 50 and 6 have no power-of-two factor of 8 or more: no exact tiles, the flat kernel stays
    check(lambda x: x.t().contiguous(), torch.randn(6, 50))
    source = _source()
    assert "tiled" not in source and "xindex" in source


def test_permute_keeping_the_fastest_dim_stays_flat() -> None:
    # the input is contiguous along the output's fastest dim already: nothing to tile
    check(lambda x: x.permute(0, 2, 1, 3).contiguous(), torch.randn(2, 16, 8, 16))
    assert "tiled" not in _source()


def test_tiled_kernel_with_many_outer_blocks_and_odd_sizes() -> None:
    x = torch.randn(7, 24, 40)
    check(lambda x: torch.relu(x.transpose(-1, -2)).contiguous(), x)
    source = _source()
    assert "tiled: 40 (y) by 24 (x) elements per 7 outer block(s)" in source


@pytest.mark.parametrize(("dtype", "hw", "block"), [(torch.float32, (14, 14), 32), (torch.bfloat16, (7, 7), 32),
                                                   (torch.float16, (3, 5), 8)], ids=str)
def test_a_transpose_over_an_extent_no_block_divides_shifts_its_last_block(dtype: torch.dtype, hw: tuple[int, int],
                                                                           block: int) -> None:
    """A channels-last map written contiguous (NCHW): the output's fastest extent is the h * w
    positions, which no block of 8 or more divides at 14x14 (196), 7x7 or 3x5. The tile along
    them ends with a block shifted back to end at the extent's end, overlapping the one before:
    no masks, indices a start plus ``tl.arange`` (clamped indices are not coalesced), and no
    output written over an input."""
    h, w = hw
    x = torch.randn(3, 40, h, w).to(dtype).to(memory_format=torch.channels_last)
    check(lambda x: (torch.sigmoid(x) * 2).contiguous(), x)
    source = _source()
    positions = h * w
    assert f"tiled: 40 (y) by {positions} (x) elements per 3 outer block(s)" in source
    assert "the last block along x shifted back to end at the extent's end: no masks" in source
    last = positions - block
    multiple = __import__("math").gcd(block, last)
    shifted = f"tl.minimum((pid % x_tiles) * XBLOCK, {last})"
    assert (f"x_inner_start = tl.multiple_of({shifted}, {multiple})" if multiple > 1 else f"x_inner_start = {shifted}") in source
    assert "x_inner = x_inner_start + tl.arange(0, XBLOCK)[None, :]" in source
    assert "xcmask" not in source and "ymask" not in source and "xindex" not in source


def test_a_ragged_tile_in_both_axes_is_right_at_odd_sizes() -> None:
    x = torch.randn(2, 36, 7, 7).to(memory_format=torch.channels_last)  # 36 channels, 49 positions
    check(lambda x: torch.relu(x).contiguous() + 1, x)
    source = _source()
    assert "shifted back" in source and "y_index_start = " in source and "x_inner_start = " in source


def test_an_extent_under_eight_keeps_the_flat_kernel() -> None:
    x = torch.randn(4, 40, 2, 3).to(memory_format=torch.channels_last)  # 6 positions
    check(lambda x: (x * 2).contiguous(), x)
    assert "tiled" not in _source()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_3x3_weight_made_channels_last_is_tiled_over_its_nine_positions(dtype: torch.dtype) -> None:
    # (K, C, 3, 3) into (K, 3, 3, C): the load is contiguous along the 3 of the kernel's width,
    # too thin a tile, and along its 9 positions together: y merges both kernel dims
    w = torch.randn(6, 40, 3, 3).to(dtype)
    check(lambda w: (w * 2).contiguous(memory_format=torch.channels_last), w)
    source = _source()
    assert "# tiled: 9 (y) by 40 (x) elements per 6 outer block(s)" in source
    assert "shifted back" in source  # 9 rows: the last block of 8 ends at the ninth


def test_a_strided_3x3_weight_made_channels_last_is_right() -> None:
    w = torch.randn(5, 48, 3, 3)[:, ::2]  # every other input channel: 24 of them, 18 apart
    check(lambda w: (w + 1).contiguous(memory_format=torch.channels_last), w)
    assert "# tiled: 9 (y) by 24 (x) elements per 5 outer block(s)" in _source()


def test_a_channels_last_weight_made_contiguous_is_tiled_over_its_channels() -> None:
    w = torch.randn(6, 40, 3, 3).to(memory_format=torch.channels_last)  # a weight's gradient, back
    check(lambda w: (w * 2).contiguous(), w)
    assert "# tiled: 40 (y) by 9 (x) elements per 6 outer block(s)" in _source()


def test_a_thin_tile_is_widened_along_its_other_extent() -> None:
    from fusebackend.kernels import runtime

    assert runtime.tile_config(9, 2560)["XBLOCK"] == 128 and runtime.tile_config(9, 2560)["YBLOCK"] == 8
    assert runtime.tile_config(2560, 9)["YBLOCK"] == 128 and runtime.tile_config(2560, 9)["XBLOCK"] == 8
    assert runtime.tile_config(9, 320)["XBLOCK"] == 64  # 128 does not divide 320
    assert runtime.tile_config(64, 64) == {**runtime.tile_config(64, 64), "XBLOCK": 64, "YBLOCK": 64}


# ------------------------------------------------ column tiles: per-channel values of NHWC tensors


def _batch_norm_nhwc(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, w: torch.Tensor,
                     b: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.nn.functional.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5))


def _bn_inputs(n: int, c: int, h: int, w: int, dtype: torch.dtype) -> list[torch.Tensor]:
    x = torch.randn(n, c, h, w).to(dtype).to(memory_format=torch.channels_last)
    return [x, torch.randn(c).to(dtype), (torch.rand(c) + 0.5).to(dtype), torch.randn(c).to(dtype),
            torch.randn(c).to(dtype)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_norm_of_a_channels_last_tensor_is_column_tiled(dtype: torch.dtype) -> None:
    check(_batch_norm_nhwc, *_bn_inputs(2, 64, 5, 4, dtype))
    assert kernel_count() == 1
    source = _source()
    assert "# tiled: 40 rows (y) of 64 columns (x)" in source
    # the per-channel values are [1, XBLOCK] blocks: the root is taken once per column of a block
    for k in range(1, 5):
        assert f"tl.load(in_ptr{k} + (x_inner))" in source
    assert "tl.load(in_ptr0 + (x_inner + 64*y_index))" in source
    assert "xmask" not in source
    # 1 / sqrt(var + eps) is one rsqrt, not a correctly rounded root and division (body.py)
    assert source.count("tl.rsqrt(") == 1 and "th.div(" not in source and "th.sqrt(" not in source


def test_small_batch_norm_stays_flat_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a GPU a kernel under runtime.SMALL_POINTWISE elements is one wave, which flat blocks of
    # 512 finish sooner than tiles; the interpreter tiles at every size (the test above).
    from fusebackend.codegen import pointwise
    from fusebackend.kernels import runtime

    monkeypatch.setattr(pointwise, "use_interpreter", lambda: False)  # the tiling choice alone
    check(_batch_norm_nhwc, *_bn_inputs(2, 64, 5, 4, torch.bfloat16))
    source = _source()
    assert "rows (y) of" not in source and "YBLOCK" not in source
    monkeypatch.setattr(runtime, "SMALL_POINTWISE", 0)  # another shape: not the cached graph's
    torch._dynamo.reset()  # compiled for its sizes again, not for every size (automatic dynamic shapes)
    check(_batch_norm_nhwc, *_bn_inputs(4, 64, 5, 2, torch.bfloat16))
    assert "# tiled: 40 rows (y) of 64 columns (x)" in _source()


@pytest.mark.parametrize("shape", [(2, 24, 5, 4), (1, 64, 1, 3), (4, 48, 7, 4)], ids=str)
def test_column_tiles_need_blocks_that_divide(shape: tuple[int, ...]) -> None:
    # 24 channels: blocks of 8 columns are too narrow; 3 rows: too few; 48 x 112: both divide
    check(_batch_norm_nhwc, *_bn_inputs(*shape, torch.float32))
    source = _source()
    assert ("rows (y) of" in source) == (shape == (4, 48, 7, 4))


def test_one_per_column_load_stays_flat() -> None:
    x = torch.randn(2, 64, 4, 4).to(memory_format=torch.channels_last)
    check(lambda x, b: torch.relu(x + b.view(1, -1, 1, 1)), x, torch.randn(64))
    assert "tiled" not in _source()


def test_one_tensor_read_at_two_offsets_stays_flat() -> None:
    # rotary embeddings' cos(cat([f, f])) over [positions, 2 * half]: one per-column tensor read at
    # two offsets is not two per-column tensors (nothing is computed once per column), nor a window
    pos, freq = torch.randn(64), torch.randn(16)

    def fn(pos: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
        angles = pos[:, None] * freq[None, :]
        return torch.cat([angles, angles], dim=-1).cos()

    check(fn, pos, freq)
    assert kernel_count() == 1
    assert "tiled" not in _source()


def test_kernel_without_loads() -> None:
    # a causal mask from two aranges: a 2-d output, no tensor read (no column tile to weigh)
    def fn(x: torch.Tensor) -> torch.Tensor:
        r = torch.arange(16, dtype=x.dtype)
        return (r[None, :] >= r[:, None]).to(x.dtype) * 3

    check(fn, torch.randn(3))
    assert kernel_count() == 1
    assert "reads 0 B" in _source()


def test_column_tiles_off() -> None:
    import fusebackend

    with fusebackend.config.patch(column_tiles=False):
        check(_batch_norm_nhwc, *_bn_inputs(2, 64, 5, 4, torch.float32))
    assert "tiled" not in _source()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_column_tile_over_a_symbolic_batch_masks_its_rows(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Symbolic sizes: with the batch symbolic, the rows (y) are a symbolic count and the columns the
    static channels. The blocks cannot divide the rows at every size: the rows past the end are
    not stored, and read the last row again, so that the per-channel loads stay [1, XBLOCK]
    blocks with no mask. One compile serves every batch, odd ones included."""
    from fusebackend.kernels import runtime

    monkeypatch.setattr(runtime, "SMALL_POINTWISE", 0)  # on a GPU too, where kernels this small stay flat
    compiled = torch.compile(_batch_norm_nhwc, backend="fuse")
    params = _bn_inputs(1, 64, 5, 4, dtype)[1:]
    for n in (2, 3, 7, 5, 9):  # (Dynamo compiles a batch of 1 apart: a size of 1 is never symbolic)
        x = torch.randn(n, 64, 5, 4).to(dtype).to(memory_format=torch.channels_last)
        torch._dynamo.mark_dynamic(x, 0)
        assert_same(compiled(x, *params), _batch_norm_nhwc(x, *params))
    assert fusebackend.metrics.graphs_compiled == 1 and not fusebackend.metrics.specialized
    source = _source()
    assert re.search(r"# tiled: \d+\*s\d+ rows \(y\) of 64 columns \(x\).*masked at the stores", source), source
    assert "y_index = tl.minimum(y_index_raw, ysize - 1)" in source and source.count(", ymask)") == 1
    assert "xcmask" not in source  # the channels, static: blocks of columns that divide them
    for k in range(1, 5):
        assert f"tl.load(in_ptr{k} + (x_inner))" in source


def test_a_transpose_over_symbolic_sizes_is_tiled_and_masked() -> None:
    """Symbolic sizes: both extents of the tile symbolic (``dynamic=True``): blocks chosen at the
    first call's sizes, every load in range (positions past an extent read its last one again),
    the stores masked along both; one compile for every size, odd and tiny ones included."""
    def transposed(x: torch.Tensor) -> torch.Tensor:
        return (x.transpose(1, 2) * 2).contiguous()

    compiled = torch.compile(transposed, backend="fuse", dynamic=True)
    for shape in ((3, 40, 24), (2, 37, 129), (5, 2, 3), (1, 70, 9)):
        x = torch.randn(shape)
        assert_same(compiled(x), transposed(x))
    assert not fusebackend.metrics.specialized and not fusebackend.metrics.not_symbolic
    source = list(kernels().values())[-1]
    assert "masked at the stores" in source and ", ymask & xcmask)" in source
    assert "x_inner = tl.minimum(x_inner_raw, xsize - 1)" in source and "y_index = tl.minimum(y_index_raw, ysize - 1)" in source
    assert "xindex" not in source  # tiled: no flat index


def _three_blocks(x: torch.Tensor) -> torch.Tensor:
    # LongT5's local attention: each block of positions beside its two neighbours, the blocks
    # padded at both ends (a pad, then a concatenation of three shifted slices)
    nb = x.shape[1]
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, 0, 1, 1))
    return torch.cat([padded[:, i:i + nb] for i in range(3)], dim=2)


@pytest.mark.parametrize("shape", [(2, 4, 4, 16, 8), (1, 4, 8, 16, 32), (1, 3, 2, 16, 8)], ids=str)
def test_a_tiled_kernel_whose_parts_are_one_per_program(shape: tuple[int, ...]) -> None:
    # a transposed read makes the kernel tiled, and the pad's and the concatenation's parts are
    # decided by the outer tile index alone (one value a program): their conditions are made
    # tensors (th.as_bool), which the interpreter can use as the loads' masks (it ran the graph
    # eagerly: "mask has unsupported dtype")
    x = torch.randn(*shape).transpose(-1, -2)
    check(_three_blocks, x)
    assert kernel_count() == 1, fusebackend.last_compiled().schedule
    (src,) = kernels().values()
    assert "x_outer" in src and "th.as_bool(" in src, src
