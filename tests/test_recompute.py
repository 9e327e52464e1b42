"""Cheap pointwise nodes recomputed in their readers instead of stored
(``scheduler/recompute.py``): what the kernels store and read, asserted on the generated
source and the schedule report; every test that runs compares with eager too."""

from __future__ import annotations

from typing import Callable

import torch

import fusebackend
from helpers import check, kernel_count, kernels

bf16 = torch.bfloat16


def test_upcast_read_by_two_kernels_is_recomputed_not_stored() -> None:
    # xf feeds a row reduction and a column reduction: two kernels. Storing xf would write and
    # read back 4 bytes per element; each kernel reading the bf16 x again costs 2.
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        return xf.sum(0), xf.sum(1)

    x = torch.randn(24, 40, dtype=bf16)
    check(fn, x)
    assert kernel_count() == 2
    for source in kernels().values():
        assert source.count("tl.store(") == 1  # only the sums
        assert ".to(tl.float32)" in source
    report = fusebackend.last_compiled().schedule
    assert "recomputed in each reader" in report and "aten._to_copy" in report
    assert report.count("read 1.88 KiB") == 2  # each kernel reads x once: 24 x 40 bf16 = 1920 B


def test_chain_read_by_two_kernels_is_recomputed_not_stored() -> None:
    # d = (x.float() - column means) * 2 feeds a column sum and a row sum: two kernels. Its
    # expansion reads the bf16 x (2 bytes) and the means (one per column, cached), less than the
    # 4 bytes per element d would take to store and read back.
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        d = (xf - xf.mean(0)) * 2
        return d.sum(0), d.sum(1)

    check(fn, torch.randn(24, 40, dtype=bf16), atol=1e-4, rtol=1e-4)
    art = fusebackend.last_compiled()
    recomputed = art.schedule.split("recomputed in each reader", 1)[1]
    assert "aten.mul.Tensor" in recomputed and "computed only inside those" in recomputed
    stored = [line for line in art.fused_ir.splitlines() if "[stored]" in line]
    assert stored and all("[24, 40]" not in line for line in stored)  # nothing full-size is stored
    assert any("recomputes" in source for source in kernels().values())


def test_batch_norm_backward_stores_no_fp32_intermediate() -> None:
    # channels-last bf16 batch norm + ReLU in training: the backward's statistics are split
    # column reductions, a kernel apart from its last pass. The fp32 chains both read
    # ((x - mean) and the masked gradient, upcast) are recomputed from the bf16 tensors.
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32, 32, dtype=bf16).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(16, dtype=bf16), torch.randn(16, dtype=bf16)

    def loss(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.relu(torch.nn.functional.batch_norm(x, None, None, w, b, training=True))
        return y.float().square().mean()

    def grads(fn: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        leaves = [t.detach().requires_grad_() for t in (x, w, b)]
        fn(*leaves).backward()
        return [t.grad.float() for t in leaves]

    for actual, wanted in zip(grads(torch.compile(loss, backend="fuse")), grads(loss)):
        torch.testing.assert_close(actual, wanted, atol=2e-2, rtol=2e-2)
    backward = [a for a in fusebackend.history() if a.name.startswith("backward")][-1]
    assert "recomputed in each reader" in backward.schedule
    stored = [line for line in backward.fused_ir.splitlines() if "[stored]" in line]
    full = [line for line in stored if "[4, 16, 32, 32]" in line]
    assert full and all("bf16[" in line for line in full)  # only the bf16 input gradient
    assert not any("f32[4, 16, 32, 32]" in line for line in stored)


def test_upcast_of_a_stored_gradient_is_recomputed_from_it() -> None:
    # A residual block's backward: y = relu(bn(x) + s) read by two convolutions, so y's
    # gradient is the sum of two convolution backwards. The masked bf16 gradient is s's gradient
    # (stored: the graph returns it) and, upcast, what the batch-norm backward reads in two
    # kernels. Recomputed from the three tensors it comes from, the upcast would cost more than
    # storing it; recomputed from the stored bf16 gradient it costs 2 bytes an element, so no
    # fp32 copy is written.
    torch.manual_seed(0)
    x = torch.randn(4, 16, 32, 32, dtype=bf16).contiguous(memory_format=torch.channels_last)
    s = torch.randn(4, 16, 32, 32, dtype=bf16).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(16, dtype=bf16), torch.randn(16, dtype=bf16)

    k1, k2 = torch.randn(8, 16, 1, 1), torch.randn(8, 16, 1, 1)

    def loss(x: torch.Tensor, s: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.relu(torch.nn.functional.batch_norm(x, None, None, w, b, training=True) + s)
        out = torch.nn.functional.conv2d(y, k1.to(y.dtype)) * torch.nn.functional.conv2d(y, k2.to(y.dtype))
        return out.float().square().mean()

    def grads(fn: Callable[..., torch.Tensor], dtype: torch.dtype = bf16) -> list[torch.Tensor]:
        leaves = [t.detach().to(dtype).requires_grad_() for t in (x, s, w, b)]
        fn(*leaves).backward()
        return [t.grad.double() for t in leaves]

    exact = grads(loss, torch.float64)  # bf16 rounds at the ReLU's edge: judged against float64
    for actual, wanted, truth in zip(grads(torch.compile(loss, backend="fuse")), grads(loss), exact):
        scale = truth.abs().max()
        assert (actual - truth).abs().max() <= 2 * (wanted - truth).abs().max() + 1e-2 * scale
    backward = [a for a in fusebackend.history() if a.name.startswith("backward")][-1]
    stored = [line for line in backward.fused_ir.splitlines() if "[stored]" in line]
    assert any("bf16[4, 16, 32, 32]" in line for line in stored)  # s's gradient
    assert not any("f32[4, 16, 32, 32]" in line for line in stored)
    assert "aten._to_copy" in backward.schedule.split("recomputed in each reader", 1)[1]


def test_no_recompute_across_a_mutation() -> None:
    # up = x.float() feeds two readers; an in-place op on x between them means the second reader
    # must see the value from before it, so up stays a node of its own
    from fusebackend import indexing, ir
    from fusebackend.scheduler.recompute import inline_cheap

    x = ir.Buffer("arg0", bf16, (8, 8), (8, 1))
    i = tuple(indexing.loop_vars("i", 2))

    def pointwise(name: str, body: ir.Expr) -> ir.Pointwise:
        return ir.Pointwise(ir.Buffer(name, torch.float32, (8, 8), (8, 1)), body, name)

    up = pointwise("buf0", ir.cast(ir.Load(x.whole(), i), torch.float32))
    twice = pointwise("buf1", ir.op("mul", ir.Load(up.buffer.whole(), i), ir.Constant(2.0, torch.float32)))
    bump = ir.Extern("buf2", torch.ops.aten.add_.Scalar, (x.whole(), 1), (), (), True, "x.add_(1)")
    plus = pointwise("buf3", ir.op("add", ir.Load(up.buffer.whole(), i), ir.Constant(1.0, torch.float32)))
    outputs = [twice.buffer.whole(), plus.buffer.whole()]
    graph = ir.IRGraph("g", torch.device("cpu"), [x], [up, twice, bump, plus], outputs)
    _, recomputed, _, _ = inline_cheap(graph)
    assert recomputed == ()
    calm = ir.IRGraph("g", torch.device("cpu"), [x], [up, twice, plus], outputs)
    rewritten, recomputed, _, _ = inline_cheap(calm)
    assert recomputed == (up,) and [n.name for n in rewritten.nodes] == ["buf1", "buf3"]


def test_node_reading_more_than_it_writes_is_stored() -> None:
    # a + b reads 8 bytes per 4-byte element: recomputing it in both readers would cost more
    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = a + b
        return s.sum(0), s.sum(1)

    check(fn, torch.randn(24, 40), torch.randn(24, 40))
    report = fusebackend.last_compiled().schedule
    assert "recomputed" not in report
    assert sum(source.count("tl.store(") for source in kernels().values()) == 3  # s and both sums


def test_returned_node_is_not_recomputed() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xf = x.float()
        return xf, xf.sum(0), xf.sum(1)

    check(fn, torch.randn(24, 40, dtype=bf16))
    assert "recomputed" not in fusebackend.last_compiled().schedule


def test_a_costly_value_read_by_two_kernels_is_stored_once() -> None:
    # An exact GELU (erf: 33 instructions an element) in bf16 read by a column sum and a row sum,
    # two kernels: recomputed, the second would add 39 instructions an element to save 2 bytes.
    # At 512 x 1024 that is past what a small kernel's worth of bytes buys, so the sum's kernel
    # stores it and erf is evaluated once; the report says why. An upcast read the same way
    # costs an instruction and is recomputed at the same size.
    def gelu_sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.nn.functional.gelu(x)
        return g.sum(0), g.sum(1)

    x = torch.randn(512, 1024, dtype=bf16)
    check(gelu_sums, x, atol=5e-2, rtol=2e-2)
    sources = kernels().values()
    assert kernel_count() == 2 and sum(src.count("tl.erf(") for src in sources) == 1
    assert sum(src.count("tl.store(") for src in sources) == 3  # the GELU and the two sums
    report = fusebackend.last_compiled().schedule
    assert "stored, not recomputed in each reader" in report and "in 1 more kernel(s) to save 2 B" in report, report
    assert "costly values kept stored: stored, the kernels move 3.00 MiB; recomputed, 2.00 MiB" in report, report
    assert "recomputed in each reader instead of stored" not in report

    def upcast_sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        return xf.sum(0), xf.sum(1)

    check(upcast_sums, x, atol=1e-3, rtol=1e-4)
    art = fusebackend.last_compiled()
    assert "recomputed in each reader instead of stored" in art.schedule and "stored, not recomputed" not in art.schedule
    stored = [line for line in art.fused_ir.splitlines() if "[stored]" in line]
    assert stored and all("[512, 1024]" not in line for line in stored)  # nothing full-size is stored


def test_the_instruction_table_names_ir_ops() -> None:
    # scheduler/instructions.py: every measured op is an IR op, and an unmeasured one counts one
    from fusebackend import ir
    from fusebackend.scheduler import instructions

    assert set(instructions.OP_INSTRUCTIONS) <= set(ir.OP_ARITY)
    assert instructions.op_instructions("erf") == 33 and instructions.op_instructions("add") == 1
    assert instructions.op_instructions("where") == 1


def _softmax_with_a_computed_bias(scores: torch.Tensor) -> torch.Tensor:
    # a bias made from positions alone (a mask or a position table: Swin's shifted-window mask
    # is nine slice assignments and a pairwise difference), broadcast over batch and heads
    n = scores.shape[-1]
    i = torch.arange(n, device=scores.device, dtype=torch.float32)
    bias = torch.cos(i[:, None] * i[None, :] * 0.01) * 0.5
    return torch.softmax(scores + bias, dim=-1)


def test_a_costly_value_read_broadcast_is_stored_not_evaluated_in_every_lane(monkeypatch) -> None:
    # fused into the softmax, the bias's cosine (126 instructions) would be evaluated at each of
    # the 4 x 2 batch-heads: 14 instructions per byte the kernel moves, past OPS_PER_BYTE_SAVED.
    # (Fewer extra instructions than LAUNCH_INSTRUCTIONS are not worth a launch: lowered here to
    # keep the interpreted case small; the next test has the limit as it is.)
    from fusebackend.scheduler import cost_model

    monkeypatch.setattr(cost_model, "LAUNCH_INSTRUCTIONS", 1024)
    scores = torch.randn(4, 2, 16, 16)
    check(_softmax_with_a_computed_bias, scores, atol=1e-5, rtol=1e-5)
    report = fusebackend.last_compiled().schedule
    assert "reads" in report and "broadcast, 8x over its 256 elements" in report
    assert kernel_count() == 2
    sources = list(kernels().values())
    assert sum("cos(" in s for s in sources) == 1
    assert not any("cos(" in s and "tl.reduce" in s for s in sources)  # the softmax only loads it


def test_a_costly_value_read_broadcast_by_a_small_kernel_stays_fused() -> None:
    # at two batch-heads the kernel is its launch's: one kernel
    check(_softmax_with_a_computed_bias, torch.randn(2, 1, 24, 24), atol=1e-5, rtol=1e-5)
    assert kernel_count() == 1
