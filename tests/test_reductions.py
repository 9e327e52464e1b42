"""Op tests: every reduction lowering against eager, over dims, layouts, dtypes and row lengths.

Each case compiles with ``backend="fuse"``, compares with eager on fresh random inputs
(``helpers.check``) and asserts that the work became generated kernels with no ATen fallback, so
a test never passes by comparing eager with eager. The matrices:

- ``test_multi_dim_op`` / ``test_one_dim_op``: op x reduced dims (last, first, middle, several,
  all) x keepdim;
- ``test_op_layout``: op x non-contiguous input (transposed, step slice, offset, expanded,
  permuted);
- ``test_float_dtype`` / ``test_int_dtype`` / ``test_bool_dtype``: fp32/fp16/bf16 (half types
  accumulate in fp32), int32/int64, bool;
- row lengths 1, 7, 1000, 4097 (persistent), 20000 (looped), 100000 with few rows and a
  full reduction of ~300k elements (split, two-phase);
- NaN, inf, ties and empty reductions.

By default the op matrices run a fixed sample: each op with a few of the values of the other axes,
taken in turn so that every value runs (``helpers.diagonal``); ``pytest --full`` runs every case.

Sizes: in Triton's interpreter ``tl.reduce`` with a combine function runs its combine once per
element in Python (~30 us for a sum, ~300 us for max/argmax), padding included. The op matrices
use tensors of a few hundred elements; the long-row cases use one or two rows and mostly sums.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import (DIMS, DIMS_KEEP_IDS, FULL, TOLERANCE, assert_same, check, check_lowered, compile_fn, diagonal,
                     kernel_count, sampled)

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
i32, i64 = torch.int32, torch.int64


def near_one(*shape: int, dtype: torch.dtype = f32) -> torch.Tensor:
    """Values in [0.9, 1.1]: products of many of them stay finite and well conditioned."""
    return (1 + 0.2 * (torch.rand(shape) - 0.5)).to(dtype)


def sources() -> list[str]:
    return [s for a in fusebackend.history() for s in a.kernels.values()]


def looped(source: str) -> bool:
    return "for roffset in range" in source


# ------------------------------------------------------------------------------ op x dims

# ops that accept a list of dims (or None for all)
MULTI_DIM: dict[str, Callable[..., Any]] = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k),
    "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k) if d is not None else x.amax(),
    "amin": lambda x, d, k: x.amin(d, keepdim=k) if d is not None else x.amin(),
    "any": lambda x, d, k: (x > 1.0).any(d, keepdim=k) if d is not None else (x > 1.0).any(),
    "all": lambda x, d, k: (x > -1.5).all(d, keepdim=k) if d is not None else (x > -1.5).all(),
    "var": lambda x, d, k: x.var(d, keepdim=k),
    "var_c0": lambda x, d, k: torch.var(x, d, correction=0, keepdim=k),
    "std": lambda x, d, k: x.std(d, keepdim=k),
    "var_mean_c0": lambda x, d, k: torch.var_mean(x, d, correction=0, keepdim=k),
    "var_mean_c1": lambda x, d, k: torch.var_mean(x, d, correction=1, keepdim=k),
    "logsumexp": lambda x, d, k: torch.logsumexp(x, d if d is not None else (0, 1, 2), keepdim=k),
}

@pytest.mark.parametrize("name, dims_keep", diagonal({n: n for n in MULTI_DIM}, DIMS_KEEP_IDS, per=2))
def test_multi_dim_op(name: str, dims_keep: tuple[str, bool]) -> None:
    dims, keepdim = dims_keep
    if dims == "all" and keepdim and name in ("amax", "amin", "any", "all"):
        pytest.skip("covered by the nokeep variant (no dim argument)")
    d = DIMS[dims]
    fn = MULTI_DIM[name]
    check_lowered(lambda x: fn(x, d, keepdim), torch.randn(4, 6, 8))


# ops that take one dim (or None for the flattened tensor, where eager allows it)
ONE_DIM: dict[str, Callable[..., Any]] = {
    "prod": lambda x, d, k: (x * 0.1 + 1).prod(d, keepdim=k) if d is not None else (x * 0.1 + 1).prod(),
    "argmax": lambda x, d, k: x.argmax(d, keepdim=k),
    "argmin": lambda x, d, k: x.argmin(d, keepdim=k),
    "max_dim": lambda x, d, k: tuple(torch.max(x, d, keepdim=k)),
    "min_dim": lambda x, d, k: tuple(torch.min(x, d, keepdim=k)),
    "softmax": lambda x, d, k: torch.softmax(x, d),
    "log_softmax": lambda x, d, k: torch.log_softmax(x, d),
}
ONE_DIM_CASES = [
    (name, dims, keep)
    for name in ONE_DIM
    for dims in ("last", "first", "middle", "all")
    for keep in (False, True)
    if not (dims == "all" and name in ("max_dim", "min_dim", "softmax", "log_softmax"))  # eager needs a dim
    and not (keep and name in ("softmax", "log_softmax"))  # no keepdim argument
]


@pytest.mark.parametrize("name, dims, keepdim", sampled(
    [pytest.param(n, d, k, id=f"{n}-{d}-{'keep' if k else 'nokeep'}") for n, d, k in ONE_DIM_CASES],
    lambda i: i % 3 == 0))
def test_one_dim_op(name: str, dims: str, keepdim: bool) -> None:
    d = DIMS[dims]
    fn = ONE_DIM[name]
    check_lowered(lambda x: fn(x, d, keepdim), torch.randn(4, 6, 8))


@pytest.mark.parametrize("keepdim", [False, True], ids=["nokeep", "keep"])
def test_sum_all_dims_as_list(keepdim: bool) -> None:
    out = check_lowered(lambda x: x.sum((0, 1, 2), keepdim=keepdim), torch.randn(5, 6, 7))
    assert out.shape == ((1, 1, 1) if keepdim else ())


def test_negative_dim_spellings() -> None:
    check_lowered(lambda x: x.sum((-1, 0)) + x.amax((2, -3)), torch.randn(4, 5, 6))


def test_reduce_4d_outer_and_inner() -> None:
    check_lowered(lambda x: (x.sum((0, 3)), x.mean((1, 2), keepdim=True)), torch.randn(3, 4, 5, 6))


# ---------------------------------------------------------------------------- op x layout


def _layout(kind: str) -> torch.Tensor:
    if kind == "transposed":
        return torch.randn(14, 12).t()  # (12, 14), strides (1, 12)
    if kind == "step_slice":
        return torch.randn(12, 28)[:, ::2]  # (12, 14), strides (28, 2)
    if kind == "offset_slice":
        return torch.randn(14, 20)[1:13, 3:17]  # storage offset, row stride 20
    if kind == "expanded":
        return torch.randn(1, 14).expand(12, 14)  # stride 0 over rows
    if kind == "expanded_inner":
        return torch.randn(12, 1).expand(12, 14)  # stride 0 along the reduced dim
    if kind == "permuted3d":
        return torch.randn(3, 4, 6).permute(2, 0, 1)  # (6, 3, 4)
    raise AssertionError(kind)


LAYOUT_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sum_last": lambda x: x.sum(-1),
    "sum_first": lambda x: x.sum(0),
    "mean_all": lambda x: x.mean(),
    "amax_last": lambda x: x.amax(-1, keepdim=True),
    "argmax_last": lambda x: x.argmax(-1),
    "argmin_first": lambda x: x.argmin(0),
    "var_mean_last": lambda x: torch.var_mean(x, -1),
    "softmax_last": lambda x: torch.softmax(x, -1),
    "softmax_first": lambda x: torch.softmax(x, 0),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
}
LAYOUTS = ["transposed", "step_slice", "offset_slice", "expanded", "expanded_inner", "permuted3d"]


@pytest.mark.parametrize("name, layout", diagonal({n: n for n in LAYOUT_OPS}, {la: la for la in LAYOUTS}, per=2))
def test_op_layout(name: str, layout: str) -> None:
    if layout == "expanded_inner" and name == "layer_norm":
        pytest.skip("constant rows: (x - mean) * rsqrt(eps) amplifies the rounding of the mean")
    if "expanded" in layout and name.startswith(("argmax", "argmin")):
        pytest.skip("repeated values tie: test_argmax_ties_expanded")
    check_lowered(LAYOUT_OPS[name], _layout(layout))


def test_output_strides_follow_eager_for_permuted_input() -> None:
    x = torch.randn(4, 5, 6).permute(2, 0, 1)
    fn = lambda x: x.sum(1, keepdim=True)  # noqa: E731
    out = check_lowered(fn, x)
    assert out.stride() == fn(x).stride()


# ----------------------------------------------------------------------------- op x dtype

FLOAT_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sum": lambda x: x.sum(-1),
    "sum_col": lambda x: x.sum(0),
    "mean": lambda x: x.mean(-1),
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(0),
    "argmax": lambda x: x.argmax(-1),
    "argmin": lambda x: x.argmin(-1),
    "max_dim": lambda x: tuple(torch.max(x, -1)),
    "var": lambda x: x.var(-1),
    "std_c0": lambda x: x.std(-1, correction=0),
    "var_mean": lambda x: torch.var_mean(x, -1),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "rms_norm": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
    "sum_all": lambda x: x.sum(),
}


@pytest.mark.parametrize("name, dtype", diagonal({n: n for n in FLOAT_OPS}, {str(d): d for d in (f32, f16, bf16)},
                                                per=2))
def test_float_dtype(name: str, dtype: torch.dtype) -> None:
    if name in ("argmax", "argmin", "max_dim") and dtype != f32:
        # rounding to a half type makes ties (tested on their own): distinct integers per row,
        # exact in every float type
        x = torch.stack([torch.randperm(256)[:60] - 128 for _ in range(8)]).to(dtype)
    else:
        x = torch.randn(8, 60).to(dtype)
    atol, rtol = TOLERANCE[dtype]
    if name == "sum_all" and dtype != f32:
        atol, rtol = 4 * atol, 4 * rtol  # a 480-element sum rounded once vs eager's order
    check_lowered(FLOAT_OPS[name], x, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_half_prod_accumulates_in_fp32(dtype: torch.dtype) -> None:
    # eager's CPU prod of a half tensor rounds after every multiply (off by ~1e-2 over 200
    # factors); the compiled kernel accumulates in fp32 and rounds once, like the fp32 product
    x = near_one(8, 200, dtype=dtype)
    out = compile_fn(lambda x: x.prod(-1))(x)
    assert out.dtype == dtype
    assert_same(out, x.float().prod(-1).to(dtype))
    assert kernel_count() == 1 and not fusebackend.metrics.fallbacks


INT_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sum": lambda x: x.sum(-1),
    "sum_col": lambda x: x.sum(0, keepdim=True),
    "sum_all": lambda x: x.sum(),
    "argmax": lambda x: x.argmax(-1),
    "argmin": lambda x: x.argmin(0),
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(0),
    "max_dim": lambda x: tuple(torch.max(x, -1)),
    "prod": lambda x: x.prod(-1),
}


@pytest.mark.parametrize("name, dtype", diagonal({n: n for n in INT_OPS}, {str(d): d for d in (i32, i64)}))
def test_int_dtype(name: str, dtype: torch.dtype) -> None:
    if name == "prod":
        x = torch.randint(-3, 4, (9, 11), dtype=dtype)
    elif name.startswith(("arg", "max")):
        x = torch.stack([torch.randperm(11) * 7 - 30 for _ in range(9)]).to(dtype)  # no ties
    else:
        x = torch.randint(-1000, 1000, (9, 11), dtype=dtype)
    out = check_lowered(INT_OPS[name], x)
    if name.startswith("sum"):
        assert out.dtype == torch.int64  # ints sum to int64, like eager


def test_int32_sum_exceeding_int32_range() -> None:
    # the sum of int32 values is int64 in eager: the accumulator must not wrap at 2**31
    x = torch.full((4, 64), 2**30, dtype=i32) - torch.randint(0, 1000, (4, 64), dtype=i32)
    out = check_lowered(lambda x: x.sum(-1), x)
    assert (out > 2**31).all()


def test_sum_with_dtype_argument() -> None:
    check_lowered(lambda x: x.sum(-1, dtype=torch.float32), torch.randn(8, 300).to(f16))


def test_half_sum_accumulates_in_fp32() -> None:
    # 4096 values near 1: an fp16 accumulator stalls at 2048, an fp32 one does not
    x = (torch.ones(2, 4096) + torch.rand(2, 4096) * 1e-3).to(f16)
    out = check_lowered(lambda x: x.sum(-1), x)
    assert (out.float() > 4000).all()


BOOL_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "any_last": lambda x: x.any(-1),
    "all_last": lambda x: x.all(-1),
    "any_first_keep": lambda x: x.any(0, keepdim=True),
    "all_first": lambda x: x.all(0),
    "any_all": lambda x: x.any(),
    "all_all": lambda x: x.all(),
    "sum_bool": lambda x: x.sum(-1),
}


@pytest.mark.parametrize("name", list(BOOL_OPS), ids=str)
def test_bool_dtype(name: str) -> None:
    x = torch.rand(12, 9) < 0.7
    x[0] = True  # a row that is all True
    x[1] = False  # a row that is all False
    x[:, 0] = True
    check_lowered(BOOL_OPS[name], x)


def test_any_all_of_float_input() -> None:
    x = torch.randn(10, 7)
    x[2] = 0.0
    x[3, 4] = 0.0
    check_lowered(lambda x: (x.any(-1), x.all(-1), x.all(), x.any(0)), x)


# ---------------------------------------------------------------------------- row lengths

ROW_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sum": lambda x: x.sum(-1),
    "amax": lambda x: x.amax(-1),
    "argmax": lambda x: x.argmax(-1),
    "var_mean": lambda x: torch.var_mean(x, -1),
    "softmax": lambda x: torch.softmax(x, -1),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
}
ROW_CASES = [(name, rows, length) for rows, length in ((5, 1), (9, 7), (2, 1000)) for name in ROW_OPS] + [
    (name, 1, 4097) for name in ("sum", "var_mean", "softmax")
]


# by default the cases where the op's place in ROW_OPS and the length's place in (1, 7, 1000, 4097)
# add up to an even number: half the ops at each length, the other half at the next
_LENGTHS = (1, 7, 1000, 4097)


@pytest.mark.parametrize("name, rows, length", [
    pytest.param(n, r, c, id=f"{n}-{r}x{c}",
                 marks=() if (list(ROW_OPS).index(n) + _LENGTHS.index(c)) % 2 == 0 else FULL)
    for n, r, c in ROW_CASES])
def test_row_length_persistent(name: str, rows: int, length: int) -> None:
    check_lowered(ROW_OPS[name], torch.randn(rows, length))
    assert not any(looped(s) for s in sources())


LOOPED_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sum": lambda x: x.sum(-1),
    "mean_keep": lambda x: x.mean(-1, keepdim=True),
    "var_mean": lambda x: torch.var_mean(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "any": lambda x: (x > 3.5).any(-1),
    "prod": lambda x: (1 + x * 1e-3).prod(-1),
}


@pytest.mark.parametrize("name", list(LOOPED_OPS), ids=str)
def test_looped_row_of_20000(name: str) -> None:
    # a row longer than one interpreter block (16384), too short to split: a looped kernel
    check_lowered(LOOPED_OPS[name], torch.randn(1, 20_000), atol=1e-4, rtol=1e-4)
    assert sources() and all(looped(s) for s in sources())


def test_looped_32_rows_of_20000() -> None:
    # rows too short to split (under 64K elements); looped over each row
    out = check_lowered(lambda x: x.sum(-1), torch.randn(32, 20_000), atol=1e-4, rtol=1e-4)
    assert out.shape == (32,)
    assert kernel_count() == 1 and looped(sources()[0])


def test_looped_argmax_nan_and_ties(monkeypatch: pytest.MonkeyPatch) -> None:
    # The loop's blocks of 64 positions over rows of 300 (the interpreter combines an argmax's
    # elements one by one in Python: rows of 20000 past its own blocks of 16K took 14 s)
    from fusebackend.kernels import runtime

    original = runtime.reduction_config

    def blocks(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1,
               across_rows: bool = False, **kw: Any) -> dict[str, int]:
        return {**original(xnumel, rnumel, row_contiguous, passes, across_rows, **kw), "RBLOCK": 64}

    monkeypatch.setattr(runtime, "reduction_config", blocks)
    x = torch.randint(0, 3, (2, 300)).float()  # row 0: equal maxima in every block, the first one wins
    x[1, 150] = math.nan  # row 1: NaNs in two blocks of the loop, the first one wins
    x[1, 299] = math.nan
    x[1, 64] = 5.0
    check_lowered(lambda x: x.argmax(-1), x)
    assert looped(sources()[0])


@pytest.mark.parametrize("name", ["sum", "var_mean"], ids=str)
def test_split_row_of_100000(name: str) -> None:
    # one row of 100000: too few rows for the GPU, a long row -> two phases (two kernels each)
    fn = {"sum": lambda x: x.sum(-1, keepdim=True), "var_mean": lambda x: torch.var_mean(x, -1)}[name]
    check_lowered(fn, torch.randn(1, 100_000), atol=1e-4, rtol=1e-4)
    assert any("split, phase 1" in s for s in sources()) and any("split, phase 2" in s for s in sources())


def _float64_var_mean(x: torch.Tensor, dims: Any) -> tuple[torch.Tensor, torch.Tensor]:
    v, m = torch.var_mean(x.double(), dims)
    return v, m


@pytest.mark.parametrize("shape, dims", [((3000, 5), 0), ((2, 65536), 1)], ids=["columns", "rows"])
def test_split_variance_reads_its_input_once(shape: tuple[int, ...], dims: int) -> None:
    # few outputs, long rows: the sums and the squared deviations of each chunk come from one
    # read (Welford), and the chunks combine exactly; a mean of 1e4 and a spread of 3 would cost
    # a naive sum-of-squares formula every digit of fp32
    x = torch.randn(shape) * 3 + 1e4
    v, m = compile_fn(lambda x: torch.var_mean(x, dims))(x)
    v64, m64 = _float64_var_mean(x, dims)
    torch.testing.assert_close(v.double(), v64, rtol=2e-4, atol=0)
    torch.testing.assert_close(m.double(), m64, rtol=1e-6, atol=0)
    art = fusebackend.last_compiled()
    assert kernel_count() == 2 and "m2 over" in art.ir
    # kernel 0 holds both phase-1 reductions and reads x once: 58.59 KiB, 512 KiB
    assert f"kernel 0: buf0, buf1  | read {x.numel() * 4 / 1024:.2f} KiB" in art.schedule


@pytest.mark.parametrize(("rows", "columns", "blocks", "scale", "mean", "rtol", "update"), [
    # chunks of 375 positions in blocks of 64 (each chunk's last block partial) and 5 columns in
    # blocks of 4: the masked Welford update and the masked lanes of the combine
    (3000, 5, (4, 64), 2, 50, 1e-5, "th.welford_update_masked("),
    # chunks of 256 in blocks of 64, 8 columns in blocks of 8: no lane masked, so each has seen
    # as many values as the others and 1 / count is computed once a step, not once a value
    # (a mean of 1e4 and a spread of 3: the looser tolerance)
    (4096, 8, (8, 64), 3, 1e4, 2e-4, "th.welford_update_step("),
], ids=["ragged", "unmasked"])
def test_split_variance_in_a_looped_kernel(monkeypatch: pytest.MonkeyPatch, rows: int, columns: int,
                                           blocks: tuple[int, int], scale: float, mean: float, rtol: float,
                                           update: str) -> None:
    from fusebackend.kernels import runtime

    original = runtime.reduction_config
    chunk = 375 if update.endswith("masked(") else 256

    def small(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1,
              across_rows: bool = False, **kw: Any) -> dict[str, int]:
        return ({"XBLOCK": blocks[0], "RBLOCK": blocks[1]} if rnumel == chunk
                else original(xnumel, rnumel, row_contiguous, passes, across_rows, **kw))

    monkeypatch.setattr(runtime, "reduction_config", small)
    x = torch.randn(rows, columns) * scale + mean
    v, m = compile_fn(lambda x: torch.var_mean(x, 0))(x)
    v64, m64 = _float64_var_mean(x, 0)
    torch.testing.assert_close(v.double(), v64, rtol=rtol, atol=0)
    torch.testing.assert_close(m.double(), m64, rtol=1e-6, atol=0)
    phase1 = next(s for s in sources() if "(split, phase 1)" in s)
    assert looped(phase1) and update in phase1 and "th.reduce_sum" in phase1
    if update == "th.welford_update_step(":
        assert "1.0 / (roffset // RBLOCK + 1)" in phase1 and "welford_update_masked" not in phase1


def test_split_column_reduction_uneven_chunks() -> None:
    # reducing the first dim of (70000, 2): two outputs, long strided rows, each split into 9
    # chunks of 7778 (the last one partial)
    out = check_lowered(lambda x: x.sum(0), torch.randn(70_000, 2), atol=1e-4, rtol=1e-4)
    assert out.shape == (2,) and kernel_count() == 2


def test_full_reduction_of_300k_to_scalar() -> None:
    x = torch.randn(300_007)
    out = check_lowered(lambda x: x.sum(), x, atol=1e-4, rtol=1e-4)
    assert out.shape == ()
    assert kernel_count() == 2, "a full reduction of 300k elements is split in two phases"


def test_full_reduction_of_2d_to_scalar_uneven_split() -> None:
    # 257 x 301 = 77357 elements: 10 chunks of 7736, the last one partial; each chunk position
    # is unravelled over both dims of the input
    check_lowered(lambda x: x.sum(), torch.randn(257, 301), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------- NaN, inf, ties, empty


def _with_nans(shape: tuple[int, ...], frac: float = 0.05) -> torch.Tensor:
    x = torch.randn(shape)
    x[torch.rand(shape) < frac] = math.nan
    x[0] = torch.randn(shape[1:])  # the first row has no NaN
    return x


NAN_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(-1),
    "amax_first": lambda x: x.amax(0),
    "argmax": lambda x: x.argmax(-1),
    "argmin": lambda x: x.argmin(-1),
    "argmax_first": lambda x: x.argmax(0),
    "max_dim": lambda x: tuple(torch.max(x, -1)),
    "min_dim": lambda x: tuple(torch.min(x, -1)),
    "sum": lambda x: x.sum(-1),
    "amax_all": lambda x: x.amax(),
    "argmax_all": lambda x: x.argmax(),
}


@pytest.mark.parametrize("name", list(NAN_OPS), ids=str)
def test_nan_propagation(name: str) -> None:
    check_lowered(NAN_OPS[name], _with_nans((8, 30)))


def test_all_nan_row() -> None:
    x = torch.randn(4, 9)
    x[2] = math.nan
    check_lowered(lambda x: (x.amax(-1), x.argmax(-1), x.argmin(-1), torch.softmax(x, -1)), x)


def test_infinities() -> None:
    x = torch.randn(6, 20)
    x[1, 3] = math.inf
    x[2, 4] = -math.inf
    x[3] = -math.inf  # all -inf: argmax is the first index, amax is -inf
    x[4, 7] = math.inf
    x[4, 9] = math.inf
    check_lowered(lambda x: (x.amax(-1), x.amin(-1), x.argmax(-1), x.argmin(-1), x.sum(-1)), x)


def test_logsumexp_with_infinite_rows() -> None:
    x = torch.randn(5, 12)
    x[1] = -math.inf  # logsumexp is -inf
    x[2, 3] = math.inf  # logsumexp is inf
    x[3, :6] = -math.inf
    check_lowered(lambda x: torch.logsumexp(x, -1), x)


def test_softmax_masked_row() -> None:
    x = torch.randn(4, 16)
    x[:, 8:] = -math.inf  # masked attention positions
    out = check_lowered(lambda x: torch.softmax(x, -1), x)
    assert (out[:, 8:] == 0).all()


def test_argmax_ties_first_index() -> None:
    x = torch.randint(0, 3, (16, 12)).float()  # many equal maxima and minima per row
    check_lowered(lambda x: (x.argmax(-1), x.argmin(-1), torch.max(x, -1)[1], torch.min(x, 0)[1]), x)


def test_argmax_ties_expanded() -> None:
    x = torch.randn(12, 1).expand(12, 14)  # every row constant: index 0
    out = check_lowered(lambda x: (x.argmax(-1), x.argmin(-1)), x)
    assert (out[0] == 0).all() and (out[1] == 0).all()


# A reduction over a 0-size dim once loaded from the empty tensor's null pointer and crashed the
# interpreter with a segmentation fault; a crash would take the test process with it, so these
# cases run in a child process.
EMPTY_CHILD = """
import os, sys
import torch, fusebackend
from helpers import check
try:  # the name, where the package is on the path but not installed (as conftest.py does)
    torch._dynamo.lookup_backend("fuse")
except Exception:
    torch._dynamo.register_backend(name="fuse")(fusebackend.fuse)
device = os.environ.get("FUSE_TEST_DEVICE", "cpu")
for shape, dims in (((0, 5), ()), ((4, 0), (-1,))):
    torch._dynamo.reset()
    fusebackend.metrics.reset()
    print("case", shape, dims, flush=True)
    x = torch.randn(shape, device=device)
    out = check(lambda x: (x.sum(*dims), x.prod(*dims), x.any(*dims), x.all(*dims)), x)
    assert out[0].eq(0).all() and out[1].eq(1).all() and not out[2].any() and out[3].all()
    assert fusebackend.last_compiled() is not None and not fusebackend.metrics.fallbacks
print("ok")
"""


def test_empty_reductions() -> None:
    # sum over a 0-size dim is 0, prod 1, any False, all True; rows of 0 and a full reduction of 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(EMPTY_CHILD)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, (
        f"child exited with {proc.returncode} (-11: segmentation fault) after:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    )


def test_empty_output_rows() -> None:
    # zero rows to reduce: nothing to compute, the output is empty
    check(lambda x: (x.sum(-1), x.amax(-1)), torch.randn(0, 7))


def test_reduce_over_size_one_dim() -> None:
    x = torch.randn(5, 1, 6)
    check_lowered(lambda x: (x.sum(1), x.amax(1), x.argmax(1), x.var(1, correction=0), torch.softmax(x, 1)), x)


def test_zero_dim_input() -> None:
    check_lowered(lambda x: (x.sum(), x.amax(), x.argmax(), x.mean()), torch.randn(()))


# --------------------------------------------------------------------- reductions in context


def test_reduction_of_a_broadcast_expression() -> None:
    x, y = torch.randn(8, 1, 16), torch.randn(1, 12, 16)
    check_lowered(lambda x, y: (x * y).sum(-1) + (x - y).amax(-1), x, y)


def test_chained_reductions() -> None:
    check_lowered(lambda x: x.sum(-1).amax(-1) + x.mean((1, 2)), torch.randn(6, 10, 12))


def test_reduction_result_reused_many_times() -> None:
    x = torch.randn(9, 33)
    check_lowered(lambda x: (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True) * x.amax(-1, keepdim=True), x)


def test_full_max_min_is_generated() -> None:
    check_lowered(lambda x: (x.max(), x.min()), torch.randn(7, 9))
