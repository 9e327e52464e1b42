"""Scatters (scatter, scatter_add, scatter_reduce, index_put and what decomposes to it) against
eager, their kernels, and embedding's backward.

A scatter is a copy of its input (a pointwise kernel, fused with what computes the input) and a
kernel over the scattered values that stores or atomically combines each one. Values with
duplicate positions are only given to the accumulating forms: a plain store of duplicates keeps
an unspecified one, in eager as here. Positions outside the tensor are masked (eager raises):
a compiled graph called with such an index writes nothing there.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from fusebackend import indexing, ir
from helpers import TOLERANCE, check, check_lowered, compile_fn, kernel_count, kernels

f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
i8, i32, i64, b1 = torch.int8, torch.int32, torch.int64, torch.bool


def tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype == b1:
        return torch.rand(shape) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(-20, 20, shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


def distinct(rows: int, size: int, count: int) -> torch.Tensor:
    """``rows`` rows of ``count`` distinct positions in [0, size)."""
    return torch.argsort(torch.rand(rows, size), 1)[:, :count]


def loose(dtype: torch.dtype) -> dict[str, float]:
    # eager rounds a half-precision sum after every add, we (in fp32) once
    return {"atol": 0.05, "rtol": 0.02} if dtype in (bf16, f16) else {}


# ------------------------------------------------------------------------- along one dim


@pytest.mark.parametrize("dtype", [f32, bf16, i64, i32, b1], ids=str)
def test_scatter_src_and_value(dtype: torch.dtype) -> None:
    x, src = tensor((4, 9), dtype), tensor((4, 5), dtype)
    idx = distinct(4, 9, 5)
    check_lowered(lambda x, i, s: torch.scatter(x, 1, i, s), x, idx, src)
    torch._dynamo.reset()
    check_lowered(lambda x, i: torch.scatter(x, -1, i, True if dtype == b1 else 3), x, idx)
    assert "tl.atomic" not in "".join(kernels().values())


@pytest.mark.parametrize("dtype", [f32, bf16, i64], ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_one_position_per_line_is_a_comparison(dtype: torch.dtype, dim: int) -> None:
    # an index of size 1 along dim and the tensor's sizes elsewhere (a one-hot): no copy and no
    # scatter kernel, one pointwise kernel that compares the line's position with the index
    x = tensor((5, 7), dtype).t()  # non-contiguous
    shape = [7, 5]
    shape[dim] = 1
    idx = torch.randint(0, x.shape[dim], tuple(shape))
    check_lowered(lambda x, i: torch.scatter(x * 2, dim, i, 3), x, idx)
    assert kernel_count() == 1
    (source,) = kernels().values()
    assert "tl.atomic" not in source and "index out of bounds" in source
    src = tensor(tuple(shape), dtype)
    check_lowered(lambda x, i, s: torch.scatter(x, dim, i, s), x, idx, src)
    assert kernel_count() == 2  # one more graph, one more kernel


def test_one_position_per_line_out_of_range_raises() -> None:
    fn = lambda x, i: torch.scatter(torch.zeros_like(x), 1, i, -1.0) * x  # noqa: E731
    compiled = compile_fn(fn)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x, torch.tensor([[0], [3], [1]])), fn(x, torch.tensor([[0], [3], [1]])))
    with pytest.raises(Exception, match="index out of bounds"):
        compiled(x, torch.tensor([[0], [4], [1]]))


def test_nll_loss_backward_stores_no_one_hot() -> None:
    # the one-hot gradient of nll_loss is a comparison fused into the log-softmax's backward
    x = torch.randn(6, 37, requires_grad=True)
    target = torch.randint(0, 37, (6,))
    target[1] = -100
    compiled = compile_fn(lambda x, t: F.cross_entropy(x, t))
    compiled(x, target).backward()
    expected = x.detach().clone().requires_grad_()
    F.cross_entropy(expected, target).backward()
    torch.testing.assert_close(x.grad, expected.grad)
    backward = fusebackend.history()[-1]
    assert backward.kernel_count == 1, backward.schedule
    assert "tl.atomic" not in "".join(backward.kernels.values())


@pytest.mark.parametrize("dtype", [f32, bf16, f16, f64, i64, i32, i8], ids=str)
def test_scatter_add_with_duplicates(dtype: torch.dtype) -> None:
    x, src = tensor((5, 6), dtype), tensor((5, 7), dtype)
    idx = torch.randint(0, 6, (5, 7))  # duplicates in every row
    check_lowered(lambda x, i, s: torch.scatter_add(x, 1, i, s), x, idx, src, **loose(dtype))
    assert any("tl.atomic_add(" in src for src in kernels().values())


@pytest.mark.parametrize("reduce", ["sum", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [f32, bf16, i64, i32, f64], ids=str)
def test_scatter_reduce(reduce: str, include_self: bool, dtype: torch.dtype) -> None:
    x, src = tensor((6, 5), dtype), tensor((4, 5), dtype)
    idx = torch.randint(0, 6, (4, 5))
    fn = lambda x, i, s: torch.scatter_reduce(x, 0, i, s, reduce, include_self=include_self)  # noqa: E731
    check_lowered(fn, x, idx, src, **loose(dtype))
    # a float minimum is the maximum of the negated values
    negated = reduce == "amin" and dtype.is_floating_point
    atomic = {"sum": "tl.atomic_add(", "amax": "tl.atomic_max(", "amin": "tl.atomic_min("}[reduce]
    assert any((atomic if not negated else "tl.atomic_max(") in src for src in kernels().values())
    # a bf16 result is cast back from its fp32 copy, a negated one negated back, by one more kernel
    assert kernel_count() == (2 if include_self else 3) + (dtype == bf16 or negated)


def test_scatter_reduce_propagates_nan_of_either_sign() -> None:
    nan = torch.tensor(math.nan)
    x = torch.randn(4, 6)
    x[0, 0] = nan
    x[1, 1] = -nan  # sign bit set
    src = torch.randn(4, 6)
    src[2, 2] = -nan
    src[3, 3] = nan
    idx = torch.randint(0, 4, (4, 6))
    for reduce in ("amax", "amin"):
        for include_self in (True, False):
            torch._dynamo.reset()
            check_lowered(lambda x, i, s: torch.scatter_reduce(x, 0, i, s, reduce, include_self=include_self),
                          x, idx, src)


@pytest.mark.parametrize("reduce", ["prod", "mean"])
def test_scatter_reduce_without_an_atomic_stays_an_aten_call(reduce: str) -> None:
    x, src, idx = torch.randn(4, 5), torch.randn(4, 5), torch.randint(0, 4, (4, 5))
    check(lambda x, i, s: torch.scatter_reduce(x, 0, i, s, reduce), x, idx, src)
    assert dict(fusebackend.metrics.fallbacks) == {"scatter_reduce": 1}


def test_scatter_layouts_and_dims() -> None:
    base = torch.randn(7, 8)
    idx = distinct(8, 7, 4).t()  # (4, 8): distinct along dim 0
    src = torch.randn(8, 6).t()  # transposed, larger than the index
    check_lowered(lambda x, i, s: torch.scatter(x, 0, i, s), base, idx, src)
    torch._dynamo.reset()
    x = torch.randn(8, 7).t()  # transposed self: the result keeps its layout
    out = check_lowered(lambda x, i, s: torch.scatter_add(x, -2, i, s), x, torch.randint(0, 7, (3, 8))[:, ::1],
                        torch.randn(3, 8))
    assert out.stride() == torch.scatter_add(x, -2, torch.zeros(3, 8, dtype=i64), torch.randn(3, 8)).stride()
    torch._dynamo.reset()
    x3 = torch.randn(3, 4, 5)
    check_lowered(lambda x, i, s: torch.scatter_add(x, 1, i, s), x3, torch.randint(0, 4, (2, 6, 5))[:, ::2],
                  torch.randn(2, 3, 5))
    torch._dynamo.reset()
    check_lowered(lambda x, i, s: torch.scatter_add(x, 0, i, s), torch.randn(1), torch.zeros(3, dtype=i64),
                  torch.randn(3))
    torch._dynamo.reset()
    check(lambda x, i, s: torch.scatter_add(x, 1, i, s), torch.randn(3, 4), torch.zeros(3, 0, dtype=i64),
          torch.randn(3, 0))


# -------------------------------------------------------------------------------- index_put


@pytest.mark.parametrize("dtype", [f32, bf16, i64, i8], ids=str)
@pytest.mark.parametrize("accumulate", [True, False])
def test_index_put(dtype: torch.dtype, accumulate: bool) -> None:
    x = tensor((6, 5), dtype)
    idx = torch.randint(-6, 6, (9,)) if accumulate else torch.randperm(6)[:4] - 3  # negatives wrap
    values = tensor((len(idx), 5), dtype)
    check_lowered(lambda x, i, v: x.index_put((i,), v, accumulate=accumulate), x, idx, values, **loose(dtype))
    sources = "".join(kernels().values())
    assert ("tl.atomic_add(" in sources) == accumulate and "tl.device_assert(" in sources


@pytest.mark.parametrize("case", ["adjacent", "apart", "broadcast", "middle", "int32", "scalar values"])
def test_index_put_advanced_indexing(case: str) -> None:
    x = torch.randn(4, 5, 6)
    rows, cols = torch.randint(0, 4, (3,)), torch.randint(-5, 5, (3,))
    args: dict[str, tuple[Any, ...]] = {
        "adjacent": ((rows, cols), torch.randn(3, 6)),  # x[rows, cols] is (3, 6)
        "apart": ((rows, None, torch.randint(0, 6, (3,))), torch.randn(3, 5)),  # (3, 5): B goes first
        "broadcast": ((rows[:, None], cols[None, :]), torch.randn(3, 3, 6)),
        "middle": ((None, cols), torch.randn(4, 3, 6)),
        "int32": ((rows.int(), cols.int()), torch.randn(6)),  # values broadcast over B
        "scalar values": ((None, None, torch.randint(0, 6, (2,))), torch.tensor(1.5)),
    }
    indices, values = args[case]
    tensors = [t for t in indices if t is not None]
    slots = [k for k, t in enumerate(indices) if t is not None]

    def fn(x: torch.Tensor, values: torch.Tensor, *idx: torch.Tensor) -> torch.Tensor:
        full: list[torch.Tensor | None] = [None] * len(indices)
        for k, t in zip(slots, idx):
            full[k] = t
        return torch.ops.aten.index_put(x, full, values, True)

    check_lowered(fn, x, values, *tensors)


def test_index_add_copy_fill() -> None:
    x = torch.randn(5, 6)
    idx = torch.randint(0, 6, (8,))
    check_lowered(lambda x, i, v: x.index_add(1, i, v, alpha=2), x, idx, torch.randn(5, 8))
    torch._dynamo.reset()
    check_lowered(lambda x, i, v: x.index_add(-2, i, v), x, torch.randint(0, 5, (7,)), torch.randn(7, 6))
    torch._dynamo.reset()
    check_lowered(lambda x, i, v: x.index_copy(0, i, v), x, torch.tensor([4, 0, 2]), torch.randn(3, 6))
    torch._dynamo.reset()
    check_lowered(lambda x, i: x.index_fill(1, i, -1.0), x, torch.tensor([1, 5]))


def test_bool_mask_index_put_stays_an_aten_call() -> None:
    x = torch.randn(4, 5)
    check(lambda x, m, v: torch.ops.aten.index_put(x, [m], v), x, torch.rand(4, 5) > 0.5, torch.tensor(2.0))
    assert "index_put" in fusebackend.metrics.fallbacks


def test_out_of_bounds_positions_raise_and_write_nothing() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return x.index_put((i,), v, accumulate=True)

    compiled = compile_fn(fn)
    x, v = torch.randn(4, 3), torch.randn(5, 3)
    good = torch.tensor([0, 1, 2, 3, -1])
    torch.testing.assert_close(compiled(x, good, v), fn(x, good, v))
    source = "\n".join(kernels().values())
    assert 'tl.device_assert(' in source and "scatter index out of bounds" in source
    # the kernel is compiled for debugging, where Triton keeps the assert (on a GPU too)
    assert "debug=True" in fusebackend.last_compiled().wrapper
    bad = torch.tensor([0, 9, -9, 3, 4])  # 9, -9 + 4 and 4 are outside: eager raises, and so does the kernel
    with pytest.raises(Exception, match="scatter index out of bounds"):
        compiled(x, bad, v)
    assert fusebackend.metrics.eager_graphs == 0


# ----------------------------------------------------------------------------------- fusion


def test_copy_fuses_with_the_producer_and_scatter_with_its_operands() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.scatter_add(x * 2, 1, i.clamp(0, 5), s.sin())

    check_lowered(fn, torch.randn(4, 6), torch.randint(-2, 8, (4, 3)), torch.randn(4, 3))
    assert kernel_count() == 2  # x * 2 written as the copy; the scatter computes sin and clamp
    copy, scatter = kernels().values()
    assert "tl.atomic_add(" not in copy and "* 2.0" in copy
    assert "tl.atomic_add(" in scatter and "th.sin" not in scatter and "tl.sin(" in scatter
    report = fusebackend.last_compiled().schedule
    assert "must be complete before it starts" in report


def test_reader_of_the_result_is_a_kernel_after_the_scatter() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.scatter_add(x, 1, i, s) + x

    check_lowered(fn, torch.randn(4, 6), torch.randint(0, 6, (4, 3)), torch.randn(4, 3))
    assert kernel_count() == 3
    last = list(kernels().values())[-1]
    assert "tl.atomic" not in last and last.count("tl.load(") == 2


def test_chained_scatters() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        y = torch.scatter_add(x, 1, i, s)
        return torch.scatter(y, 1, i[:, :1], -s[:, :1]), y

    check_lowered(fn, torch.randn(4, 6), torch.randint(0, 6, (4, 3)), torch.randn(4, 3))


# ------------------------------------------------------------------------------ embeddings


def grads(fn: Callable[..., torch.Tensor], weights: list[torch.Tensor], *args: Any) -> list[torch.Tensor]:
    leaves = [w.detach().clone().requires_grad_() for w in weights]
    fn(*leaves, *args).backward()
    return [leaf.grad for leaf in leaves]


def check_embedding_backward(fn: Callable[..., torch.Tensor], weights: list[torch.Tensor], *args: Any,
                             atol: float | None = None) -> None:
    expected = grads(fn, weights, *args)
    actual = grads(compile_fn(fn), weights, *args)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=atol, rtol=atol)
    assert fusebackend.metrics.eager_graphs == 0
    # the forward gather (aten.embedding) is not lowered here; the backward is ours
    assert set(fusebackend.metrics.fallbacks) <= {"embedding"}, dict(fusebackend.metrics.fallbacks)
    backward = [a for a in fusebackend.history() if a.name.startswith("backward")]
    assert backward and all("tl.atomic_add(" in "".join(a.kernels.values()) for a in backward)


def test_embedding_backward_is_a_zero_fill_and_a_scatter() -> None:
    w = torch.randn(10, 8)
    ids = torch.randint(0, 10, (3, 5))
    ids[0, :3] = 4  # repeated tokens accumulate
    check_embedding_backward(lambda w, ids: (F.embedding(ids, w) * torch.arange(8.0, device=w.device)).sum(),
                             [w], ids)
    (backward,) = [a for a in fusebackend.history() if a.name.startswith("backward")]
    assert backward.kernel_count == 2


def test_embedding_backward_with_padding_idx_and_bf16() -> None:
    w = torch.randn(12, 6, dtype=bf16)
    ids = torch.randint(0, 12, (4, 7))
    ids[:, 0] = 0
    check_embedding_backward(lambda w, ids: F.embedding(ids, w, padding_idx=0).float().pow(2).sum(), [w], ids,
                             atol=2e-2)


def test_gpt2_style_embeddings_backward() -> None:
    vocab, positions, width = 16, 8, 12
    wte, wpe = torch.randn(vocab, width), torch.randn(positions, width)
    ids = torch.randint(0, vocab, (2, positions))

    def fn(wte: torch.Tensor, wpe: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = F.embedding(ids, wte) + F.embedding(pos, wpe)[None]
        h = F.layer_norm(h, (width,))
        return (h * h.sigmoid()).sum()

    check_embedding_backward(fn, [wte, wpe], ids, atol=1e-4)


# --------------------------------------------------------------------------------------- IR


def test_scatter_target_must_be_read_by_its_scatter_alone() -> None:
    x = ir.Buffer("arg0", f32, (4,), (1,))
    idx = ir.Buffer("arg1", i64, (2,), (1,))
    (i0,) = indexing.loop_vars("i", 1)
    copy = ir.Pointwise(ir.Buffer("buf0", f32, (4,), (1,)), ir.Load(x.whole(), (indexing.var("i0"),)), "copy")
    scatter = ir.Scatter(ir.Buffer("buf1", f32, (4,), (1,)), copy.buffer, (2,),
                         (ir.Load(idx.whole(), (i0,)),), ir.Constant(1.0, f32), "sum", "scatter_add")
    graph = ir.IRGraph("g", torch.device("cpu"), [x, idx], [copy, scatter], [scatter.buffer.whole()])
    ir.verify(graph)
    assert "sum= 1.0" in ir.format_node(scatter)
    reader = ir.Pointwise(ir.Buffer("buf2", f32, (4,), (1,)), ir.Load(copy.buffer.whole(), (i0,)), "reads the copy")
    with pytest.raises(AssertionError, match="not by its scatter"):
        ir.verify(ir.IRGraph("g", torch.device("cpu"), [x, idx], [copy, scatter, reader], [reader.buffer.whole()]))
    with pytest.raises(ValueError):
        ir.Scatter(scatter.buffer, copy.buffer, (2,), scatter.position, scatter.value, "prod", "x")


def test_index_put_into_a_graph_input_in_place() -> None:
    # x[i] += v on an input: AOTAutograd leaves a copy_ into x after the scatter, which the
    # graph makes with ATen (the scatter's result is not a pointwise node it could write in place)
    def fn(x: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        x.index_put_((i,), v, accumulate=True)
        return x * 2

    x, i, v = torch.randn(5, 3), torch.tensor([0, 4, 0, -1]), torch.randn(4, 3)
    expected_x = x.clone()
    expected = fn(expected_x, i, v)
    actual_x = x.clone()
    actual = compile_fn(fn)(actual_x, i, v)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual_x, expected_x)
    assert "index_put" not in fusebackend.metrics.fallbacks and kernel_count() >= 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,length,dim", [(2, 1, 16), (3, 5, 10)])
def test_rotary_written_into_a_cache_is_one_kernel(dtype: torch.dtype, heads: int, length: int, dim: int) -> None:
    # a decode step's keys: rotated (halves swapped, one negated: a concatenation of two parts
    # computed in the kernel) and written into a static cache at their positions. The scatter
    # kernel computes the rotation at the concatenation's positions; nothing goes through memory
    def fn(cache: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor) -> None:
        half = k.shape[-1] // 2
        rotated = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
        cache.index_copy_(2, pos, k * cos + rotated * sin)

    torch.manual_seed(0)
    cache = torch.randn(2, heads, 9, dim, dtype=dtype)
    k = torch.randn(2, length, heads, dim, dtype=dtype).transpose(1, 2)  # heads of a projection: strided
    cos, sin = torch.randn(1, 1, length, dim, dtype=dtype), torch.randn(1, 1, length, dim, dtype=dtype)
    pos = torch.randperm(9)[:length]
    expected = cache.clone()
    fn(expected, k, cos, sin, pos)
    actual = cache.clone()
    compile_fn(fn)(actual, k, cos, sin, pos)
    torch.testing.assert_close(actual, expected, atol=TOLERANCE[dtype][0], rtol=TOLERANCE[dtype][1])
    assert kernel_count() == 1
    (source,) = kernels().values()
    assert "tl.where(" in source  # the concatenation's parts, computed in place
