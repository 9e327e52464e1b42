"""Scans (cumsum, cumprod, logcumsumexp, cummax, cummin) against eager, and how they fuse.

Op tests run each scan over dtypes, shapes (odd, tiny, one position, 0-dim, empty), dims
(negative, first, middle) and layouts (transposed, sliced), asserting a generated kernel and no
ATen fallback. Under the interpreter a scan block holds at most 32 positions
(``runtime.scan_config``), so the rows of 40 and more here run the looped kernel, which carries
each row's running total from block to block; shorter rows are scanned in one block. Tensors
stay tiny: the interpreter calls a scan's combine function once per element, in Python.

Fusion tests assert kernel counts and what the generated source contains: a pointwise prologue
and epilogue share the scan's kernel; a consumer that reads the scan at another element does not.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch

import fusebackend
from fusebackend import indexing, ir
from fusebackend.kernels import runtime
from helpers import check, check_lowered, diagonal, kernel_count, kernels

f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
i32, i64, b1 = torch.int32, torch.int64, torch.bool

SCANS: dict[str, Callable[[torch.Tensor, int], Any]] = {
    "cumsum": lambda x, d: torch.cumsum(x, d),
    "cumprod": lambda x, d: torch.cumprod(x, d),
    "logcumsumexp": lambda x, d: torch.logcumsumexp(x, d),
    "cummax": lambda x, d: torch.cummax(x, d),
    "cummin": lambda x, d: torch.cummin(x, d),
}
DTYPES = {
    "cumsum": (f32, bf16, f16, f64, i32, i64, b1),
    "cumprod": (f32, bf16, i32, i64),
    "logcumsumexp": (f32, bf16),
    "cummax": (f32, bf16, i32, i64),
    "cummin": (f32, bf16, i32, i64),
}


def values(op: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Inputs whose scans stay finite and exact enough: products of numbers near 1, small
    integers (repeated: cummax ties) for the extremes."""
    if dtype == b1:
        return torch.rand(shape) < 0.5
    if not dtype.is_floating_point:
        lo, hi = (-2, 3) if op == "cumprod" else (-50, 50)
        return torch.randint(lo, hi, shape, dtype=dtype)
    if op == "cumprod":
        return (torch.rand(shape) + 0.5).to(dtype)
    if op in ("cummax", "cummin"):
        return torch.randint(-6, 6, shape).to(dtype)  # ties: the later position wins
    return torch.randn(shape).to(dtype)


def tolerance(op: str, dtype: torch.dtype, length: int) -> dict[str, float]:
    if dtype in (bf16, f16) and op in ("cumsum", "cumprod"):
        # eager rounds its half-precision running total at every step, we once at the end
        return {"atol": 0.05 * math.sqrt(length), "rtol": 0.05}
    if dtype == f32 and op in ("cumsum", "cumprod"):
        return {"atol": 1e-4, "rtol": 1e-4}  # a tree of sums, not eager's sequence
    return {}


@pytest.mark.parametrize("op,dtype", [(op, d) for op in SCANS for d in DTYPES[op]], ids=str)
def test_scan_dtype(op: str, dtype: torch.dtype) -> None:
    x = values(op, (3, 45), dtype)  # 45 > 32: looped, with a partial last block
    check_lowered(lambda x: SCANS[op](x, -1), x, **tolerance(op, dtype, 45))


SHAPES = [((7,), 0), ((5, 7), 1), ((5, 7), 0), ((2, 40, 3), 1), ((3, 33), -1), ((64, 2), -2), ((4, 1), 1),
          ((1, 9), 1), ((2, 3, 5), -3)]


@pytest.mark.parametrize("op,shape,dim", [("cumsum", *s) for s in SHAPES] + [("cummax", *s) for s in SHAPES]
                         + [(op, *s) for op in ("cumprod", "logcumsumexp", "cummin") for s in SHAPES[2:5]],
                         ids=str)
def test_scan_shape(op: str, shape: tuple[int, ...], dim: int) -> None:
    x = values(op, shape, f32)
    check_lowered(lambda x: SCANS[op](x, dim), x, **tolerance(op, f32, shape[dim]))


# by default each op in one of the layouts, taken in turn (pytest --full: every pair)
@pytest.mark.parametrize("op,layout", diagonal({op: op for op in ("cumsum", "cummax", "logcumsumexp")},
                                               {la: la for la in ("transposed", "sliced", "permuted")}))
def test_scan_layout(op: str, layout: str) -> None:
    base = values(op, (6, 36, 3), f32)
    x = {"transposed": base[:, :, 0].t(), "sliced": base[::2, 1:35, 1], "permuted": base[:3].permute(2, 0, 1)}[layout]
    for dim in (-1, 0):
        torch._dynamo.reset()
        out = check_lowered(lambda x: SCANS[op](x, dim), x, **tolerance(op, f32, x.shape[dim]))
        expected = SCANS[op](x, dim)
        first = out[0] if isinstance(out, tuple) else out
        assert first.stride() == (expected[0] if isinstance(expected, tuple) else expected).stride()


def test_scan_of_0dim_and_empty_tensors() -> None:
    check(lambda x: (torch.cumsum(x, 0), torch.cummax(x, 0)), torch.tensor(2.5))
    check(lambda x: torch.cumsum(x, 1), torch.randn(3, 0))
    check(lambda x: torch.cumprod(x, 0), torch.randn(0, 4))
    assert not fusebackend.metrics.fallbacks


def test_cumsum_dtype_argument_and_integer_promotion() -> None:
    x = torch.randint(-100, 100, (4, 37), dtype=i32)
    out = check_lowered(lambda x: (torch.cumsum(x, 1), torch.cumsum(x, 1, dtype=f32), torch.cumsum(x > 0, 1)), x)
    assert [o.dtype for o in out] == [i64, f32, i64]
    big = torch.full((2, 40), 2**30, dtype=i32)  # an int32 sum would overflow; eager gives int64
    check_lowered(lambda x: torch.cumsum(x, -1), big)


def test_scan_special_values() -> None:
    x = torch.randn(3, 40)
    x[0, 3] = math.nan
    x[1, 5] = math.inf
    x[1, 7] = -math.inf
    x[2, :] = -math.inf  # log-sum-exp of nothing but -inf stays -inf
    x[2, 36] = math.nan
    for op in SCANS:
        torch._dynamo.reset()
        check_lowered(lambda x: SCANS[op](x, 1), x)


def test_cummax_ties_take_the_later_position_across_blocks() -> None:
    x = torch.zeros(2, 70)
    x[0, 10] = 1.0
    x[0, 40] = 1.0  # equal to the first maximum, in the second block
    x[1, :] = -math.inf
    values_, indices = check_lowered(lambda x: torch.cummax(x, 1), x)
    assert indices[0, 39] == 10 and indices[0, 40] == 40 and indices[1, 69] == 69


# ------------------------------------------------------------------------------------ fusion


def only_kernel() -> str:
    ks = kernels()
    assert len(ks) == 1, fusebackend.last_compiled().schedule
    return next(iter(ks.values()))


def test_prologue_and_epilogue_fuse_into_the_scan() -> None:
    check_lowered(lambda x: torch.cumsum(x * 2, -1) + 1, torch.randn(2, 5000), atol=1e-3, rtol=1e-4)
    src = only_kernel()
    assert "tl.associative_scan(" in src and "th.reduce_sum" in src
    assert "for roffset in range" in src  # longer rows than a block holds, on a GPU too
    assert src.count("tl.load(") == 1 and src.count("tl.store(") == 1


def test_short_rows_scan_in_one_block() -> None:
    check_lowered(lambda x: torch.cumprod(x, -1).exp(), torch.rand(6, 20) + 0.5)
    src = only_kernel()
    assert "tl.associative_scan(" in src and "th.scan_prod" in src
    assert "for roffset in range" not in src and "th.reduce_sum" not in src  # no carry


def test_scan_along_a_strided_dim_puts_rows_on_the_last_axis() -> None:
    check_lowered(lambda x: torch.cumsum(x, 0), torch.randn(40, 6))
    src = only_kernel()
    assert "tl.associative_scan(" in src and ", 0, th.reduce_sum)" in src  # along axis 0
    assert "xindex = xoffset + tl.arange(0, XBLOCK)[None, :]" in src


def test_cummax_values_and_indices_are_one_kernel() -> None:
    check_lowered(lambda x: torch.cummax(x, -1), torch.randn(3, 45))
    src = only_kernel()
    assert "th.combine_max" in src and "th.combine_cummax" in src
    assert src.count("tl.load(") == 1 and src.count("tl.store(") == 2


def test_stored_prologue_is_written_by_the_scan_kernel() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.sin()
        return y, torch.cumsum(y, 1)

    check_lowered(fn, torch.randn(3, 40))
    src = only_kernel()
    assert src.count("tl.load(") == 1 and src.count("tl.store(") == 2


def test_scan_of_a_scan_is_one_kernel() -> None:
    check_lowered(lambda x: torch.cumsum(torch.cumsum(x, -1), -1), torch.randn(3, 40), atol=1e-3, rtol=1e-4)
    assert only_kernel().count("tl.associative_scan(") == 2


def test_reading_the_scan_at_another_element_is_a_kernel_of_its_own() -> None:
    check_lowered(lambda x: torch.cumsum(x, 1).t() * 2, torch.randn(8, 8))
    assert kernel_count() == 2
    assert "reads scan" in fusebackend.last_compiled().schedule


def test_scan_then_reduction_are_two_kernels() -> None:
    check_lowered(lambda x: torch.cumsum(x, -1).amax(-1), torch.randn(4, 40))
    assert kernel_count() == 2
    assert "a scan shares its kernel with scans and pointwise nodes only" in fusebackend.last_compiled().schedule


def test_half_precision_scans_accumulate_in_fp32() -> None:
    x = torch.randn(2, 40, dtype=bf16)
    out = check_lowered(lambda x: torch.cumsum(x, -1), x, atol=0.3, rtol=0.05)
    exact = torch.cumsum(x.double(), -1)
    assert (out.double() - exact).abs().max() <= (torch.cumsum(x, -1).double() - exact).abs().max() + 1e-2
    assert "tl.float32" in only_kernel()


# --------------------------------------------------------------------------------------- IR


def test_scan_node_prints_and_verifies() -> None:
    x = ir.Buffer("arg0", f32, (4, 8), (8, 1))
    i = indexing.loop_vars("i", 2)
    node = ir.Scan(ir.Buffer("buf0", f32, (4, 8), (8, 1)), ir.Load(x.whole(), i), 1, "sum", "aten.cumsum.default")
    graph = ir.IRGraph("g", torch.device("cpu"), [x], [node], [node.buffer.whole()])
    ir.verify(graph)
    assert "sum scan along dim 1" in ir.format_node(node)
    with pytest.raises(ValueError):
        ir.Scan(node.buffer, node.body, 1, "mean", "x")
    bad = ir.IRGraph("g", torch.device("cpu"), [x], [ir.Scan(node.buffer, node.body, 2, "sum", "x")], [])
    with pytest.raises(AssertionError):
        ir.verify(bad)


def test_gpu_scan_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    assert runtime.scan_config(4096, 512, True) == {"XBLOCK": 2, "RBLOCK": 512, "num_warps": 4}
    assert runtime.scan_config(512, 100000, True)["RBLOCK"] == 1024  # looped
    assert runtime.scan_config(8, 100000, True) == {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}  # few rows
    assert runtime.scan_config(4096, 512, False) == {"XBLOCK": 32, "RBLOCK": 64, "num_warps": 4}
