"""Channels-last around 2-d convolutions (``lowering/layouts.py``).

On a GPU (``FUSE_CONV_LAYOUT=auto``) every 2-d convolution reads a channels-last input; here, on
the CPU, ``conv_layout="channels_last"`` turns the same rule on (oneDNN's convolutions, like
cuDNN's, return channels-last results for channels-last inputs). Each test compares with eager
and asserts what the wrapper passes to the convolutions, how many kernels the graph becomes,
that every extern result came back in the layout the graph declared for it (no copy at run
time), and that what the user sees keeps eager's layout.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusebackend
from fusebackend.kernels import wrapper_calls
from helpers import assert_same, compile_fn, kernel_count, kernels


@pytest.fixture
def layout_copies(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Extern results that came back in another layout than declared (and were copied)."""
    copies: list[str] = []
    original = wrapper_calls.expect_layout

    def counting(t: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
        out = original(t, size, stride)
        if out is not t:
            copies.append(f"{tuple(t.stride())} -> {tuple(stride)}")
        return out

    monkeypatch.setattr(wrapper_calls, "expect_layout", counting)
    yield copies


def wrapper_source() -> str:
    return "\n".join(a.wrapper for a in fusebackend.history())


class Block(nn.Module):
    """conv -> batch norm -> relu -> 1x1 conv -> batch norm + residual -> relu -> pool."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 1)  # a depthwise one would be a kernel of ours (convolutions.py)
        self.bn2 = nn.BatchNorm2d(c)
        self.head = nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)) + y)
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


def run_block(mode: str, channels_last_model: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Block's inference compiled under ``conv_layout=mode`` on a fresh NCHW (or channels-last)
    model and input: (compiled output, eager output), compared."""
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 3, 9, 7)
    if channels_last_model:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    torch._dynamo.reset()
    fusebackend.dump.clear()
    with fusebackend.config.patch(conv_layout=mode), torch.no_grad():
        expected = model(x)
        actual = compile_fn(model)(x)
    assert_same(actual, expected)
    return actual, expected


def test_convolutions_read_channels_last_inputs(layout_copies: list[str]) -> None:
    actual, expected = run_block("channels_last")
    assert actual.stride() == expected.stride()
    assert fusebackend.metrics.eager_graphs == 0
    source = wrapper_source()
    # the image is made channels-last by a kernel of its own; the second convolution's input is
    # written channels-last by the kernel that computes it (batch norm and relu), no copy
    assert source.count("aten_convolution(") == 2
    assert not layout_copies, layout_copies
    ir_text = "\n".join(a.ir for a in fusebackend.history())
    assert ir_text.count("channels-last input of a convolution") == 1
    # the first convolution's 3x3 weight is copied channels-last (cuDNN would copy it on every
    # call); the 1x1 one's (8, 8, 1, 1) already is: a window of one position has no order
    assert ir_text.count("channels-last weight of a convolution") == 1
    relaid = kernel_count()
    run_block("keep")
    assert relaid == kernel_count() + 2  # the image's and the weight's copies; the layer's kernels write channels-last


def test_keep_leaves_layouts_as_eager_gives_them(layout_copies: list[str]) -> None:
    run_block("keep")
    assert "channels-last" not in "\n".join(a.ir for a in fusebackend.history())
    assert not layout_copies, layout_copies


def test_outputs_keep_eagers_layout() -> None:
    """A convolution's channels-last result that the graph returns is copied back to NCHW."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3)
    x = torch.randn(2, 4, 8, 8)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = conv(x)
        return y, torch.sigmoid(y)

    with fusebackend.config.patch(conv_layout="channels_last"), torch.no_grad():
        expected = fn(x)
        actual = compile_fn(fn)(x)
    assert_same(actual, expected)
    assert [a.stride() for a in actual] == [e.stride() for e in expected]
    assert all(a.is_contiguous() for a in actual)


def test_channels_last_inputs_need_no_copy(layout_copies: list[str]) -> None:
    run_block("channels_last", channels_last_model=True)
    ir_text = "\n".join(a.ir for a in fusebackend.history())
    assert "channels-last input of a convolution" not in ir_text
    assert "channels-last weight of a convolution" not in ir_text
    assert not layout_copies, layout_copies


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_training_step_gradients_and_their_layouts(dtype: torch.dtype, layout_copies: list[str]) -> None:
    torch.manual_seed(0)
    model = Block().train().to(dtype)
    x = torch.randn(2, 3, 9, 7, dtype=dtype)

    def step(call: Any) -> list[torch.Tensor]:
        for p in model.parameters():
            p.grad = None
        call(x).float().pow(2).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    state = {k: v.clone() for k, v in model.state_dict().items()}
    expected = step(model)
    expected_buffers = [b.clone() for b in model.buffers()]
    model.load_state_dict(state)
    with fusebackend.config.patch(conv_layout="channels_last"):
        actual = step(compile_fn(model))
    assert fusebackend.metrics.eager_graphs == 0
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, **tol)
        # the same layout: strides agree wherever a dim has more than one element
        assert all(x == y for n, x, y in zip(a.shape, a.stride(), e.stride()) if n != 1), (a.stride(), e.stride())
    for a, e in zip(model.buffers(), expected_buffers):
        torch.testing.assert_close(a, e, **tol)
    assert not layout_copies, layout_copies


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_a_view_of_a_channels_last_result_copies_to_the_traced_layout(train: bool) -> None:
    """flatten after a convolution was traced as a view of a contiguous tensor; the result is
    channels-last here, so the lowering copies it back (fused into the relu) and views that."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 6, 3))
    x = torch.randn(2, 3, 5, 6)
    model.train(train)
    with fusebackend.config.patch(conv_layout="channels_last"), torch.set_grad_enabled(train):
        expected = model(x)
        actual = compile_fn(model)(x)
        assert_same(actual, expected)
        if train:
            grads = torch.autograd.grad(actual.pow(2).sum(), list(model.parameters()))
            expected_grads = torch.autograd.grad(expected.pow(2).sum(), list(model.parameters()))
            for a, e in zip(grads, expected_grads):
                torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)
    assert fusebackend.metrics.eager_graphs == 0
    ir_text = "\n".join(a.ir for a in fusebackend.history())
    assert "the layout the graph was traced with" in ir_text
    assert "extern aten.view" not in ir_text


def test_a_tensor_read_by_two_convolutions_is_copied_once() -> None:
    torch.manual_seed(0)
    a, b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 5, 3, padding=1)
    x = torch.randn(2, 3, 6, 5)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a(x), b(x)

    # no TF32 on a GPU: cuDNN's channels-last and NCHW kernels round differently with it
    with fusebackend.config.patch(conv_layout="channels_last"), torch.no_grad(), \
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert_same(compile_fn(fn)(x), fn(x))
    ir_text = "\n".join(art.ir for art in fusebackend.history())
    assert ir_text.count("channels-last input of a convolution") == 1


def test_unknown_mode_is_an_error() -> None:
    conv = nn.Conv2d(2, 2, 1)
    with fusebackend.config.patch(conv_layout="nhwc"), pytest.warns(UserWarning, match="FUSE_CONV_LAYOUT"):
        compile_fn(conv)(torch.randn(1, 2, 3, 3))
    assert fusebackend.metrics.eager_graphs == 1


def test_auto_converts_only_where_convolutions_are_a_real_part_of_the_graph() -> None:
    """``auto`` on a GPU: a chain of convolutions is channels-last; a patch embedding before a
    long stack of other ops (a vision transformer) keeps eager's layouts, as does any graph on a
    CPU. Decided from the traced graph alone, so this runs without a GPU."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusebackend.lowering import layouts

    convnet = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU())
    patches = nn.Conv2d(3, 16, 4, stride=4)
    norm = nn.LayerNorm(16)

    def transformer(x: torch.Tensor) -> torch.Tensor:
        h = patches(x).flatten(2).transpose(1, 2)
        for _ in range(40):
            h = h + F.gelu(norm(h)) * 0.5
        return h

    image = torch.randn(2, 3, 16, 16)
    chain = make_fx(convnet)(image)
    long = make_fx(transformer)(image)
    assert len([n for n in long.graph.nodes if n.op == "call_function"]) > layouts.OPS_PER_CONVOLUTION
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert layouts.wants_channels_last(cuda, chain) and not layouts.wants_channels_last(cuda, long)
    assert not layouts.wants_channels_last(cpu, chain)
    with fusebackend.config.patch(conv_layout="channels_last"):
        assert layouts.wants_channels_last(cpu, long)
    with fusebackend.config.patch(conv_layout="keep"):
        assert not layouts.wants_channels_last(cuda, chain)


def test_extern_results_differing_only_in_size_one_strides_are_not_copied() -> None:
    t = torch.randn(4, 6, 1, 1)  # contiguous: strides (6, 1, 1, 1)
    assert wrapper_calls.expect_layout(t, (4, 6, 1, 1), (6, 1, 6, 6)) is t  # channels-last strides
    moved = wrapper_calls.expect_layout(t.as_strided((4, 6), (1, 4)), (4, 6), (6, 1))
    assert moved.stride() == (6, 1)
    assert_same(moved, t.as_strided((4, 6), (1, 4)))


def test_cudnn_gradients_of_nchw_tensors_are_declared_contiguous() -> None:
    """The meta backward makes the weight gradient follow a channels-last output gradient; cuDNN
    makes it follow the input and weight (both NCHW here: the graph's image), so that is declared
    on a GPU, and the meta's layout elsewhere."""
    from fusebackend.lowering import layouts

    aten = torch.ops.aten
    x, w = torch.empty(2, 3, 9, 7, device="meta"), torch.empty(8, 3, 3, 3, device="meta")
    grad = torch.empty(2, 8, 9, 7, device="meta").to(memory_format=torch.channels_last)
    args = (grad, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    out = aten.convolution_backward.default(*args)
    gpu = layouts.result_layout(aten.convolution_backward.default, args, out, torch.device("cuda"))
    assert gpu[0].is_contiguous() and gpu[1].is_contiguous() and gpu[2] is None
    assert layouts.result_layout(aten.convolution_backward.default, args, out, torch.device("cpu")) is out
    cl = (grad, x.to(memory_format=torch.channels_last), *args[2:])
    relaid = layouts.result_layout(aten.convolution_backward.default, cl, out, torch.device("cuda"))
    assert all(layouts.is_channels_last(t) for t in relaid[:2])


@pytest.mark.parametrize("mode", ["keep", "channels_last"])
@pytest.mark.parametrize("kind", ["conv1d", "conv2d", "conv_transpose2d", "conv3d"])
def test_a_convolutions_bias_is_added_in_the_kernel_reading_its_result(mode: str, kind: str) -> None:
    # ATen adds a convolution's bias by a kernel of its own; the wrapper calls the convolution
    # without it and the bias joins the kernel that reads the result (here a GELU)
    torch.manual_seed(0)
    conv, shape = {
        "conv1d": (nn.Conv1d(4, 6, 3, padding=1), (2, 4, 11)),
        "conv2d": (nn.Conv2d(4, 6, 3, stride=2), (2, 4, 9, 7)),
        "conv_transpose2d": (nn.ConvTranspose2d(4, 6, 3, stride=2), (2, 4, 5, 3)),
        "conv3d": (nn.Conv3d(4, 6, 2), (2, 4, 3, 5, 4)),
    }[kind]
    x = torch.randn(shape)
    torch._dynamo.reset()
    fusebackend.dump.clear()
    with fusebackend.config.patch(conv_layout=mode), torch.no_grad():
        expected = F.gelu(conv(x))
        actual = compile_fn(lambda x: F.gelu(conv(x)))(x)
    assert_same(actual, expected)
    assert actual.stride() == expected.stride()
    source = wrapper_source()
    (call,) = [line for line in source.splitlines() if "aten_convolution(" in line]
    assert ", None, " in call, call  # no bias
    copies = 2 if mode == "channels_last" and kind.endswith("2d") else 0  # the image's and the weight's
    assert kernel_count() == 1 + copies
    assert "a convolution's bias" in "\n".join(a.ir for a in fusebackend.history())


@pytest.mark.parametrize("mode", ["keep", "channels_last"])
@pytest.mark.parametrize("kind", ["conv1d", "conv2d", "conv_transpose2d"])
def test_a_convolutions_bias_gradient_is_a_reduction_of_ours(mode: str, kind: str, layout_copies: list[str]) -> None:
    # the backward's ATen call computes the input's and the weight's gradients alone; the bias's
    # is a sum over the output's gradient that fuses into the kernel computing that gradient
    torch.manual_seed(0)
    conv, shape = {
        "conv1d": (nn.Conv1d(4, 6, 3, padding=1), (2, 4, 11)),
        "conv2d": (nn.Conv2d(4, 6, 3, stride=2), (2, 4, 9, 7)),
        "conv_transpose2d": (nn.ConvTranspose2d(4, 6, 3, stride=2), (2, 4, 5, 3)),
    }[kind]
    x = torch.randn(shape, requires_grad=True)

    def step(call: Any) -> list[torch.Tensor]:
        for t in (*conv.parameters(), x):
            t.grad = None
        call(x).pow(2).mean().backward()
        return [t.grad.clone() for t in (*conv.parameters(), x)]

    expected = step(lambda x: F.gelu(conv(x)))
    torch._dynamo.reset()
    fusebackend.dump.clear()
    fusebackend.metrics.reset()
    with fusebackend.config.patch(conv_layout=mode):
        actual = step(compile_fn(lambda x: F.gelu(conv(x))))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)
        assert all(p == q for n, p, q in zip(a.shape, a.stride(), e.stride()) if n != 1), (a.stride(), e.stride())
    backward = fusebackend.history()[-1]
    (call,) = [line for line in backward.wrapper.splitlines() if "aten_convolution_backward(" in line]
    assert "[True, True, False]" in call, call
    assert "sum" not in fusebackend.metrics.fallbacks
    # the output's gradient and its sum over every dim but the channels: one kernel
    (summed,) = [src for src in backward.kernels.values() if "aten.sum.dim_IntList" in src]
    assert "aten.gelu_backward" in summed or "aten.mul.Tensor" in summed
    if mode == "channels_last" and kind == "conv2d":
        assert "(channels-last output gradient of a convolution)" in summed
    assert not layout_copies, layout_copies


def test_inputs_that_disagree_on_the_order_give_a_row_major_result() -> None:
    # Whisper's encoder: positions [T, C] added to a convolution's [B, C, T] output permuted to
    # [B, T, C]. ATen lays the sum out like its first input ([B, C, T] in memory), and a layer
    # norm over C would read its rows strided; the sum is made row-major instead
    torch.manual_seed(0)
    x, pos, w = torch.randn(2, 8, 5), torch.randn(5, 8), torch.randn(8, 8)

    def fn(x: torch.Tensor, pos: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.permute(0, 2, 1) + pos
        return F.layer_norm(h, (8,)) @ w + h

    assert_same(compile_fn(fn)(x, pos, w), fn(x, pos, w))
    ir_text = fusebackend.last_compiled().ir
    assert "f32[2, 5, 8] strides [40, 8, 1] = pointwise  # aten.add.Tensor" in ir_text, ir_text

    # inputs that agree keep their order, as eager does; a returned result keeps eager's layout
    y = torch.randn(2, 8, 5)
    out = compile_fn(lambda x, y: x.permute(0, 2, 1) * y.permute(0, 2, 1) + 1)(x, y)
    assert "f32[2, 5, 8] strides [40, 1, 5] = pointwise" in fusebackend.last_compiled().ir
    assert out.stride() == (40, 1, 5)
    out = compile_fn(lambda x, pos: x.permute(0, 2, 1) + pos)(x, pos)
    assert out.stride() == (x.permute(0, 2, 1) + pos).stride() == (40, 1, 5)


def test_an_extern_takes_its_traced_layout_only_for_the_inputs_it_was_traced_with() -> None:
    """The traced value says how ATen lays out a result for the traced inputs' layouts. cuDNN's
    attention returns its output in the query's layout, so where the lowering wrote the query
    [B, H, S, D] (traced as a transpose of [B, S, H, D]), the meta function's layout holds, and
    declaring the traced one made the wrapper copy every layer's result (Qwen2, 24 a step)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusebackend import ir
    from fusebackend.lowering.trace import inputs_as_traced
    from fusebackend.lowering.values import TensorArg

    def fn(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.bmm(x.transpose(1, 2), k)

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(2, 5, 3), torch.randn(2, 5, 4))
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.bmm.default)
    traced = [n.meta["val"] for n in node.args]  # as GraphLowering.traced reads them

    def arg(sizes: tuple[int, ...], strides: tuple[int, ...]) -> TensorArg:
        buffer = ir.Buffer("b", torch.float32, sizes, strides)
        return TensorArg(ir.View(buffer, sizes, strides, 0), torch.empty_strided(sizes, strides, device="meta"))

    k = arg((2, 5, 4), (20, 4, 1))
    assert inputs_as_traced(traced, (arg((2, 3, 5), (15, 1, 3)), k), {})  # the transpose it was traced with
    assert not inputs_as_traced(traced, (arg((2, 3, 5), (15, 5, 1)), k), {})  # written contiguous instead
    assert not inputs_as_traced(traced, (arg((2, 3, 5), (15, 1, 3)),), {})  # an argument the trace lacks


class SplitSum(nn.Module):
    """ResNeSt's split attention in short: a convolution's channels in two radix halves, summed
    (``view(B, 2, C, H, W).sum(1)``), pooled to per-channel weights and summed again weighted."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2 * c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(2 * c)
        self.fc = nn.Conv2d(c, 2 * c, 1)
        self.out = nn.Conv2d(c, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn(self.conv(x)))
        b, rc, h, w = y.shape
        y = y.view(b, 2, rc // 2, h, w)
        gap = y.sum(1).mean((2, 3), keepdim=True)
        attn = self.fc(gap).view(b, 2, rc // 2, 1, 1).softmax(1)
        return self.out((y * attn).sum(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sum_over_a_channels_last_views_dim_keeps_the_channels_fastest(dtype: torch.dtype,
                                                                         layout_copies: list[str]) -> None:
    """ATen's sum returns a contiguous result; of a channels-last tensor's view it is laid out
    channels-last here (``layouts.reduction_layout``), so that the summing kernels read and
    write along the channels, and the next convolution reads it with no copy."""
    torch.manual_seed(0)
    model = SplitSum().eval().to(dtype)
    x = torch.randn(2, 3, 7, 9, dtype=dtype)
    # the radix sums as reductions (of 2 positions they are unrolled: test_unrolled_reductions.py)
    with fusebackend.config.patch(conv_layout="channels_last", unrolled_reduction=1), torch.no_grad():
        expected = model(x)
        out = torch.compile(model, backend="fuse")(x)
    assert_same(out, expected)
    assert out.is_contiguous()  # what the user sees keeps eager's layout
    assert layout_copies == []
    sums = {k: src for k, src in kernels().items() if k.endswith("_sum")}
    assert len(sums) == 2, sorted(kernels())
    for name, src in sums.items():
        load = next(line for line in src.splitlines() if "tl.load(in_ptr0" in line)
        # the convolution's output read along its channels: the lanes' offsets step by 1
        assert re.search(r"\d\*xindex", load) is None, (name, load)
    # the image is copied to channels-last for the first convolution; the weighted sum is not
    # for the last one
    copies = [k for k, src in kernels().items() if "(channels-last input of a convolution)" in src]
    assert len(copies) == 1, copies


def test_reduction_layout_follows_the_inputs_order_only_where_it_differs() -> None:
    from fusebackend.lowering import layouts

    class Arg:
        def __init__(self, meta: torch.Tensor) -> None:
            self.meta = meta

    last = torch.empty(2, 8, 5, 6, device="meta").to(memory_format=torch.channels_last)
    view = last.view(2, 2, 4, 5, 6)
    meta = torch.ops.aten.sum.dim_IntList(view, [1])
    assert meta.stride() == (120, 30, 6, 1)  # ATen's: contiguous
    got = layouts.reduction_layout(meta, (Arg(view), [1]), {})
    assert got.shape == meta.shape and got.stride() == (120, 1, 24, 4)
    kept = layouts.reduction_layout(torch.ops.aten.sum.dim_IntList(last, [1], True), (Arg(last), [1], True), {})
    assert kept.stride() == (30, 30, 6, 1)  # the channels summed: rows of pixels, contiguous as ATen gives
    plain = torch.empty(2, 8, 5, 6, device="meta")
    out = torch.ops.aten.sum.dim_IntList(plain, [1])
    assert layouts.reduction_layout(out, (Arg(plain), [1]), {}) is out
