"""Flat pointwise kernels in blocks aligned to their loads' divisions (``config.flat_align``,
``codegen/pointwise.py``, ``_aligned_launch``).

A flat kernel reading the heads of a ``[batch, length, heads, dim]`` projection in ``[batch,
heads, length, dim]`` order divides its index by ``dim`` and the heads; such a load carries hints
of 1 and is issued element by element (``indexing.window_arithmetic``). In blocks that divide each
divisor, the divisions are the block's (taken at its start) and the load is contiguous. Each case
compares with eager; fusion is asserted on the source.
"""

from __future__ import annotations

import pytest
import torch

import fusebackend
from helpers import assert_same, compile_fn, kernels


def rotary(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Gemma 2's form: the projection's heads, their halves swapped (one negated), into the
    # contiguous layout a product reads
    q = q.transpose(1, 2)
    half = q.shape[-1] // 2
    rot = torch.cat([-q[..., half:], q[..., :half]], -1)
    return (q * cos + rot * sin).contiguous()


def _compiled_source(fn, *args, aligned: bool) -> tuple[torch.Tensor, str]:
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    with fusebackend.config.patch(flat_align=aligned, graph_cache=False):
        out = compile_fn(fn)(*args)
    (source,) = kernels().values()
    return out, source


@pytest.mark.parametrize("batch,length,heads,dim,dtype", [
    (2, 24, 2, 256, torch.float32),   # Gemma 2's head size
    (3, 5, 3, 384, torch.float32),    # a divisor whose power of two is 128: blocks of 128
    (1, 7, 4, 256, torch.bfloat16),
])
def test_heads_read_across_a_projection_load_contiguous_blocks(batch, length, heads, dim, dtype) -> None:
    torch.manual_seed(0)
    q = torch.randn(batch, length, heads, dim, dtype=dtype)
    cos, sin = torch.randn(length, dim, dtype=dtype), torch.randn(length, dim, dtype=dtype)
    want = rotary(q, cos, sin)
    plain_out, plain = _compiled_source(rotary, q, cos, sin, aligned=False)
    out, source = _compiled_source(rotary, q, cos, sin, aligned=True)
    assert_same(plain_out, want)
    assert_same(out, want)
    assert "max_contiguous(" in plain  # element by element, as generated without it
    # the divisions by the head size the block's, the lanes contiguous from its start
    assert "max_contiguous(" not in source and f"xindex - {dim}*(xoffset // {dim})" in source, source
    assert f"xindex // {dim}" not in source and f"xindex % {dim}" not in source


def test_a_strided_projection_and_ragged_blocks_stay_right() -> None:
    # the projection a slice of a wider one (strided rows), and a total that no block divides
    torch.manual_seed(0)
    wide = torch.randn(3, 5, 2, 512)
    q = wide[..., :256]
    cos, sin = torch.randn(5, 256), torch.randn(5, 256)
    out, source = _compiled_source(rotary, q, cos, sin, aligned=True)
    assert_same(out, rotary(q, cos, sin))
    assert "max_contiguous(" not in source


@pytest.mark.parametrize("case", ["small divisor", "shifted index"])
def test_kernels_blocks_cannot_align_are_generated_as_before(case: str) -> None:
    torch.manual_seed(0)
    if case == "small divisor":  # heads of 96: a block of 32 would be too small
        args = (torch.randn(2, 6, 3, 96), torch.randn(6, 96), torch.randn(6, 96))
        fn = rotary
    else:  # a roll: the index shifted before its remainder, which no block start gives
        args = (torch.randn(4, 6, 3, 256),)

        def fn(x):
            return torch.roll(x.transpose(1, 2), 1, -1).contiguous() * 2
    plain_out, plain = _compiled_source(fn, *args, aligned=False)
    out, source = _compiled_source(fn, *args, aligned=True)
    assert_same(out, fn(*args))
    assert source == plain
