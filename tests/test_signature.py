"""The fast signature check (``fusebackend/signature.py``): a call whose inputs match the last
signature runs without building its key; any difference in what the key holds takes the full key
and compiles anew where it must."""

from __future__ import annotations

import pytest
import torch

import fusebackend
from fusebackend.backend import FusedGraph
from fusebackend.signature import SignatureCheck, input_key
from helpers import assert_same


def make_graph() -> FusedGraph:
    def f(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor]:
        return (torch.ops.aten.add.Tensor(torch.ops.aten.mul.Tensor(x, n), y),)

    gm = torch.fx.symbolic_trace(f)
    return FusedGraph(gm, "sig")


def test_check_matches_only_the_same_signature() -> None:
    x, y = torch.randn(3, 4), torch.randn(4)
    check = SignatureCheck.make([x, y, 2])
    assert check is not None
    assert check.matches([torch.randn(3, 4), torch.randn(4), 2])
    different = {
        "size": [torch.randn(3, 5), y, 2],
        "strides": [torch.randn(4, 3).t(), y, 2],
        "dtype": [x.double(), y, 2],
        "requires_grad": [x.clone().requires_grad_(True), y, 2],
        "number": [x, y, 3],
        "number type": [x, y, 2.0],
        "count": [x, y],
        "a tensor for a number": [x, y, torch.tensor(2)],
    }
    for what, args in different.items():
        assert not check.matches(list(args)), what
        assert input_key(args) != input_key([x, y, 2]) or what == "requires_grad", what


def test_calls_take_the_fast_path_and_recompile_when_the_signature_changes() -> None:
    graph = make_graph()
    x, y = torch.randn(3, 4), torch.randn(4)
    (out,) = graph([x, y, 2])
    assert_same(out, x * 2 + y)
    assert graph.fast is not None and len(graph.cache) == 1
    compiled = fusebackend.metrics.graphs_compiled
    x2 = torch.randn(3, 4)
    (out,) = graph([x2, y, 2])
    assert_same(out, x2 * 2 + y)
    assert fusebackend.metrics.graphs_compiled == compiled and len(graph.cache) == 1
    # a transposed input, another number: new specializations, each right
    xt = torch.randn(4, 3).t()
    (out,) = graph([xt, y, 2])
    assert_same(out, xt * 2 + y)
    (out,) = graph([x, y, 5])
    assert_same(out, x * 5 + y)
    assert len(graph.cache) == 3
    # back to the first signature: its entry, found by the full key, then the fast path again
    (out,) = graph([x2, y, 2])
    assert_same(out, x2 * 2 + y)
    assert len(graph.cache) == 3
    assert graph.fast is not None and graph.fast[0].matches([x2, y, 2])


def test_an_input_at_another_storage_offset_is_read_from_its_own_start() -> None:
    graph = make_graph()
    base = torch.randn(5, 4)
    x, y = base[:3], torch.randn(4)
    graph([x, y, 2])
    shifted = base[2:]  # the same sizes and strides, 8 elements into the storage
    (out,) = graph([shifted, y, 2])
    assert_same(out, shifted * 2 + y)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_models_stay_right_over_changing_inputs(dynamic: bool) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    f = torch.compile(lambda x: torch.relu(lin(x)) * 2, backend="fuse", dynamic=dynamic)
    for shape in [(2, 8), (2, 8), (3, 8), (2, 8), (5, 8)]:
        x = torch.randn(shape)
        assert_same(f(x), torch.relu(lin(x)) * 2)


def test_without_tensorguards_every_call_takes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch._C._dynamo.guards, "TensorGuards")
    assert SignatureCheck.make([torch.randn(2), 3]) is None
    graph = make_graph()
    x, y = torch.randn(3, 4), torch.randn(4)
    for n in (2, 2, 3):
        (out,) = graph([x, y, n])
        assert_same(out, x * n + y)
    assert graph.fast is None and len(graph.cache) == 2


def test_alternating_signatures_make_each_check_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    original = SignatureCheck.make

    def counting(args: list) -> SignatureCheck | None:
        made.append(len(args))
        return original(args)

    monkeypatch.setattr(SignatureCheck, "make", staticmethod(counting))
    graph = make_graph()
    a, b, y = torch.randn(3, 4), torch.randn(5, 4), torch.randn(4)
    for x in (a, b, a, b, a, b):
        (out,) = graph([x, y, 2])
        assert_same(out, x * 2 + y)
    assert len(graph.cache) == 2 and len(made) == 2
