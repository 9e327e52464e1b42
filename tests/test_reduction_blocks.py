"""Blocks of row reductions by how their loads run: rows whose positions are read down a column
of a tensor (more rows a block, for the L1 cache), and rows of an odd length that no vector
divides (one warp a block). The GPU's configs are asked for on this machine (``use_interpreter``
patched off inside the config), and the interpreter runs kernels in them; every run compares
with eager (``check``)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import fusebackend
from fusebackend.kernels import runtime
from helpers import check

bf16 = torch.bfloat16


def _position_scores(scores: torch.Tensor, c2p: torch.Tensor, p2c: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # DeBERTa's disentangled attention: content-to-position scores gathered along the row, and
    # position-to-content scores gathered at the transposed index (a column of p2c per row)
    rows = index.expand(scores.shape)
    c2p_terms = torch.gather(c2p, -1, rows)
    p2c_terms = torch.gather(p2c, -1, rows).transpose(-1, -2)
    return torch.softmax(scores + c2p_terms + p2c_terms, -1)


def test_rows_read_across_take_more_rows_a_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # the GPU's configs: a row of 512 in blocks of 2 rows, but 8 where a load's positions run
    # down a column (p2c's gather and its index, read transposed)
    from test_fusion_reductions import compile_only

    original = runtime.reduction_config

    def cfg(*args: Any, **kwargs: Any) -> dict[str, int]:  # the GPU's, where the kernels are only generated
        with monkeypatch.context() as gpu:
            gpu.setattr(runtime, "use_interpreter", lambda: False)
            return original(*args, **kwargs)

    assert cfg(4096, 512, True, 1) == {"XBLOCK": 2, "RBLOCK": 512, "num_warps": 2}
    assert cfg(8192, 512, True, 1, across_rows=True) == {"XBLOCK": 8, "RBLOCK": 512, "num_warps": 8}
    assert cfg(8192, 128, True, 1, across_rows=True) == {"XBLOCK": 8, "RBLOCK": 128, "num_warps": 2}
    assert cfg(4096, 512, True, 1, across_rows=True)["XBLOCK"] == 2  # fewer than a thousand blocks of 8
    s = 512  # rows of 512: 2 a block by default
    positions = (torch.arange(s)[None, :] - torch.arange(s)[:, None]).clamp(-s // 2, s // 2 - 1) + s // 2
    args = (torch.randn(4, 4, s, s, dtype=bf16), torch.randn(4, 4, s, s, dtype=bf16),
            torch.randn(4, 4, s, s, dtype=bf16), positions)
    monkeypatch.setattr(runtime, "reduction_config", cfg)
    wrapper = compile_only(_position_scores, *args).wrapper
    launches = [line for line in wrapper.splitlines() if "# grid" in line and "_gather" in line]
    assert len(launches) == 1 and "XBLOCK=8, RBLOCK=512, num_warps=8" in launches[0], wrapper
    plain = compile_only(lambda x: torch.softmax(x, -1), args[0]).wrapper
    launches = [line for line in plain.splitlines() if "# grid" in line]
    assert len(launches) == 1 and "XBLOCK=2, RBLOCK=512, num_warps=2" in launches[0], plain


def test_rows_read_across_run_right() -> None:
    torch.manual_seed(0)
    s = 24
    positions = (torch.arange(s)[None, :] - torch.arange(s)[:, None]).clamp(-8, 7) + 8
    check(_position_scores, torch.randn(2, 3, s, s), torch.randn(2, 3, s, 16), torch.randn(2, 3, s, 16), positions)


def _gpu_reduction_configs(monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict[str, int]]:
    """runtime.reduction_config as on a GPU (the kernels only generated, or run in the
    interpreter in the GPU's blocks), set in its place; returned."""
    original = runtime.reduction_config

    def cfg(*args: Any, **kwargs: Any) -> dict[str, int]:
        with monkeypatch.context() as gpu:
            gpu.setattr(runtime, "use_interpreter", lambda: False)
            return original(*args, **kwargs)

    monkeypatch.setattr(runtime, "reduction_config", cfg)
    return cfg


def _windowed_scores(x: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # Swin's window attention softmax: a relative-position bias gathered from its table per head
    n = x.shape[-1]
    bias = table[index].view(n, n, -1).permute(2, 0, 1)
    return torch.softmax(x + bias, -1)


def test_rows_of_an_odd_length_take_one_warp_a_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # rows of 33-64 positions that no vector divides: 8 rows by one warp, so that no row lies
    # over two warps; rows a vector of 2 or more divides keep 16 rows by 2 warps, and other
    # blocks their config
    from test_fusion_reductions import compile_only

    cfg = _gpu_reduction_configs(monkeypatch)
    assert cfg(602112, 49, True, 1, row_vector=1) == {"XBLOCK": 8, "RBLOCK": 64, "num_warps": 1}
    assert cfg(602112, 49, True, 1, row_vector=2) == cfg(602112, 49, True, 1) == {"XBLOCK": 16, "RBLOCK": 64, "num_warps": 2}
    assert cfg(602112, 197, True, 1, row_vector=1) == cfg(602112, 197, True, 1)

    def launch(fn: Callable[..., Any], *args: torch.Tensor) -> str:
        wrapper = compile_only(fn, *args).wrapper
        lines = [line for line in wrapper.splitlines() if "# grid" in line]
        assert len(lines) == 1, wrapper
        return lines[0]

    n = 49
    table, index = torch.randn(169, 3, dtype=bf16), torch.randint(0, 169, (n * n,))
    assert "XBLOCK=8, RBLOCK=64, num_warps=1" in launch(_windowed_scores, torch.randn(64, 3, n, n, dtype=bf16), table, index)
    assert "XBLOCK=8, RBLOCK=64, num_warps=1" in launch(lambda x: torch.softmax(x, -1), torch.randn(64, 3, n, 33))
    for aligned in (torch.randn(64, 3, n, 48, dtype=bf16), torch.randn(64, 3, n, 50)):  # vectors of 8 and 2
        assert "XBLOCK=16, RBLOCK=64, num_warps=2" in launch(lambda x: torch.softmax(x, -1), aligned)
    # rows starting at an odd offset (a slice one position in), though their stride is even
    assert "num_warps=1" in launch(lambda x: torch.softmax(x[..., 1:], -1), torch.randn(64, 3, n, 50, dtype=bf16))


def test_rows_of_an_odd_length_run_right_in_the_gpu_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu_reduction_configs(monkeypatch)  # (the interpreter runs the GPU's blocks)
    torch.manual_seed(0)
    n = 7
    x = torch.randn(1, 3, n * n, n * n, dtype=bf16)
    cases = [(_windowed_scores, (x, torch.randn(2 * n - 1, 3, dtype=bf16), torch.randint(0, 2 * n - 1, (n ** 4,)))),
             (lambda x: torch.softmax(x[..., 1:40], -1), (x.float(),))]  # rows starting at odd offsets
    for fn, args in cases:
        check(fn, *args)
        wrapper = fusebackend.last_compiled().wrapper
        assert "XBLOCK=8, RBLOCK=64, num_warps=1" in wrapper, wrapper


def test_a_sum_of_a_long_chain_splits_by_the_chain_s_layout() -> None:
    # The sum over 65536 rows of 8 channels of a chain of 20 full-size nodes, each scaled by a
    # per-row statistic (a layer norm's gradient added down a residual stream). Within the 8
    # levels the lowering looks through, the chain reaches only the statistics, which run along
    # the rows; judged by them the sum was split as a row sum (8 chunks, [8, 8] partials: a
    # column kernel of 1 program on a GPU). Past those levels the chain's nodes stand for
    # themselves: channels innermost, a column sum split in 256 chunks of 256 rows.
    from test_fusion_reductions import compile_only

    def fn(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        y = x
        for k in range(10):
            y = y * s + k
        return y.sum((0, 1, 2))

    x, s = torch.randn(4, 128, 128, 8), torch.rand(4, 128, 128, 1) + 0.5
    art = compile_only(fn, x, s)
    phase1 = [line for line in art.ir.splitlines() if "(split, phase 1)" in line]
    assert len(phase1) == 1 and "f32[256, 8]" in phase1[0], art.ir
    (first,) = [src for src in art.kernels.values() if "split, phase 1" in src]
    assert "column reduction" in first, first
    check(fn, x, s)
