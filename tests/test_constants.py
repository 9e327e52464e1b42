"""Constants of a graph folded at compile time (``fusebackend/constants.py``): tensors a CUDA
graph makes on the CPU from no input (BEiT's relative position index, built with ``torch.arange``
and no device in every forward) become constants of the graph, made once. The pass takes the
graph's device as an argument, so it runs here on CPU tensors for a graph said to be on CUDA, its readers taken to be on the graph's device (in a CUDA graph they are
the copy to the GPU, or the GPU ops after it)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fusebackend import constants
from fusebackend.constants import constant_ancestry, fold_foreign

aten = torch.ops.aten


def _relative_index(x: torch.Tensor) -> torch.Tensor:
    # a window's relative position index, made on the CPU as transformers' BEiT makes it, then read
    # with a value of the graph
    coords = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")).flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)
    index = relative[..., 0] * 7 + relative[..., 1] + torch.tensor([9])
    return x[index.flatten()].view(12, 12, -1) * 2


def _targets(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


@pytest.fixture
def readers_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "_on", lambda node, device: True)


def test_a_cpu_constant_in_a_cuda_graph_is_folded_into_one_attribute(readers_on_the_gpu: None) -> None:
    x = torch.randn(40, 5)
    gm = make_fx(_relative_index)(x)
    assert any("arange" in t for t in _targets(gm))
    expected = gm(x)
    assert fold_foreign(gm, torch.device("cuda")) == 1
    assert not any("arange" in t or "lift_fresh" in t for t in _targets(gm)), _targets(gm)
    (attr,) = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target.startswith("_folded")]
    assert getattr(gm, attr.target).shape == (144,) and getattr(gm, attr.target).dtype == torch.int64
    torch.testing.assert_close(gm(x), expected)
    torch.testing.assert_close(gm(x), _relative_index(x))


def test_a_constant_read_by_an_op_on_its_own_device_stays() -> None:
    # a CPU op of the CUDA graph reads it: moved to the GPU it could not
    gm = make_fx(_relative_index)(torch.randn(40, 5))
    assert fold_foreign(gm, torch.device("cuda")) == 0


def test_nothing_is_folded_on_the_graphs_own_device_or_from_inputs_or_random(readers_on_the_gpu: None) -> None:
    x = torch.randn(40, 5)
    gm = make_fx(_relative_index)(x)
    assert fold_foreign(gm, torch.device("cpu")) == 0  # computed in the graph's kernels instead

    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(5) + torch.arange(5.0) * x.sum()

    gm = make_fx(noisy)(x)
    before = _targets(gm)
    assert fold_foreign(gm, torch.device("cuda")) == 1  # the arange alone: rand draws anew each call
    assert any("rand" in t for t in _targets(gm)) and any("arange" in t for t in before)
    assert not any("arange" in t for t in _targets(gm))


def test_constant_ancestry_stops_at_inputs_and_attributes() -> None:
    gm = make_fx(lambda x: x * torch.arange(5.0).exp())(torch.randn(5))
    nodes = {str(n.target): n for n in gm.graph.nodes}
    exp = nodes[str(aten.exp.default)]
    assert [str(n.target) for n in constant_ancestry(exp, attributes=True)] == [
        str(aten.arange.default), str(aten.exp.default)]
    assert constant_ancestry(nodes[str(aten.mul.Tensor)], attributes=True) is None
