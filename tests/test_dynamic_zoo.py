"""The zoo's tiny language models with ``dynamic=True`` over three sequence lengths (CPU).

Dynamo's graphs are symbolic. By default (``config.symbolic`` "auto") fuse compiles each of them
once for every length (README, "Dynamic shapes"); with "off", once per length. Each length must
match eager, no graph may run eagerly, and ``metrics.specialized`` names the graphs compiled per
shape: none by default, the symbolic graph with "off".
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


LANGUAGE_MODELS = ["gpt2", "bert", "distilbert", "llama", "qwen2", "gpt_neox", "t5"]


@pytest.mark.parametrize("name,symbolic", [(name, "auto") for name in LANGUAGE_MODELS] + [("gpt2", "off")])
def test_a_language_model_over_three_lengths(name: str, symbolic: str) -> None:
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
    if symbolic == "auto":  # each of Dynamo's graphs compiled once (Dynamo recompiles after the first length)
        assert not per_shape and not fusebackend.metrics.not_symbolic, fusebackend.metrics.not_symbolic
        assert fusebackend.metrics.graphs_compiled <= 3
    else:
        assert per_shape and all(count >= 2 for count in per_shape.values()), fusebackend.metrics.specialized
