"""Traced sizes as fuse's sympy expressions, their values at a call's sizes, and proofs that hold
for every size without a guard (``fusebackend/sizevars.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import sympy

import torch
from torch.utils._sympy import functions as torch_functions

from fusebackend import indexing, sizevars


def _traced(fn: Any, *args: torch.Tensor, **compile_options: Any) -> dict[str, Any]:
    """The traced value of each node of Dynamo's graph of ``fn``, by name."""
    seen: dict[str, Any] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        for node in gm.graph.nodes:
            if node.meta.get("example_value") is not None:
                seen[node.name] = node.meta["example_value"]
        return gm

    torch.compile(fn, backend=backend, **compile_options)(*args)
    return seen


def test_a_view_of_symbolic_sizes_reads_as_a_floor_division_and_the_size_dynamo_proved() -> None:
    traced = _traced(lambda x: x.view(-1, 4).sum(1), torch.randn(6, 8), dynamic=True)
    s77, s27 = (sizevars.to_sympy(n) for n in traced["l_x_"].shape)
    assert s77.is_Symbol and s27.is_Symbol and s77 != s27
    # traced as (s27*s77)//((s27*s77)//4): 4, by the divisibility Dynamo guarded
    rows, cols = (sizevars.to_sympy(n) for n in traced["view"].shape)
    assert cols == 4 and rows == indexing.FloorDiv(s77 * s27, 4) and isinstance(rows, indexing.FloorDiv)
    assert sizevars.hint(rows, {s77: 6, s27: 8}) == 12
    assert sizevars.hint(s77, {s77: 6}) == 6 and type(sizevars.hint(s77, {s77: 6})) is int  # a lone symbol
    assert sizevars.to_sympy(7) == 7


def test_what_is_not_a_size_fuse_handles_raises_not_symbolic() -> None:
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    with pytest.raises(sizevars.NotSymbolic, match="Max"):
        sizevars._convert(torch_functions.Max(s0, 5))
    with pytest.raises(sizevars.NotSymbolic, match="divides by"):
        sizevars._convert(torch_functions.FloorDiv(s0 * 8, s0 - 1))
    with pytest.raises(sizevars.NotSymbolic, match="not a size"):
        sizevars.to_sympy(True)
    with pytest.raises(sizevars.NotSymbolic, match="not bound"):
        sizevars.hint(s0 * 4, {})
    mod = torch_functions.ModularIndexing(s0 * 12, 3, 4)  # (12*s0 // 3) % 4
    assert sizevars._convert(mod) == indexing.ModIdx(4 * s0, 4) == 0


def test_proofs_use_the_ranges_dynamo_learned_and_add_no_guard() -> None:
    x = torch.randn(6, 8)
    torch._dynamo.mark_dynamic(x, 0, min=4, max=4096)
    traced = _traced(lambda t: t * 2, x)
    size = traced["l_t_"].shape[0]
    env = size.node.shape_env
    s = sizevars.to_sympy(size)
    guards = len(env.guards)
    assert sizevars.ranges(env)[s] == (4, 4096)
    assert sizevars.known_le(128, 64 * s)  # every size is at least 2
    assert not sizevars.known_le(256, 64 * s)  # ... but not at least 4, without the environment
    assert sizevars.known_le(256, 64 * s, env) and not sizevars.known_le(300, 64 * s, env)
    assert sizevars.known_true(s >= 4, env) is True
    assert sizevars.known_true(s > 100, env) is None
    assert len(env.guards) == guards
