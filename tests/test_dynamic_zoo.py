"""The zoo's tiny language models with ``dynamic=True`` over three sequence lengths (CPU).

Dynamo's graphs are symbolic. By default fuse compiles them once per length (README, "Dynamic
shapes"); with ``config.symbolic``, once for every length. Each length must match eager, no
graph may run eagerly, and ``metrics.specialized`` names the graphs compiled per shape: the
symbolic graph by default, none with ``config.symbolic``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the zoo needs transformers: pip install -e '.[zoo]'")

import fusebackend  # noqa: E402
from benchmarks.zoo.compare import output_error  # noqa: E402
from benchmarks.zoo.registry import ZOO  # noqa: E402
from benchmarks.zoo.spec import narrow  # noqa: E402

LENGTHS = (16, 11, 7)


@pytest.mark.parametrize("symbolic", [False, True], ids=["per-shape", "symbolic"])
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_a_language_model_over_three_lengths(name: str, symbolic: bool) -> None:
    built = ZOO[name].build("tiny")
    model = built.model.eval()
    compiled = torch.compile(model, backend="fuse", dynamic=True)
    with fusebackend.config.patch(symbolic=symbolic):
        for seq in LENGTHS:
            inputs = narrow(built, seq=seq).inputs
            with torch.no_grad():
                expected, got = model(**inputs), compiled(**inputs)
            assert output_error(got, expected) < 1e-5, seq
    assert fusebackend.metrics.eager_graphs == 0
    per_shape = {name: count for name, (count, symbols) in fusebackend.metrics.specialized.items() if symbols}
    if symbolic:  # each of Dynamo's graphs compiled once (Dynamo recompiles once, after the first length)
        assert not per_shape and not fusebackend.metrics.not_symbolic, fusebackend.metrics.not_symbolic
        assert fusebackend.metrics.graphs_compiled == 2
    else:
        assert per_shape and all(count >= 2 for count in per_shape.values()), fusebackend.metrics.specialized
