"""``torch.cat`` (and ``stack``, which decomposes to it) as a pointwise node: each output element
is read, with a masked load, from the one input its position falls in, so a concatenation fuses
with what reads it instead of being an ATen copy, and with what computes its inputs. Every test
compares with eager."""

from __future__ import annotations

import pytest
import torch

import fusebackend
from helpers import check, check_lowered, kernel_count, kernels


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_cat_of_three_inputs(dim: int, dtype: torch.dtype) -> None:
    shapes = {0: [(2, 5, 3), (7, 5, 3), (1, 5, 3)], 1: [(4, 1, 3), (4, 6, 3), (4, 2, 3)],
              -1: [(4, 5, 9), (4, 5, 1), (4, 5, 4)]}[dim]

    def make(shape: tuple[int, ...]) -> torch.Tensor:
        if dtype == torch.bool:
            return torch.rand(shape) > 0.5
        if dtype == torch.int64:
            return torch.randint(-100, 100, shape)
        return torch.randn(shape).to(dtype)

    check_lowered(lambda a, b, c: torch.cat([a, b, c], dim), *(make(s) for s in shapes))
    assert kernel_count() == 1


def test_cat_fuses_with_its_reader_and_reads_each_element_once() -> None:
    a, b = torch.randn(6, 5), torch.randn(6, 3)
    check_lowered(lambda a, b: torch.relu(torch.cat([a, b], 1)) * 2, a, b)
    assert kernel_count() == 1
    (source,) = kernels().values()
    loads = [line for line in source.splitlines() if "tl.load(" in line]
    assert len(loads) == 2 and all("other=0" in line for line in loads)  # masked: one input per element
    report = fusebackend.last_compiled().schedule
    assert "read 192 B" in report  # (30 + 18) fp32 elements, each read once


def test_stack_then_permute_is_one_kernel() -> None:
    # the backward of unbind in attention: stack the three gradients, then the qkv layout
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    check_lowered(lambda q, k, v: torch.stack([q, k, v], 0).permute(1, 3, 0, 2, 4).contiguous(), q, k, v)
    assert kernel_count() == 1


def test_non_contiguous_inputs_and_promotion() -> None:
    a = torch.randn(5, 8).t()  # 8 x 5, transposed
    b = torch.randint(0, 10, (8, 3))
    check_lowered(lambda a, b: torch.cat([a, b], 1), a, b)


def test_signed_zero_and_nan_survive() -> None:
    a = torch.tensor([1.0, -0.0, float("nan")])
    b = torch.tensor([-0.0, float("-inf"), 2.0])
    out = check_lowered(lambda a, b: torch.cat([a, b]), a, b)
    assert torch.equal(torch.signbit(out), torch.signbit(torch.cat([a, b])))


def test_legacy_empty_input_is_skipped() -> None:
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    check(lambda a, e, b: torch.cat([a, e, b]), a, torch.empty(0), b)


def _masked_loads(source: str) -> list[str]:
    return [line for line in source.splitlines() if "tl.load(" in line and "other=0" in line]


def test_computed_parts_are_inlined_under_their_part() -> None:
    # a part computed in the graph is computed in the concatenating kernel, where it is used:
    # its loads are masked by the part's range, since their indices leave the input elsewhere
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    check_lowered(lambda a, b: torch.cat([a * 2, b + 1], 0).sum(0), a, b)
    assert kernel_count() == 1
    assert "must be in memory" not in fusebackend.last_compiled().schedule
    (source,) = kernels().values()
    loads = _masked_loads(source)
    assert len(loads) == 2 and all(" < " not in line for line in loads)  # masks are temporaries


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rotary_embedding_is_one_kernel(dtype: torch.dtype) -> None:
    # GPT-NeoX's partial rotary embedding: the rotated half is a cat of a negated slice and a
    # slice, and the result a cat of the rotated and the passed-through dims (cats nested in
    # computed parts); q arrives transposed, k contiguous
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = []
        for x in (q, k):
            rot, rest = x[..., :6], x[..., 6:]
            out.append(torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1))
        return tuple(out)

    q = torch.randn(2, 7, 3, 10).to(dtype).transpose(1, 2)
    k = torch.randn(2, 3, 7, 10).to(dtype)
    cos, sin = torch.randn(7, 6).to(dtype), torch.randn(7, 6).to(dtype)
    check_lowered(rotary, q, k, cos, sin)
    assert kernel_count() == 1
    assert "must be in memory" not in fusebackend.last_compiled().schedule


@pytest.mark.parametrize("shape", [(3, 7, 64), (1, 16, 64), (2, 5, 10)], ids=str)
def test_a_computed_part_is_addressed_within_its_part(shape: tuple[int, ...]) -> None:
    # rotate-half of a key computed in the kernel: under the part's condition the position
    # along the last dim stays in the part, so x[..., d + half] is read at flat + half, with no
    # modulo and no carry into the dims outside (what a GPU pays per element, in every layer)
    half = shape[-1] // 2

    def rotary(a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        k = a * 2.0 + 1.0
        return k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin

    a = torch.randn(*shape[:-1], shape[-1] + 3)[..., 3:]  # not contiguous
    cos, sin = torch.randn(shape[-2:]), torch.randn(shape[-2:])
    check_lowered(rotary, a, cos, sin)
    assert kernel_count() == 1
    (source,) = kernels().values()
    loads = [line for line in _masked_loads(source) if "tmp" in line.split("), ")[-1]]  # under a part
    assert len(loads) == 2
    for line in loads:
        offset = line.split("tl.load(in_ptr0 + (", 1)[1].rsplit("), ", 1)[0]
        assert f"% {shape[-1]}) + {half}) //" not in offset and f"% {shape[-1]}) - {half}) //" not in offset, line
        assert offset.count("//") <= 1 and offset.count("%") <= 1, line


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [9, 33])
def test_a_part_of_a_tiled_kernel_is_addressed_within_its_part(tokens: int, dtype: torch.dtype) -> None:
    # EVA-02's rotary embedding: the class token passed through, the other tokens rotated in
    # pairs, q a view of the qkv projection. The kernel is tiled (rows of tokens, columns of
    # head dims), where the part's position reads (y_index + x_inner // 16) % tokens until
    # simplified as the loads' offsets are; unsimplified it was not found in them, and each
    # rotated load took its token as ((n % tokens) + tokens - 2) % (tokens - 1) with carries
    # into the head and batch
    batch, heads, dim = 2, 2, 16

    def rot(x: torch.Tensor) -> torch.Tensor:
        return torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)

    def rotary(qkv: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        q = qkv.reshape(batch, tokens, 3, heads, dim).permute(2, 0, 3, 1, 4)[0]
        sin, cos = emb.tensor_split(2, -1)
        return torch.cat([q[:, :, :1], q[:, :, 1:] * cos + rot(q[:, :, 1:]) * sin], dim=2)

    qkv = torch.randn(batch * tokens, 3 * heads * dim).to(dtype)
    emb = torch.randn(tokens - 1, 2 * dim).to(dtype)
    check_lowered(rotary, qkv, emb)
    assert kernel_count() == 1
    (source,) = kernels().values()
    assert "y_index" in source  # tiled
    assert f"% {tokens - 1})" not in source and f"// {3 * (tokens - 1)})" not in source, source
    # the pairs, -x[2i + 1] and x[2i], from contiguous loads (codegen.pairs.pair_load)
    loads = [line for line in source.splitlines() if "tl.load(" in line]
    assert all("// 2)" not in line for line in loads) and source.count("th.pair_take_2d(") == 2, source


def test_computed_parts_along_a_reduced_dim() -> None:
    # the parts' ranges run along the reduction: a per-row part (broadcast along the row) is
    # read under a mask that varies along it
    s, b = torch.randn(6, 1), torch.randn(6, 5)
    check_lowered(lambda s, b: torch.cat([(s * 2).expand(6, 3), b + 1, -b], 1).sum(1), s, b)
    assert kernel_count() == 1
    check_lowered(lambda s, b: torch.cat([(s * 2).expand(6, 3), b.exp()], 1).softmax(1), s, b)


def test_a_gather_from_a_computed_tensor_computes_it_at_the_positions() -> None:
    # positions read from data may fall anywhere: the gather reads a at them and doubles it
    # there (scheduler/recompute.py), where a stored product would cost a kernel and a write
    a, idx = torch.randn(6, 5), torch.tensor([4, 0, 0, 5, 2])
    check_lowered(lambda a, idx: (a * 2)[idx] + 1, a, idx)
    assert kernel_count() == 1
    assert "must be in memory" not in fusebackend.last_compiled().schedule


def test_a_gather_from_a_computed_tensor_that_moves_along_the_gathered_dim_reads_it_from_memory() -> None:
    # a.flip(0) reads row 5 - p at position p: not a load at the position, so the sum is stored
    a, idx = torch.randn(6, 5), torch.tensor([4, 0, 0, 5, 2])
    check_lowered(lambda a, idx: (a + a.flip(0))[idx] + 1, a, idx)
    assert "must be in memory" in fusebackend.last_compiled().schedule


def test_stack_with_a_transposed_input_is_tiled() -> None:
    # k arrives transposed (contiguous along the sequence): the fused kernel is tiled so that k is
    # read along its contiguous dim and q, v and the output along theirs
    q, v = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    k = torch.randn(2, 4, 16, 8).transpose(-1, -2)
    check_lowered(lambda q, k, v: torch.stack([q, k, v], 0).permute(1, 3, 0, 2, 4).contiguous(), q, k, v)
    assert kernel_count() == 1
    (source,) = kernels().values()
    assert "# tiled: 8 (y) by 192 (x)" in source
    k_load = next(line for line in source.splitlines() if "in_ptr1 +" in line)
    assert "(y_index + " in k_load  # k's elements one apart along y
