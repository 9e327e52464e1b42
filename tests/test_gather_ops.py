"""Gathers (``lowering/gathers.py``) as indirect loads in generated kernels: ``embedding``,
``index_select``, ``gather`` and advanced indexing against eager over dtypes, tiny shapes,
non-contiguous inputs, negative dims and indices; fusion by kernel count; the index check
(``tl.device_assert``) in the generated source, raising on out-of-range indices; and the check
dropped where the positions are proven in range (``lowering/index_bounds.py``)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import assert_same, check, check_lowered, kernel_count, kernels

f32, bf16, i64, i32 = torch.float32, torch.bfloat16, torch.int64, torch.int32
DTYPES = [f32, bf16, i64]
ASSERT = "tl.device_assert("


def make(shape: tuple[int, ...], dtype: torch.dtype = f32, transposed: bool = False) -> torch.Tensor:
    def values(s: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(-100, 100, s) if dtype == i64 else torch.randn(s).to(dtype)

    if transposed:
        return values(shape[:-2] + (shape[-1], shape[-2])).transpose(-1, -2)
    return values(shape)


def ids(high: int, shape: tuple[int, ...], low: int = 0, dtype: torch.dtype = i64) -> torch.Tensor:
    return torch.randint(low, high, shape, dtype=dtype)


def gathered(fn: Callable[..., Any], *args: Any, kernels_expected: int = 1, asserts: bool = True) -> str:
    """``check_lowered``, the kernel count, and the generated source, checking its indices
    (or not, where they are proven in range)."""
    check_lowered(fn, *args)
    assert kernel_count() == kernels_expected
    source = "\n".join(kernels().values())
    assert (ASSERT in source) == asserts
    return source


# ------------------------------------------------------------------------------- embedding


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", [i64, i32], ids=str)
@pytest.mark.parametrize("shape", [(3, 4), (1,), (2, 1, 3)], ids=str)
def test_embedding(dtype: torch.dtype, index_dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gathered(lambda i, w: F.embedding(i, w), ids(10, shape, dtype=index_dtype), make((10, 6), dtype))


def test_embedding_of_non_contiguous_weight_and_ids() -> None:
    w = make((10, 6), f32, transposed=True)
    i = ids(10, (5, 4)).t()
    gathered(lambda i, w: F.embedding(i, w), i, w)


def test_embedding_plus_positions_is_one_kernel() -> None:
    source = gathered(lambda i, w, p: F.embedding(i, w) + p, ids(10, (3, 4)), make((10, 6)), make((4, 6)))
    # the check and the masked load: no address outside the table is read even without asserts
    assert "(0 <= tmp0) & (tmp0 < 10)" in source and "other=0" in source


def test_embedding_layer_norm_is_one_kernel() -> None:
    gathered(lambda i, w, p: F.layer_norm(F.embedding(i, w) + p, (6,)), ids(10, (3, 4)), make((10, 6)),
             make((4, 6)))


def test_embedding_summed_checks_in_a_reduction_kernel() -> None:
    gathered(lambda i, w: F.embedding(i, w).sum(-1), ids(10, (3, 4)), make((10, 6)))


def test_gathered_ids_are_computed_in_the_kernel() -> None:
    # the index tensor is a producer fused into the gather: ids + 1 never reaches memory
    source = gathered(lambda i, w: F.embedding(i + 1, w) * 2, ids(9, (3, 4)), make((10, 6)))
    assert source.count("tl.store(") == 1


# ----------------------------------------------------------------------------- index_select


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1], ids=str)
def test_index_select(dtype: torch.dtype, dim: int) -> None:
    x = make((3, 4, 5), dtype)
    gathered(lambda x, i: torch.index_select(x, dim, i), x, ids(x.shape[dim], (7,), dtype=i32))


@pytest.mark.parametrize("transposed", [False, True])
def test_index_select_of_non_contiguous_and_0d_index(transposed: bool) -> None:
    x = make((4, 5), f32, transposed)
    gathered(lambda x, i: torch.index_select(x, 1, i) * x[:, :1], x, torch.tensor(3))


# ----------------------------------------------------------------------------------- gather


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1], ids=str)
def test_gather(dtype: torch.dtype, dim: int) -> None:
    x = make((3, 4, 5), dtype)
    index_shape = [2, 3, 4]
    index_shape[dim] = 6  # longer than the input along dim: positions repeat
    gathered(lambda x, i: torch.gather(x, dim, i), x, ids(x.shape[dim], tuple(index_shape)))


def test_gather_of_non_contiguous_input_and_index() -> None:
    x = make((4, 5), f32, transposed=True)
    i = ids(5, (6, 4)).t()
    gathered(lambda x, i: torch.gather(x, 1, i) + 1, x, i)


# ------------------------------------------------------------------------- advanced indexing


CASES = {
    "first": (lambda x, i, j: x[i], (4, 0)),
    "two_adjacent": (lambda x, i, j: x[i, j], (4, 5)),
    "middle": (lambda x, i, j: x[:, j], (0, 5)),
    "separated": (lambda x, i, j: x[i, :, j], (4, 6)),
    "last_with_ellipsis": (lambda x, i, j: x[..., j], (0, 6)),
    "slice_then_index": (lambda x, i, j: x[i, 1:4, j], (4, 6)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_index_tensor(dtype: torch.dtype, case: str) -> None:
    fn, (ni, nj) = CASES[case]
    x = make((4, 5, 6), dtype)
    # broadcast index tensors (2, 1) and (3,), negative positions count from the end
    i = ids(max(ni, 1), (2, 1), low=-max(ni, 1))
    j = ids(max(nj, 1), (3,), low=-max(nj, 1))
    gathered(fn, x, i, j)


def test_index_tensor_of_non_contiguous_input() -> None:
    x = make((3, 4, 5), f32, transposed=True)[:, 1:]
    gathered(lambda x, i, j: x[i, :, j] * 2, x, ids(3, (4,), low=-3), ids(4, (4,), low=-4, dtype=i32))


def test_take() -> None:
    gathered(lambda x, i: torch.take(x, i) * 2, make((3, 4)), ids(12, (5, 2), low=-12))


def test_abs_of_the_most_negative_index_is_not_proven() -> None:
    # abs(-2**63) wraps to itself: abs alone proves nothing about an int64 index
    gathered(lambda x, i: x[torch.minimum(i.abs(), torch.full_like(i, 4))], make((5, 7)), ids(10, (6,), low=-10))


# ----------------------------------------------------------------------- out-of-range indices


OUT_OF_RANGE = {
    "embedding": (lambda w, i: F.embedding(i, w) * 2, (10, 6), lambda: torch.tensor([1, 10])),
    "embedding_negative": (lambda w, i: F.embedding(i, w) * 2, (10, 6), lambda: torch.tensor([-1, 3])),
    "index_select": (lambda x, i: torch.index_select(x, 1, i), (3, 4), lambda: torch.tensor([0, 4])),
    "index_select_negative": (lambda x, i: torch.index_select(x, 1, i), (3, 4), lambda: torch.tensor([-1])),
    "gather": (lambda x, i: torch.gather(x, 1, i), (3, 4), lambda: torch.tensor([[0], [4], [1]])),
    "index": (lambda x, i: x[i], (3, 4), lambda: torch.tensor([0, 3])),
    "index_negative": (lambda x, i: x[:, i], (3, 4), lambda: torch.tensor([-5])),
}


@pytest.mark.parametrize("case", OUT_OF_RANGE)
def test_out_of_range_index_raises(case: str) -> None:
    fn, shape, bad = OUT_OF_RANGE[case]
    x = make(shape)
    good = torch.zeros_like(bad())
    compiled = torch.compile(fn, backend="fuse", fullgraph=True)
    # a first run that raises: eager, run again on the same inputs, raises its own error
    for _ in range(2):
        with pytest.raises((IndexError, RuntimeError)):
            compiled(x, bad())
    # the graph stayed compiled: a good run uses the kernel, which checks its indices
    assert_same(compiled(x, good), fn(x, good))
    assert fusebackend.metrics.eager_graphs == 0 and not fusebackend.metrics.fallbacks
    (source,) = kernels().values()
    assert ASSERT in source and "index out of bounds" in source
    # once the graph has run, the kernel's own assert raises
    with pytest.raises(Exception, match="index out of bounds"):
        compiled(x, bad())


# --------------------------------------------------------------------- proven positions


PROVEN = {
    "argmax": (lambda x, i: torch.gather(x, 1, x.argmax(1, keepdim=True))),
    "arange": (lambda x, i: x[torch.arange(x.shape[0] - 1, -1, -1, device=x.device)]),
    "clamped": (lambda x, i: x[i.clamp(0, 4)]),
    "clamped_negative": (lambda x, i: x[i.clamp(-5, 4)] + 1),
    "minimum": (lambda x, i: torch.index_select(x, 1, torch.minimum(i.clamp(min=0), torch.full_like(i, 6)))),
}


@pytest.mark.parametrize("case", PROVEN)
def test_positions_proven_in_range_are_not_checked(case: str) -> None:
    gathered(PROVEN[case], make((5, 7)), ids(10, (6,), low=-10), asserts=False)


def test_positions_not_proven_stay_checked() -> None:
    # clamped to [0, 9] where the dim has 5 entries: not proven, so checked
    check_lowered(lambda x, i: x[i.clamp(0, 9)], make((5, 7)), ids(5, (6,)))
    assert ASSERT in "\n".join(kernels().values())


def test_index_made_on_the_cpu_in_a_gpu_graph() -> None:
    # An index tensor made on the CPU (as eager allows for a CUDA tensor) stays an ATen call, and
    # the wrapper moves it to the GPU before the gather kernel reads it.
    x = make((5, 7))
    if x.device.type == "cpu":
        pytest.skip("needs a GPU graph (FUSE_TEST_DEVICE=cuda)")
    fn = lambda x: x[torch.arange(x.shape[0] - 1, -1, -1, device="cpu")] * 2  # noqa: E731
    check(fn, x)
    assert fusebackend.metrics.eager_graphs == 0
    assert ".to(device)" in fusebackend.last_compiled().wrapper


# ------------------------------------------------------------ gathers of computed tensors


def test_the_loss_gathers_the_log_softmax_without_storing_it() -> None:
    # cross-entropy's forward: the log-softmax is read at one position per row only, so the
    # gather computes it there from the logits and the row's statistics (scheduler/recompute.py)
    logits, target = torch.randn(6, 37), ids(37, (6,))
    target[2] = -100  # ignored
    check_lowered(lambda x, t: F.cross_entropy(x, t, ignore_index=-100), logits, target)
    written = [b for a in fusebackend.history() for b in a.wrapper.splitlines() if "empty((6, 37)" in b]
    assert not written, written  # no [rows, classes] buffer is allocated
    assert ASSERT in "\n".join(kernels().values())  # the targets are checked where they are read


def test_a_gathered_computed_tensor_still_raises_on_a_bad_index() -> None:
    fn = lambda x, i: (x.exp() * 2)[i]  # noqa: E731
    compiled = torch.compile(fn, backend="fuse", fullgraph=True)
    x = make((4, 3))
    assert_same(compiled(x, torch.tensor([3, 0])), fn(x, torch.tensor([3, 0])))
    assert kernel_count() == 1
    with pytest.raises(Exception, match="index out of bounds"):
        compiled(x, torch.tensor([0, 4]))


def test_positions_from_a_constant_index_tensor_need_no_check() -> None:
    # an index tensor written in the model's code is a constant of the graph: its values are known
    # when the graph is compiled, so its positions are proven in range (negative ones wrapped)
    # and the kernel asserts nothing (Falcon selects its key and value heads so)
    x = torch.randn(3, 5, 6)
    fn = lambda x: x[..., torch.tensor([-2, 0, 5])] * 2  # noqa: E731
    check(fn, x)
    sources = list(kernels().values())
    assert sources and not any(ASSERT in src for src in sources), sources


def test_positions_from_a_constant_out_of_range_stay_checked() -> None:
    x = torch.randn(3, 5, 6)
    fn = lambda x: x[..., torch.tensor([1, 6])] * 2  # noqa: E731  (6 is past the dim: eager raises)
    with pytest.raises(Exception):
        fn(x)
    with pytest.raises(Exception):
        torch.compile(fn, backend="fuse")(x)
