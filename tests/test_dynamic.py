"""Graphs with symbolic sizes (``dynamic=True``, ``mark_dynamic``, automatic dynamic shapes),
compiled once per concrete shape (``config.symbolic`` "off", set for every test here; the
compile for every size, fuse's default, is tested in ``test_symbolic_compile.py``): each
specialization matches eager, and ``metrics.specialized`` says which graphs were compiled per
shape, how many times, and their symbols.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from fusebackend import backend, symbolic


@pytest.fixture(autouse=True)
def _per_shape() -> None:
    with fusebackend.config.patch(symbolic="off"):
        yield


def _norm_after_gelu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(F.gelu(x @ w), (w.shape[1],)).sum(-1)


def test_dynamic_true_compiles_each_shape_and_the_metrics_say_so() -> None:
    compiled = torch.compile(_norm_after_gelu, backend="fuse", dynamic=True)
    w = torch.randn(8, 16)
    for batch in (3, 5, 9, 17):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(compiled(x, w), _norm_after_gelu(x, w), rtol=1e-5, atol=1e-5)
    ((name, (count, symbols)),) = fusebackend.metrics.specialized.items()
    assert count == 4 and len(symbols) == 3  # batch, the inner size and the width: all symbolic
    assert f"compiled per shape: {name} x4 (sizes s" in fusebackend.metrics.summary()
    assert fusebackend.metrics.eager_graphs == 0


def test_mark_dynamic_names_one_symbol() -> None:
    compiled = torch.compile(_norm_after_gelu, backend="fuse")
    w = torch.randn(8, 16)
    for batch in (4, 6, 10):
        x = torch.randn(batch, 8)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x, w), _norm_after_gelu(x, w), rtol=1e-5, atol=1e-5)
    ((count, symbols),) = fusebackend.metrics.specialized.values()
    assert count == 3 and len(symbols) == 1


def test_automatic_dynamic_shapes_after_a_second_size() -> None:
    """Dynamo's second graph is symbolic (the first was compiled for the first size); fuse
    compiles it for the second and third sizes."""
    compiled = torch.compile(_norm_after_gelu, backend="fuse")
    w = torch.randn(8, 16)
    for batch in (4, 6, 10):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(compiled(x, w), _norm_after_gelu(x, w), rtol=1e-5, atol=1e-5)
    assert [count for count, symbols in fusebackend.metrics.specialized.values() if symbols] == [2]


def test_a_static_graph_is_not_reported() -> None:
    compiled = torch.compile(_norm_after_gelu, backend="fuse")
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, w), _norm_after_gelu(x, w), rtol=1e-5, atol=1e-5)
    assert not fusebackend.metrics.specialized
    assert "compiled per shape" not in fusebackend.metrics.summary()


def test_lowering_leaves_the_graphs_symbols_unguarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowering reads traced values at the sizes being compiled (``symbolic.concrete``): a
    comparison of a symbolic size with an int would guard on it and specialize Dynamo's shape
    environment, after which the graph's values read as the first sizes compiled."""
    graphs: list[backend.FusedGraph] = []
    init = backend.FusedGraph.__init__

    def keep(self: backend.FusedGraph, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        graphs.append(self)

    monkeypatch.setattr(backend.FusedGraph, "__init__", keep)
    compiled = torch.compile(_norm_after_gelu, backend="fuse", dynamic=True)
    w = torch.randn(8, 16)
    for batch in (3, 5):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(compiled(x, w), _norm_after_gelu(x, w), rtol=1e-5, atol=1e-5)
    (graph,) = graphs
    assert len(symbolic.symbols(graph.gm)) == 3
    sizes = [n.meta["val"].shape for n in graph.gm.graph.nodes if n.op == "placeholder"
             and isinstance(n.meta.get("val"), torch.Tensor)]
    assert sizes and all(not isinstance(s, int) for shape in sizes for s in shape)


def test_concrete_reads_a_traced_value_at_the_bound_sizes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    env = ShapeEnv()
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2)
    x = FakeTensorMode(shape_env=env).from_tensor(torch.randn(6, 4), symbolic_context=dynamic)
    batch, width = x.shape
    unbound = env.create_unbacked_symint()  # no input gives it (a size that depends on data)
    value = symbolic.concrete((x, batch * 2, unbound), {batch.node.expr: 10, width.node.expr: 7})
    assert tuple(value[0].shape) == (10, 7) and value[0].stride() == (7, 1) and value[0].device.type == "meta"
    assert value[1] == 20 and value[2] is None
    assert not env.guards  # read without a guard


def test_one_warning_when_a_graph_is_compiled_for_many_shapes() -> None:
    compiled = torch.compile(_norm_after_gelu, backend="fuse", dynamic=True)
    w = torch.randn(8, 16)
    with fusebackend.config.patch(specialization_warning=3), pytest.warns(UserWarning) as record:
        for batch in (3, 5, 9, 17, 33):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(x, w), _norm_after_gelu(x, w), rtol=1e-5, atol=1e-5)
    ours = [str(r.message) for r in record if "compiled for" in str(r.message)]
    assert len(ours) == 1 and "3 input shapes" in ours[0] and "symbolic" in ours[0]


def test_symbolic_input_layouts_must_give_the_calls_own() -> None:
    from fusebackend import sizevars
    from fusebackend.lowering.trace import input_layout

    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(4, 6))
    node = next(n for n in gm.graph.nodes if n.op == "placeholder")
    (s0, s1), _ = sizevars.layout(node.meta["val"])
    x = torch.randn(4, 6)
    assert input_layout(node, x, {s0: 4, s1: 6}) == ((s0, s1), (s1, 1))
    with pytest.raises(sizevars.NotSymbolic, match="traced as"):
        input_layout(node, x.t(), {s0: 6, s1: 4})  # the same sizes at another binding, transposed


class _ScaledByAttribute(torch.nn.Module):
    """GPT-2's GELU scale, ``sqrt(2 / pi)``, from a float attribute: with ``dynamic=True`` Dynamo
    does not specialize the float, and its division reaches the graph as ``aten.true_divide``."""

    def __init__(self) -> None:
        super().__init__()
        self.c = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * math.sqrt(self.c / math.pi) + 1


def test_arithmetic_on_an_unspecialized_float_is_one_kernel() -> None:
    module = _ScaledByAttribute()
    compiled = torch.compile(module, backend="fuse", dynamic=True)
    for shape in ((5, 7), (3, 2)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-6, atol=1e-6)
    for artifacts in fusebackend.history():  # (torch 2.11's Dynamo specializes the float instead)
        (name,) = artifacts.kernels
        assert ("true_divide" in name) == ("aten.true_divide" in artifacts.aten_graph), name
    assert not fusebackend.metrics.fallbacks, dict(fusebackend.metrics.fallbacks)
