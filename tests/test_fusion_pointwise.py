"""Fusion tests for pointwise work: how many kernels a program becomes and what their source stores.

Every test also compares with eager (``check``), so a fusion that changes a value fails here too.
The schedule report (``fusebackend.last_compiled().schedule``) and the wrapper source are the
inspection API these tests read; kernel sources come from ``helpers.kernels()``.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import check, kernel_count, kernels


def stores(source: str) -> int:
    return source.count("tl.store(")


def only_kernel() -> str:
    ks = kernels()
    assert len(ks) == 1, f"expected one kernel, got {list(ks)}"
    return next(iter(ks.values()))


def wrapper_steps(wrapper: str) -> list[str]:
    """The wrapper's launches and extern calls in order: kernel names and ``extern:<op>``."""
    aliases = dict(re.findall(r"^(aten_\w+) = aten_call\(torch\.ops\.(aten\.\w+\.\w+)\)", wrapper, re.M))
    steps = []
    for line in wrapper.split("\ndef call(", 1)[1].splitlines():
        launch = re.search(r"^\s*(fused_\w+)\(", line)
        extern = re.search(r"\b(aten_\w+)\(", line)
        if launch:
            steps.append(launch.group(1))
        elif extern:
            steps.append("extern:" + aliases[extern.group(1)])
    return steps


def pointwise_nodes(ir_text: str) -> int:
    return ir_text.count("= pointwise")


# ----------------------------------------------------------------------------- vertical chains


def chain10(x: torch.Tensor) -> torch.Tensor:
    x = x * 1.5
    x = x + 0.25
    x = torch.sin(x)
    x = x.exp()
    x = x - 1.0
    x = torch.tanh(x)
    x = x.abs()
    x = torch.sqrt(x + 1e-3)
    x = torch.sigmoid(x)
    return x / 3.0


@pytest.mark.parametrize("shape", [(1000,), (33, 65), (2, 3, 4, 5)], ids=str)
def test_chain_of_ten_ops_is_one_kernel(shape: tuple[int, ...]) -> None:
    check(chain10, torch.randn(shape))
    assert kernel_count() == 1
    assert stores(only_kernel()) == 1
    assert pointwise_nodes(fusebackend.last_compiled().ir) >= 10


def test_chain_on_100k_elements() -> None:
    check(chain10, torch.randn(100_003))
    assert kernel_count() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gelu_affine_is_one_kernel_with_one_store(dtype: torch.dtype) -> None:
    x, w, b = (torch.randn(s, dtype=dtype) for s in ((33, 65), (65,), (65,)))
    check(lambda x, w, b: F.gelu(x * w + b), x, w, b)
    assert kernel_count() == 1
    assert stores(only_kernel()) == 1
    # The wrapper allocates the output and nothing else.
    assert fusebackend.last_compiled().wrapper.count(" = empty(") == 1


def test_half_chain_rounds_once() -> None:
    # Fused half-precision chains compute in fp32 and round on store: the result is at least as
    # close to an fp32 reference as eager's op-by-op rounding, and within the usual tolerance.
    x = torch.randn(4096, dtype=torch.float16)
    fn = lambda x: torch.sigmoid(x * 1.3 + 0.2) * x - 0.5  # noqa: E731
    out = check(fn, x)
    ref = fn(x.float())
    assert (out.float() - ref).abs().max() <= (fn(x).float() - ref).abs().max() + 1e-3
    assert kernel_count() == 1


# --------------------------------------------------------------------- what is and isn't stored


def test_intermediate_used_inside_kernel_is_not_stored() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.exp()  # used twice, only inside the kernel
        return y * 2 + y.sin()

    check(fn, torch.randn(300))
    src = only_kernel()
    assert stores(src) == 1
    assert "[in registers]" in fusebackend.last_compiled().fused_ir
    assert fusebackend.last_compiled().wrapper.count(" = empty(") == 1


def test_returned_intermediate_is_stored() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.exp()
        return y, y * 2 + 1

    check(fn, torch.randn(300))
    assert stores(only_kernel()) == 2
    assert fusebackend.last_compiled().wrapper.count(" = empty(") == 2


def test_diamond_is_one_kernel() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        a = x.sigmoid()
        b = a * 2
        c = a + x
        return b * c

    check(fn, torch.randn(17, 31))
    assert kernel_count() == 1
    assert stores(only_kernel()) == 1


def test_horizontal_fusion_of_siblings() -> None:
    # Two outputs computed from the same input: one kernel reads x once and stores both.
    x = torch.randn(40, 50)
    check(lambda x: (x.sin(), x.cos() * 2), x)
    assert kernel_count() == 1
    src = only_kernel()
    assert stores(src) == 2
    assert src.count("tl.load(") == 1


def test_fusion_through_views() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = x.exp()
        return a.t() * y + a.t().reshape(y.shape) * 0.5  # transposed reads of a fused producer

    x, y = torch.randn(12, 20), torch.randn(20, 12)
    out = check(fn, x, y)
    assert kernel_count() == 1
    assert out.stride() == fn(x, y).stride()


def test_fusion_through_reshape_and_slice() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        a = (x * 2).reshape(6, 10)
        return a[:, 1:] + 1, a[::2].sigmoid()

    check(fn, torch.randn(60))
    assert kernel_count() >= 1


# -------------------------------------------------------------------------- extern boundaries


def relu_mm_sigmoid(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.relu(x * 2) @ w).sigmoid()


def test_matmul_splits_kernel_extern_kernel() -> None:
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    check(relu_mm_sigmoid, x, w)
    art = fusebackend.last_compiled()
    steps = wrapper_steps(art.wrapper)
    assert len(steps) == 3, steps
    assert steps[0].startswith("fused_") and steps[2].startswith("fused_")
    assert steps[1] == "extern:aten.mm.default"
    # The schedule report lists the same order.
    kinds = [line.split()[0] for line in art.schedule.splitlines()[1:] if line.startswith("  kernel")
             or line.startswith("  extern")]
    assert kinds == ["kernel", "extern", "kernel"]
    assert "extern call" in art.schedule  # the refused fusions name their reason
    assert fusebackend.metrics.fallbacks["mm"] == 1
    assert sum(fusebackend.metrics.fallbacks.values()) == 1
    assert kernel_count() == 2
    # relu(x * 2) is one kernel that stores only its result, the mm's input.
    first = kernels()[steps[0]]
    assert stores(first) == 1


def test_no_fusion_through_an_extern_cycle() -> None:
    # a feeds the mm and the final add: fusing a with the add would need the mm inside the kernel.
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = x * 2
        return (a @ w).sigmoid() + a

    check(fn, torch.randn(8, 8), torch.randn(8, 8))
    art = fusebackend.last_compiled()
    assert kernel_count() == 2
    assert "cycle" in art.schedule
    assert [s.split(":")[0] for s in wrapper_steps(art.wrapper)][1] == "extern"


def test_no_cycle_through_a_group_entered_late_and_left_early() -> None:
    # LR-ASPP's head (torchvision), trained: relu(conv(high)) scaled by a pooled sigmoid gate and
    # upsampled. In its backward a merged group was entered through a late member and fed the
    # target through an early one; the search for a path stopped at groups whose first member
    # came after the target, missed it, and fusion made a cycle (the graph ran eagerly).
    conv, gate, head = torch.nn.Conv2d(8, 16, 1), torch.nn.Conv2d(8, 16, 1), torch.nn.Conv2d(16, 3, 1)

    def fn(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        x = F.relu(conv(high)) * torch.sigmoid(gate(F.adaptive_avg_pool2d(high, 1)))
        x = F.interpolate(x, size=low.shape[-2:], mode="bilinear", align_corners=False)
        return (low.mean(1, keepdim=True) + head(x)).sum()

    low, high = torch.randn(2, 4, 16, 16), torch.randn(2, 8, 4, 4, requires_grad=True)
    want = torch.autograd.grad(fn(low, high), [high, conv.weight, gate.weight])
    got = torch.autograd.grad(torch.compile(fn, backend="fuse")(low, high), [high, conv.weight, gate.weight])
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert fusebackend.metrics.eager_graphs == 0


# ------------------------------------------------------------ different numbers of elements


@pytest.mark.parametrize("n,m", [(7, 300), (64, 1000), (100, 1000)], ids=str)
def test_outer_product_of_small_and_big(n: int, m: int) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a.exp()[:, None] * b.sin()[None, :]) + a[:, None]

    a, b = torch.randn(n), torch.randn(m)
    out = check(fn, a, b)
    assert out.shape == (n, m)
    # At most one kernel per iteration space (n, m and n*m elements).
    assert 1 <= kernel_count() <= 3
    assert not fusebackend.metrics.fallbacks


def test_small_and_big_outputs_together() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sa = a * 3
        return sa, sa[:, None] - b[None, :], b.exp()

    out = check(fn, torch.randn(5), torch.randn(9))
    assert [tuple(o.shape) for o in out] == [(5,), (5, 9), (9,)]


# -------------------------------------------------------------------------------- config


def test_fusion_off_gives_one_kernel_per_op() -> None:
    x = torch.randn(500)
    with fusebackend.config.patch(fusion=False):
        check(chain10, x)
    art = fusebackend.last_compiled()
    nodes = pointwise_nodes(art.ir)
    assert nodes >= 10
    assert kernel_count() == nodes
    assert all(stores(src) == 1 for src in kernels().values())
    assert "fusions taken" not in art.schedule


def test_fusion_off_then_on() -> None:
    x = torch.randn(33, 65)
    w, b = torch.randn(65), torch.randn(65)
    fn = lambda x, w, b: F.gelu(x * w + b)  # noqa: E731
    with fusebackend.config.patch(fusion=False):
        check(fn, x, w, b)
    unfused = kernel_count()
    assert unfused == pointwise_nodes(fusebackend.last_compiled().ir) > 1
    torch._dynamo.reset()
    fusebackend.dump.clear()
    check(fn, x, w, b)
    assert kernel_count() == 1


def test_max_fusion_size_bounds_groups() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        for _ in range(10):
            x = x * 1.1 + 0.1
        return x

    with fusebackend.config.patch(max_fusion_size=4):
        check(fn, torch.randn(100))
    art = fusebackend.last_compiled()
    nodes = pointwise_nodes(art.ir)
    assert kernel_count() == -(-nodes // 4)  # a chain splits into groups of exactly 4
    assert "exceed 4 nodes" in art.schedule
