"""Fusion tests for reductions: how many kernels a program becomes and what their source does.

Every test also compares with eager (``check``), so a fusion that changes a value fails here too.
Kernel sources come from ``helpers.kernels()``; the schedule report from
``fusebackend.last_compiled().schedule``.

The 32-row looped softmax is compiled through ``pipeline.compile_graph`` without running it: in
Triton's interpreter its ``tl.reduce`` calls would take minutes (one Python combine call per
element). The same kernel shape is run on one row of 20000 for correctness.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import fusebackend
from fusebackend import decompositions, pipeline
from fusebackend.kernels import runtime
from helpers import FULL, check, compile_fn, kernel_count, kernels, run_together, without_tails

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32


def loads(source: str) -> int:
    return without_tails(source).count("tl.load(")


def stores(source: str) -> int:
    return without_tails(source).count("tl.store(")


def only_kernel() -> str:
    ks = kernels()
    assert len(ks) == 1, f"expected one kernel, got {list(ks)}\n{fusebackend.last_compiled().schedule}"
    return next(iter(ks.values()))


def one_kernel(fn: Callable[..., Any], *args: Any, atol: float | None = None, rtol: float | None = None) -> str:
    """Compile ``fn``, compare with eager, assert it became one kernel and no extern; its source."""
    check(fn, *args, atol=atol, rtol=rtol)
    assert not fusebackend.metrics.fallbacks, dict(fusebackend.metrics.fallbacks)
    assert kernel_count() == 1, fusebackend.last_compiled().schedule
    return only_kernel()


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def compile_only(fn: Callable[..., Any], *args: torch.Tensor) -> fusebackend.CompiledArtifacts:
    """Lower, schedule and generate ``fn``'s decomposed ATen graph for ``args``, without running it."""
    gm = make_fx(fn, decomposition_table=decompositions.decomposition_table())(*args)
    return pipeline.compile_graph(gm, list(args), "compile_only").artifacts


# ------------------------------------------------------------------------ one kernel each


@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=str)
def test_softmax_is_one_kernel_loading_once(dtype: torch.dtype) -> None:
    src = one_kernel(lambda x: torch.softmax(x, -1), torch.randn(8, 100).to(dtype))
    assert "persistent" in src and "for roffset in range" not in src
    assert loads(src) == 1, src  # the row stays in registers for the max, the sum and the output
    assert stores(src) == 1, src


def test_log_softmax_is_one_kernel() -> None:
    src = one_kernel(lambda x: torch.log_softmax(x, -1), torch.randn(8, 100))
    assert loads(src) == 1 and stores(src) == 1


def test_softmax_over_first_dim_is_one_kernel() -> None:
    src = one_kernel(lambda x: torch.softmax(x, 0), torch.randn(40, 12))
    # one load per pass over the columns: one when the column fits a block (the interpreter's
    # config), three (max, sum, outputs) when it is looped (the GPU's blocks of 16 rows)
    assert loads(src) == (1 if "persistent" in src else 3) and stores(src) == 1


def test_softmax_of_transposed_input_is_one_kernel() -> None:
    one_kernel(lambda x: torch.softmax(x.t(), -1), torch.randn(24, 10))


def test_softmax_looped_one_row_is_one_kernel() -> None:
    src = one_kernel(lambda x: torch.softmax(x, -1), torch.randn(1, 20_000))
    assert "for roffset in range" in src
    assert stores(src) == 1


@pytest.mark.parametrize("tail", [False, True], ids=["masked", "tail"])
def test_softmax_looped_32_rows_of_20000_is_one_looped_kernel(monkeypatch: pytest.MonkeyPatch, tail: bool) -> None:
    # the max, the sum, then the normalized output. A row of at least runtime.TAIL_BLOCKS whole
    # blocks (here 1: the interpreter's blocks of 16384) runs each pass's whole blocks unmasked,
    # then the row's last, partial block masked; a shorter one masks every block.
    monkeypatch.setattr(runtime, "TAIL_BLOCKS", 1 if tail else 8)
    art = compile_only(lambda x: torch.softmax(x, -1), torch.randn(32, 20_000))
    assert art.kernel_count == 1, art.schedule
    src = next(iter(art.kernels.values()))
    whole = "for roffset in range(0, rnumel - RBLOCK + 1, RBLOCK)" if tail else "for roffset in range(0, rnumel, RBLOCK)"
    assert without_tails(src).count("for roffset in range(") == 3 and src.count(whole) == 3, src
    assert src.count("for roffset in range(rnumel - rnumel % RBLOCK, rnumel, RBLOCK)") == (3 if tail else 0), src
    main = without_tails(src)
    assert ("rmask" in main) != tail, src  # whole blocks unmasked, where the tail takes the rest
    assert stores(src) == 1
    assert "split" not in src  # rows under 64K elements: no split


@pytest.mark.parametrize("dtype", [f32, bf16], ids=str)
def test_layer_norm_of_residual_add_is_one_kernel(dtype: torch.dtype) -> None:
    x, r, w, b = (torch.randn(s).to(dtype) for s in ((4, 6, 64), (4, 6, 64), (64,), (64,)))
    src = one_kernel(lambda x, r, w, b: F.layer_norm(x + r, (64,), w, b, 1e-5), x, r, w, b)
    assert loads(src) == 4, src  # x, r, w, b: each once
    assert stores(src) == 1, src


@pytest.mark.parametrize("dtype", [f32, bf16], ids=str)
@pytest.mark.parametrize("shape, groups", [((4, 32, 6, 5), 8), ((3, 12, 7, 9), 3), ((2, 6, 33, 65), 3)],
                         ids=["4x32x6x5-g8", "3x12x7x9-g3", "2x6x33x65-g3"])
def test_group_norm_and_silu_over_nchw_is_one_kernel(dtype: torch.dtype, shape: tuple[int, ...], groups: int) -> None:
    # The statistics per (sample, group), then the output, which scales each element by a value
    # per (sample, channel): the group's rstd times the channel's weight. That value, between a
    # row value and a full one, is evaluated at each position (inlined), so the output pass joins
    # the reduction's kernel: the activations read once from memory and written once
    # (before: a second kernel read them again).
    w, b = torch.randn(shape[1]).to(dtype), torch.randn(shape[1]).to(dtype)
    x = (torch.randn(shape) * 2 + 1).to(dtype)
    src = one_kernel(lambda x: F.silu(F.group_norm(x, groups, w, b, 1e-5)), x)
    assert stores(src) == 1, src  # the output only: no scale per (sample, channel) in memory
    assert "rindex //" in src, src  # the channel of each position, for the weight and the bias


def test_group_norm_over_a_strided_input_is_one_kernel() -> None:
    x = torch.randn(2, 8, 10, 22)[:, :, :, ::2]  # not contiguous
    w, b = torch.randn(8), torch.randn(8)
    one_kernel(lambda x: F.group_norm(x, 4, w, b), x)


def test_a_value_per_channel_that_is_returned_keeps_its_own_kernel() -> None:
    # the per-(sample, channel) scale returned as well must be stored, and a reduction's kernel has
    # no space of that size: it is a kernel apart, and both outputs match eager
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, c = x.shape[:2]
        rows = x.reshape(n, 2, -1)
        rstd = torch.rsqrt(rows.var(-1, unbiased=False) + 1e-5)  # (n, groups)
        scale = rstd.repeat_interleave(c // 2, 1) * w  # (n, c)
        mean = rows.mean(-1).repeat_interleave(c // 2, 1)
        return (x - mean[:, :, None, None]) * scale[:, :, None, None], scale

    check(fn, torch.randn(3, 8, 5, 7), torch.randn(8))
    assert kernel_count() >= 2, fusebackend.last_compiled().schedule


def test_layer_norm_returning_the_sum_is_one_kernel() -> None:
    x, r = torch.randn(12, 64), torch.randn(12, 64)

    def fn(x, r):
        h = x + r
        return h, F.layer_norm(h, (64,))

    src = one_kernel(fn, x, r)
    assert stores(src) == 2, src


def test_rms_norm_is_one_kernel() -> None:
    src = one_kernel(rms_norm, torch.randn(4, 6, 64), torch.randn(64))
    assert loads(src) == 2 and stores(src) == 1, src


def test_rms_norm_half_is_one_kernel() -> None:
    def fn(x, w):
        return rms_norm(x.float(), w.float()).to(x.dtype)

    one_kernel(fn, torch.randn(4, 6, 64).to(bf16), torch.randn(64).to(bf16))


def test_var_mean_is_one_kernel() -> None:
    src = one_kernel(lambda x: torch.var_mean(x, -1), torch.randn(16, 100))
    assert loads(src) == 1 and stores(src) == 2, src


def test_var_mean_looped_is_one_kernel() -> None:
    src = one_kernel(lambda x: torch.var_mean(x, -1), torch.randn(1, 20_000), atol=1e-4, rtol=1e-4)
    assert "for roffset in range" in src and stores(src) == 2


def test_two_reductions_of_the_same_rows_share_one_kernel() -> None:
    src = one_kernel(lambda x: (x.sum(-1), x.amax(-1), x.amin(-1)), torch.randn(16, 100))
    assert loads(src) == 1 and stores(src) == 3, src


def test_pointwise_prologue_fuses_into_reduction() -> None:
    src = one_kernel(lambda x: (x * 2 + 1).sum(-1), torch.randn(16, 100))
    assert loads(src) == 1 and stores(src) == 1


def test_prologue_with_broadcast_operands_fuses() -> None:
    src = one_kernel(lambda x, w, b: torch.tanh(x * w + b).amax(-1), torch.randn(16, 100), torch.randn(100), torch.randn(100))
    assert loads(src) == 3 and stores(src) == 1


def test_broadcast_epilogue_fuses_into_reduction() -> None:
    src = one_kernel(lambda x: x - x.mean(-1, keepdim=True), torch.randn(16, 100))
    assert loads(src) == 1 and stores(src) == 1


def test_column_epilogue_fuses() -> None:
    src = one_kernel(lambda x: x / x.sum(0, keepdim=True), torch.rand(30, 12) + 0.5)
    assert stores(src) == 1


def test_row_consumer_fuses() -> None:
    src = one_kernel(lambda x, y: torch.sigmoid(x.sum(-1) * 0.1 + y), torch.randn(16, 100), torch.randn(16))
    assert stores(src) == 1


def test_squared_deviation_sum_is_one_kernel() -> None:
    # a reduction of an epilogue of a reduction over the same rows (two dependent reductions)
    one_kernel(lambda x: (x - x.mean(-1, keepdim=True)).pow(2).sum(-1), torch.randn(16, 100))


def test_softmax_of_softmax_is_one_kernel() -> None:
    one_kernel(lambda x: torch.softmax(torch.softmax(x, -1) * 3, -1), torch.randn(8, 64))


def test_reduction_over_reshaped_input_fuses() -> None:
    one_kernel(lambda x: x.reshape(8, 8, 8) - x.reshape(8, 8, 8).mean(-1, keepdim=True), torch.randn(8, 64))


# ---------------------------------------------------------- outputs needed outside the kernel


def test_reduction_input_also_returned() -> None:
    x = torch.randn(16, 100)

    def fn(x):
        y = x.exp()
        return y, y.sum(-1)

    check(fn, x)
    assert kernel_count() <= 2
    assert sum(stores(s) for s in kernels().values()) == 2
    if kernel_count() == 1:
        assert loads(only_kernel()) == 1


def test_reduction_input_also_used_by_another_reduction_shape() -> None:
    x = torch.randn(12, 40)

    def fn(x):
        y = x * 3 - 1
        return y.sum(-1), y.sum(0), y

    check(fn, x)
    assert kernel_count() <= 3


def test_softmax_and_its_row_max_returned() -> None:
    src = one_kernel(lambda x: (torch.softmax(x, -1), x.amax(-1)), torch.randn(8, 64))
    assert stores(src) == 2


def test_mean_and_centered_both_returned() -> None:
    src = one_kernel(lambda x: (x.mean(-1, keepdim=True), x - x.mean(-1, keepdim=True)), torch.randn(8, 64))
    assert stores(src) == 2


def test_layer_norm_saved_statistics() -> None:
    x, w, b = torch.randn(8, 64), torch.randn(64), torch.randn(64)
    src = one_kernel(lambda x: torch.native_layer_norm(x, (64,), w, b, 1e-5), x)
    assert stores(src) == 3  # output, mean, rstd


# ----------------------------------------------------------- fusions that must not happen


def test_rows_and_columns_are_two_kernels() -> None:
    check(lambda x: (x.sum(-1), x.sum(0)), torch.randn(16, 64))  # (columns of 8 would be unrolled)
    assert kernel_count() == 2
    assert "reductions differ" in fusebackend.last_compiled().schedule


def test_row_times_column_reduction() -> None:
    check(lambda x: x.sum(-1, keepdim=True) * x.sum(0, keepdim=True), torch.randn(8, 64))
    assert kernel_count() >= 2


def test_epilogue_reading_another_rows_reduction() -> None:
    # each row subtracts the mean of another row: that value is not in this row's registers
    check(lambda x: x - x.mean(-1, keepdim=True).flip(0), torch.randn(8, 64))
    check(lambda x: x * x.amax(-1, keepdim=True)[1:].sum(), torch.randn(8, 64))


def test_transposed_epilogue_of_a_row_reduction() -> None:
    check(lambda x: x.t() - x.mean(-1).unsqueeze(0), torch.randn(8, 64))


def test_mutated_input_after_reduction() -> None:
    def fn(x):
        x -= x.mean(-1, keepdim=True)
        return x.sum()

    xe = torch.randn(8, 64)
    xc = xe.clone()
    expected = fn(xe)
    actual = compile_fn(fn)(xc)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xc, xe, atol=1e-6, rtol=1e-6)
    assert fusebackend.metrics.eager_graphs == 0


# -------------------------------------------------------------------------- losses


def test_nll_of_log_softmax_inference() -> None:
    x, t = torch.randn(16, 50), torch.randint(0, 50, (16,))
    check(lambda x, t: F.nll_loss(F.log_softmax(x, -1), t), x, t)
    assert fusebackend.metrics.eager_graphs == 0
    assert 1 <= kernel_count() <= 2, fusebackend.last_compiled().schedule


SCHEDULE_CHILD = """
import torch, torch.nn.functional as F, fusebackend
x, t = torch.randn(16, 50), torch.randint(0, 50, (16,))
torch.compile(lambda x, t: F.nll_loss(F.log_softmax(x, -1), t), backend=fusebackend.fuse)(x, t)
print(fusebackend.last_compiled().schedule)
"""


def test_schedule_does_not_depend_on_string_hashing(tmp_path: Any) -> None:
    """The same graph in processes with different string hashes (sets of names iterate in
    another order) gets the same schedule. The log-softmax, gathered at the targets, reads its
    input both whole (the row maximum) and at one position a row: counted as a gather where the
    set met the gather first, its kernel read 200 B of a 3200 B input, and the schedule changed
    with the process (PYTHONHASHSEED=2: 3 kernels instead of 2). Each process has cache folders of
    its own, so that both schedule the graph (neither loads the other's), and they run at once."""
    import os
    import sys

    runs = [([sys.executable, "-c", SCHEDULE_CHILD],
             dict(os.environ, PYTHONHASHSEED=seed, FUSE_CACHE_DIR=str(tmp_path / seed / "fuse"),
                  TORCHINDUCTOR_CACHE_DIR=str(tmp_path / seed / "inductor"))) for seed in ("1", "2")]
    schedules = []
    for proc in run_together(runs, tmp_path):
        assert proc.returncode == 0, proc.stderr[-2000:]
        schedules.append(proc.stdout)
    assert schedules[0] == schedules[1]
    assert "2 kernels" in schedules[0] and "read 3.25 KiB" in schedules[0], schedules[0]


def test_cross_entropy_inference() -> None:
    x, t = torch.randn(16, 50), torch.randint(0, 50, (16,))
    check(lambda x, t: F.cross_entropy(x, t), x, t)
    assert kernel_count() <= 2


def test_nll_of_log_softmax_training_forward_graph() -> None:
    x, t = torch.randn(16, 50), torch.randint(0, 50, (16,))
    fn = lambda x, t: F.nll_loss(F.log_softmax(x, -1), t)  # noqa: E731
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = fn(xe, t)
    actual = compile_fn(fn)(xc, t)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    expected.backward()
    actual.backward()
    torch.testing.assert_close(xc.grad, xe.grad, atol=1e-6, rtol=1e-5)
    assert fusebackend.metrics.eager_graphs == 0
    forward = [a for a in fusebackend.history() if a.name.startswith("forward")]
    assert len(forward) == 1
    assert 1 <= forward[0].kernel_count <= 2, forward[0].schedule
    for name in ("amax", "sum", "log_softmax", "nll_loss"):
        assert name not in fusebackend.metrics.fallbacks


def test_softmax_training_forward_and_backward() -> None:
    x = torch.randn(8, 64)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    g = torch.randn(8, 64)
    fn = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    torch.testing.assert_close(compile_fn(fn)(xc), fn(xe))
    fn(xe).backward(g)
    compile_fn(fn)(xc).backward(g)
    torch.testing.assert_close(xc.grad, xe.grad, atol=1e-6, rtol=1e-5)
    assert fusebackend.metrics.eager_graphs == 0
    backward = [a for a in fusebackend.history() if a.name.startswith("backward")]
    assert backward and all(a.kernel_count == 1 for a in backward), [a.schedule for a in backward]


def test_layer_norm_training_is_one_kernel_each_way() -> None:
    x, w, b = torch.randn(8, 64), torch.randn(64), torch.randn(64)
    xe, we, be = (t.clone().requires_grad_() for t in (x, w, b))
    xc, wc, bc = (t.clone().requires_grad_() for t in (x, w, b))
    fn = lambda x, w, b: F.layer_norm(x, (64,), w, b)  # noqa: E731
    g = torch.randn(8, 64)
    fn(xe, we, be).backward(g)
    out = compile_fn(fn)(xc, wc, bc)
    torch.testing.assert_close(out, fn(xe, we, be))
    out.backward(g)
    for a, e in ((xc, xe), (wc, we), (bc, be)):
        torch.testing.assert_close(a.grad, e.grad, atol=1e-5, rtol=1e-5)
    forward = [a for a in fusebackend.history() if a.name.startswith("forward")]
    assert len(forward) == 1 and forward[0].kernel_count == 1, forward[0].schedule
    assert fusebackend.metrics.eager_graphs == 0


@pytest.mark.parametrize("rows", [4096, 4100], ids=["chunks-divide", "padded-last-chunk"])
def test_stored_prologue_fuses_into_a_split_column_sum(rows: int) -> None:
    # t is returned (so stored) and summed over its 4096+ rows: phase 1 of the split sum computes
    # and stores t while reducing it, instead of a kernel of its own that phase 1 reads back
    def fn(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.float() * g.float()
        return t, t.sum(0)

    x, g = torch.randn(rows, 8, dtype=torch.bfloat16), torch.randn(rows, 8, dtype=torch.bfloat16)
    check(fn, x, g)
    assert kernel_count() == 2  # phase 1 with t's store, phase 2
    first = kernels()[min(kernels())]
    assert "split, phase 1" in first and stores(first) == 2
    (store,) = [line for line in first.splitlines() if "tl.store(" in line and "xindex //" in line]
    if rows % 16:
        # equal chunks overrun the rows (16 x 257 pairs for 4100 rows): the pairs past the end
        # point back at rows already stored, and store nothing
        guard = next(line.split(" = ")[0].strip() for line in first.splitlines() if f"< {rows}" in line)
        assert f"{guard} & " in store
    else:
        assert "<" not in store


SPLIT_PROLOGUES = {
    "column": (lambda x: (torch.sigmoid(x), torch.sigmoid(x).sum(0)), (20000, 5)),  # 78 chunks of 257 rows
    "two-reduced-dims": (lambda x: (x * 2, (x * 2).sum((0, 2))), (11, 3, 7001)),  # chunks of 7702 across two dims
    "row": (lambda x: (torch.exp(x), torch.exp(x).sum(-1)), (2, 70_001)),  # a split row sum, 9 chunks of 7778
}


# Looped in blocks of 64 positions, the two-reduced-dims and row cases took 12.5 s and 5.3 s of the
# interpreter's time on 2 cores: by default only the column case runs looped (pytest --full: all).
@pytest.mark.parametrize("looped, fn, shape", [
    pytest.param(looped, fn, shape, id=f"{which}-{name}", marks=FULL if looped and name != "column" else ())
    for which, looped in (("persistent", False), ("looped", True)) for name, (fn, shape) in SPLIT_PROLOGUES.items()])
def test_stored_prologue_of_a_split_in_unequal_chunks(monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Any],
                                                      shape: tuple[int, ...], looped: bool) -> None:
    # every element of the stored prologue is written once, the tail of the last chunk included;
    # looped: the store is made by the loop's one pass (blocks of 64 positions); persistent: each
    # chunk in one block (on any device)
    original = runtime.reduction_config

    def blocks(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1,
               across_rows: bool = False, **kw: Any) -> dict[str, int]:
        rblock = 64 if looped else 1 << (rnumel - 1).bit_length()
        return {**original(xnumel, rnumel, row_contiguous, passes, across_rows, **kw), "RBLOCK": rblock}

    monkeypatch.setattr(runtime, "reduction_config", blocks)
    x = torch.randn(shape)
    check(fn, x, atol=1e-4, rtol=1e-5)
    assert kernel_count() == 2, fusebackend.last_compiled().schedule
    first = kernels()[min(kernels())]
    assert "split, phase 1" in first and stores(first) == 2
    assert ("for roffset in range" in first) == looped


@pytest.mark.parametrize("small", [True, False], ids=["merged", "over-the-size-bound"])
def test_second_phases_of_two_split_sums_share_a_launch(monkeypatch: pytest.MonkeyPatch, small: bool) -> None:
    # batch norm's backward: sum(g) and sum(g * x) over many rows. Phase 1 computes both partial
    # sums in one kernel (both read g); the two phase 2s read only partials, share no buffer and
    # save no bytes together, but are small: one kernel, one launch fewer
    from fusebackend.scheduler import fusion

    if not small:
        monkeypatch.setattr(fusion, "SMALL_KERNEL_BYTES", 0)
    check(lambda g, x: (g.sum(0), (g * x).sum(0)), torch.randn(8192, 16), torch.randn(8192, 16))
    schedule = fusebackend.last_compiled().schedule
    assert kernel_count() == (2 if small else 3), schedule
    assert ("no bytes saved, one launch fewer" in schedule) == small


@pytest.mark.parametrize("shape, count", [((8, 64, 32), 1), ((4, 2500, 6), 2)], ids=["one-pass", "padded-split"])
def test_stored_output_fuses_with_a_sum_over_a_reshape_of_it(shape: tuple[int, ...], count: int) -> None:
    # g * x is [B, S, H]; the sum runs over g viewed as [B*S, H] (a bias gradient): as many
    # elements in another shape, matched in row-major order, so g is read once. 10000 rows of 6
    # split in 39 chunks of 257: the pairs past the end store nothing
    last = shape[-1]
    check(lambda g, x: (g * x, g.reshape(-1, last).sum(0)), torch.randn(shape), torch.randn(shape))
    assert kernel_count() == count, fusebackend.last_compiled().schedule
    first = kernels()[min(kernels())]
    assert first.count("tl.store(") == 2 and len(re.findall(r"tl\.load\(in_ptr", first)) == 2


def test_small_independent_kernels_share_a_launch() -> None:
    # a * 2 and b.sum() read different inputs and nothing of each other: no bytes saved, but both
    # are small and a's elements map onto the sum's (row, position) pairs: one kernel
    from fusebackend.scheduler.fusion import _may_share_space

    check(lambda a, b: (a * 2, b.sum()), torch.randn(8, 5), torch.randn(8, 5))
    assert kernel_count() == 1, fusebackend.last_compiled().schedule
    assert "one launch fewer" in fusebackend.last_compiled().schedule
    assert _may_share_space((40,), (1, 40)) and _may_share_space((8, 5), (8,))
    assert not _may_share_space((39,), (1, 40)) and not _may_share_space((8, 5), (40, 1))


def test_stored_prologue_fuses_into_a_split_row_sum() -> None:
    # two rows of 70 000: the row sum is split in chunks; t is stored by phase 1 as well
    x = torch.randn(2, 70_000)
    check(lambda x: (torch.sigmoid(x), torch.sigmoid(x).sum(-1)), x)
    assert kernel_count() == 2


def test_a_hundred_long_rows_split() -> None:
    # 100 rows of 64K elements would leave most of an H100's 132 SMs idle with a program a row:
    # the reduction splits each row (builder.split_count), two kernels: partial sums, then theirs
    art = compile_only(lambda x: x.sum(-1), torch.randn(100, 65536))
    assert art.kernel_count == 2, art.schedule
    assert any("split, phase 1" in src for src in art.kernels.values())
    art = compile_only(lambda x: x.sum(-1), torch.randn(256, 65536))  # enough rows: one kernel
    assert art.kernel_count == 1 and "split" not in next(iter(art.kernels.values()))


@pytest.mark.parametrize("shape", [(2, 48, 6, 5), (3, 7, 5, 1)], ids=str)
def test_a_channels_last_value_stored_beside_a_norm_over_its_channels_shares_its_loads(shape: tuple) -> None:
    # y is logically [N, C, H, W] and channels-last in memory; the layer norm reads it as
    # [N*H*W, C], its memory order. Stored where the norm reads it, y's store shares the norm's
    # loads and addresses (no index arithmetic); matched by logical order it was reloaded and
    # stored at scrambled addresses (one element per sector on a GPU)
    n, c, h, w = shape
    x = torch.randn(shape).to(memory_format=torch.channels_last)
    b, g = torch.randn(c), torch.randn(c)

    def fn(x: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + b[None, :, None, None]
        return y, F.layer_norm(y.permute(0, 2, 3, 1), (c,), g)

    src = one_kernel(fn, x, b, g)
    assert compile_fn(fn)(x, b, g)[0].stride() == fn(x, b, g)[0].stride()
    assert loads(src) == 3 and stores(src) == 2, src  # x, b, g once each; y and the norm
    assert "//" not in src and "%" not in src, src


def test_a_channels_last_sum_over_all_but_channels_stores_its_addend_in_read_order() -> None:
    # a bias gradient of a channels-last activation: (a + b) is stored (another reader needs it)
    # and summed over N, H, W; the sum reads it as [N*H*W, C] in memory order
    a, b = (torch.randn(4, 24, 7, 9).to(memory_format=torch.channels_last) for _ in range(2))

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = a + b
        return s, s.sum((0, 2, 3))

    src = one_kernel(fn, a, b)
    assert loads(src) == 2 and stores(src) == 2, src
    assert "//" not in src and "%" not in src, src



def test_a_sum_beside_a_copy_it_would_store_across_its_rows_is_two_kernels() -> None:
    # a bias gradient: g (NCHW) summed over N, H, W, beside g's channels-last copy for a
    # convolution. The sum reads each channel's row along (runs of H*W); the copy would be stored
    # C elements apart along it. Refused: the copy is a tiled transpose, the sum its own kernel
    g = torch.randn(2, 64, 48, 48)  # 1.1 MiB: above SMALL_KERNEL_BYTES
    check(lambda g: ((g * 2).contiguous(memory_format=torch.channels_last), (g * 2).sum((0, 2, 3))), g)
    assert kernel_count() == 2
    (schedule,) = [a.schedule for a in fusebackend.history()]
    assert "stored across the rows the reduction reads along (its positions 64 elements apart)" in schedule
    copy, total = kernels().values()
    assert "# tiled:" in copy and "th.reduce_sum" in total


def test_a_norm_reading_its_rows_across_may_store_across_them() -> None:
    # a layer norm over the channels of an NCHW tensor reads each row across (H*W apart) and
    # stores y the same way: several rows a block, both coalesce; one kernel
    x, b, w = torch.randn(2, 64, 48, 48), torch.randn(64), torch.randn(64)

    def fn(x: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + b[None, :, None, None]
        return y, F.layer_norm(y.permute(0, 2, 3, 1), (64,), w)

    check(fn, x, b, w)
    assert kernel_count() == 1
