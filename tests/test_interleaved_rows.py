"""Reductions whose rows interleave in memory (``builder._interleave``): rows made of short runs
with other rows' runs between them, such as a GroupNorm of several groups over channels-last
activations, split in two phases: a column reduction over chunks of positions that reads whole
blocks of runs, then each row's partials."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import check, kernels
from test_codegen_choices import _loads

bf16 = torch.bfloat16


def test_group_norm_of_short_channel_runs_splits_over_its_interleaved_rows() -> None:
    # GroupNorm(32) over channels-last [64, 256, 56, 56] (BiT's first stage): each row (n, g) is
    # runs of 8 channels, 16 bytes of bf16 in every 512. Phase 1 is a column reduction over a
    # chunk of positions that reads all 256 channels of a position at once (consecutive columns
    # consecutive in memory); phase 2 reduces each row's chunks x 8 partials; then the output
    from test_fusion_reductions import compile_only

    x = torch.randn(64, 256, 56, 56, dtype=bf16).to(memory_format=torch.channels_last)
    w, b = torch.randn(256, dtype=bf16), torch.randn(256, dtype=bf16)
    art = compile_only(lambda x, w, b: F.relu(F.group_norm(x, 32, w, b)), x, w, b)
    assert art.kernel_count == 3, art.schedule
    (phase1,) = [src for src in art.kernels.values() if "interleaved rows, phase 1" in src]
    assert "column reduction" in phase1
    (load,) = _loads(phase1)  # the mean and the m2 of each column from one read
    assert "256*rindex + xindex" in load and "//" not in load.split("xoffset")[0], load
    assert "split, phase 2" in "".join(art.kernels.values())


def test_interleaved_rows_are_only_short_runs_between_other_rows() -> None:
    from fusebackend.lowering.builder import _interleave

    # GroupNorm(32), channels-last, 256 channels: reduced (h*w: 256, group's channels: 1), kept (n, g)
    found = _interleave([(3136, 256), (8, 1)], [(64, 802816), (32, 8)], 2)
    assert found is not None and (found.inner, found.run, found.outer, found.mid, found.block) == (1, 8, (0,), (1,), 256)
    assert _interleave([(3136, 256), (64, 1)], [(64, 802816), (4, 64)], 2) is None  # 128-byte runs
    assert _interleave([(8, 3136), (3136, 1)], [(64, 802816), (32, 25088)], 2) is None  # contiguous rows
    assert _interleave([(3136, 1)], [(64, 3136)], 2) is None  # one run a row
    assert _interleave([(3136, 512), (8, 1)], [(64, 802816), (32, 16)], 2) is None  # runs apart: not a block


@pytest.mark.parametrize("dtype", [torch.float32, bf16])
def test_group_norm_split_over_interleaved_rows_trains(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    # forward and backward against float64, with 2 channels a group and 49x49 positions, split
    # in 7 chunks (the largest count up to split_count's 9 that divides 2401); the split's size
    # floor lowered so that a small tensor takes it. The backward's sums are per channel (column
    # reductions over N, H, W whose columns are neighbours), then per group: no interleaved rows
    from fusebackend.lowering import builder

    monkeypatch.setattr(builder, "_INTERLEAVE_MIN_ELEMENTS", 1 << 14)
    x = torch.randn(1, 64, 49, 49, dtype=dtype).to(memory_format=torch.channels_last).requires_grad_()
    w, b = (torch.randn(64, dtype=dtype).requires_grad_() for _ in range(2))
    grad = torch.randn(x.shape, dtype=dtype)

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.silu(F.group_norm(x, 32, w, b))

    fusebackend.dump.clear()
    got = torch.autograd.grad(torch.compile(fn, backend="fuse")(x, w, b), (x, w, b), grad)
    (phase1,) = [src for src in kernels().values() if "interleaved rows, phase 1" in src]
    # 7 chunks x 64 channels of fp32 sums and m2s; each column's positions 64 apart
    assert "writes 3584 B" in phase1 and "64*rindex + xindex" in phase1, phase1
    wide = [t.detach().double().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(fn(*wide), wide, grad.double())
    eager = torch.autograd.grad(fn(x, w, b), (x, w, b), grad)
    for g, e, r in zip(got, eager, want):
        assert (g.double() - r).abs().max() <= 2 * (e.double() - r).abs().max() + 1e-6
    assert fusebackend.metrics.eager_graphs == 0


def test_a_sum_over_interleaved_rows_reads_whole_blocks() -> None:
    # [1024, 300, 4] summed over dims 0 and 2: each of the 300 rows is runs of 4 floats 1200
    # apart; phase 1 reads the 1200 floats of a block as neighbouring columns
    x = torch.randn(1024, 300, 4)
    check(lambda x: x.sum((0, 2)), x, atol=1e-3, rtol=1e-4)
    (phase1,) = [src for src in kernels().values() if "interleaved rows, phase 1" in src]
    (load,) = _loads(phase1)
    assert "1200*rindex + xindex" in load, load
