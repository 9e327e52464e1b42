"""Graphs AOTAutograd cannot trace whole (``fusebackend/splitting.py``): the op whose output shape
follows its inputs' values runs alone as an ATen call, and the work before and after it is still
generated; shapes that change with the data recompile the part after it, and gradients flow
through all three parts."""

from __future__ import annotations

import warnings

import pytest
import torch

import fusebackend
import fusebackend.backend
import fusebackend.splitting
from helpers import assert_same, kernel_count, kernels


def _compile(fn):
    return torch.compile(fn, backend="fuse")


def _no_warnings(fn, *args):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = fn(*args)
    assert not [str(w.message) for w in record if "fusebackend" in str(w.message)]
    return out


def narrow_by_tensor(x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    return torch.narrow(x.exp() * 2, 0, start, 3).sigmoid() + 1


def test_narrow_by_a_tensor_runs_alone_and_the_rest_is_generated() -> None:
    x = torch.randn(7, 5)
    compiled = _compile(narrow_by_tensor)
    for start in (1, 4, 2):  # the same output shape, a new offset each call
        s = torch.tensor(start, device="cpu")
        assert_same(_no_warnings(compiled, x, s), narrow_by_tensor(x, s))
    assert fusebackend.metrics.eager_graphs == 0
    assert fusebackend.metrics.fallbacks["narrow"] == 1
    assert kernel_count() == 2  # exp*2 before, sigmoid+1 after
    before, after = kernels().values()
    assert "tl.exp(" in before and "tl.exp(" not in after, (before, after)


def split_in_sections(x: torch.Tensor, sections: torch.Tensor) -> list[torch.Tensor]:
    parts = torch.tensor_split(x * 3, sections, dim=1)
    return [p.tanh().sum(dim=1) for p in parts]


def test_tensor_split_in_sections_given_by_a_tensor() -> None:
    x = torch.randn(4, 41)  # parts of 10 to 21 columns, each summed by a reduction
    compiled = _compile(split_in_sections)
    for sections in (2, 4, 2):  # Dynamo guards on the count: a graph for 2 and one for 4
        n = torch.tensor(sections, device="cpu")  # eager wants the sections on the CPU
        assert_same(_no_warnings(compiled, x, n), split_in_sections(x, n))
    assert fusebackend.metrics.eager_graphs == 0
    assert fusebackend.metrics.fallbacks["tensor_split"] == 2
    # for each count, a part before (x * 3) and a part after (the tanh-sums) compiled once
    assert fusebackend.metrics.graphs_compiled == 4
    sources = list(kernels().values())
    assert any("* 3.0" in k and "tanh" not in k for k in sources)
    assert sum("tanh" in k and "reduce_sum" in k for k in sources) == 2  # one per part width


def test_gradients_flow_through_a_split_graph() -> None:
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def fn(x, w, start):
        y = torch.narrow((x * w).sin(), 0, start, 4)
        return (y.exp() * w).sum()

    compiled = _compile(fn)
    for start in (2, 0):
        s = torch.tensor(start, device="cpu")
        expected = torch.autograd.grad(fn(x, w, s), (x, w))
        actual = torch.autograd.grad(compiled(x, w, s), (x, w))
        assert_same(actual, expected)
    assert fusebackend.metrics.eager_graphs == 0
    assert fusebackend.metrics.kernels_generated >= 4  # forward and backward on both sides


def test_a_part_that_meets_too_many_signatures_runs_eagerly_after_a_warning(monkeypatch) -> None:
    # the narrowed view starts at offset 0 or not: two signatures of the part after it
    monkeypatch.setattr(fusebackend.splitting, "MAX_SIGNATURES", 1)
    x = torch.randn(7, 5)
    compiled = _compile(narrow_by_tensor)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for start in (1, 0, 2, 0):
            s = torch.tensor(start, device="cpu")
            assert_same(compiled(x, s), narrow_by_tensor(x, s))
    messages = [str(w.message) for w in record if "fusebackend" in str(w.message)]
    assert len(messages) == 1 and "input signatures" in messages[0], messages
    assert fusebackend.metrics.eager_graphs == 1


def test_a_graph_that_names_no_failing_node_runs_eagerly(monkeypatch) -> None:
    # the trace fails without naming a node: nothing to cut around, and (here) no failure that
    # Dynamo breaks its graph at, so Dynamo's graph runs
    monkeypatch.setattr(fusebackend.splitting, "failing_node", lambda gm, exc: None)
    monkeypatch.setattr(fusebackend.backend, "_dynamo_breaks_at", lambda exc: False)
    x = torch.randn(6, 5)
    with pytest.warns(UserWarning, match="tracing the graph with AOTAutograd failed"):
        out = _compile(narrow_by_tensor)(x, torch.tensor(2, device="cpu"))
    assert_same(out, narrow_by_tensor(x, torch.tensor(2, device="cpu")))
    assert fusebackend.metrics.eager_graphs == 1


class _Layer(torch.nn.Module):
    # a model's own layer (not one of torch.nn's, whose frames Dynamo does not start at)
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(h @ self.weight + 1)


class _MaskedFill(torch.nn.Module):
    """SpecAugment-style masking between two layers: ``h[mask] = v``, whose backward needs the
    mask's ``nonzero`` (a shape the data decides)."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = _Layer()
        self.fill = torch.nn.Parameter(torch.randn(8))
        self.post = _Layer()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.pre(x).clone()
        h[mask] = self.fill
        return self.post(h).sum()


def test_a_shape_the_data_decides_in_a_backward_breaks_dynamos_graph() -> None:
    # AOTAutograd cannot trace the backward of h[mask] = v ahead of the mask's values, and no node
    # of Dynamo's graph names the failure. fuse hands the exception back to Dynamo, which breaks
    # its graph there (as for Inductor): the layers around it are compiled, nothing runs eagerly
    # after a warning of fuse's, and the gradients are eager's.
    torch.manual_seed(0)
    model = _MaskedFill()
    x = torch.randn(2, 5, 8, requires_grad=True)
    mask = torch.rand(2, 5) > 0.5
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loss = torch.compile(model, backend="fuse")(x, mask)
        grads = torch.autograd.grad(loss, [x, *model.parameters()])
    assert not [w for w in record if str(w.message).startswith("fusebackend")], [str(w.message) for w in record]
    want = torch.autograd.grad(model(x, mask), [x, *model.parameters()])
    for got, expected in zip(grads, want):
        assert_same(got, expected)
    assert fusebackend.metrics.eager_graphs == 0
    assert fusebackend.metrics.graphs_compiled == 2  # the layers' forward and backward (one frame serves both)
    assert any("Backend compiler exception" in k for k in torch._dynamo.utils.counters["unimplemented"])
