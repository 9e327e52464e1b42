"""The zoo's tiny language models with ``dynamic=True`` over three sequence lengths (CPU).

Dynamo's graphs are symbolic; fuse compiles them once per length today (README, "Dynamic
shapes"). Each length must match eager, no graph may run eagerly, and ``metrics.specialized``
must name the symbolic graph that was compiled per shape. When symbolic compilation lands, one
compile serves every length, and the count asserted here drops to one.
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


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_a_language_model_over_three_lengths(name: str) -> None:
    built = ZOO[name].build("tiny")
    model = built.model.eval()
    compiled = torch.compile(model, backend="fuse", dynamic=True)
    for seq in LENGTHS:
        inputs = narrow(built, seq=seq).inputs
        with torch.no_grad():
            expected, got = model(**inputs), compiled(**inputs)
        assert output_error(got, expected) < 1e-5, seq
    assert fusebackend.metrics.eager_graphs == 0
    symbolic = {name: count for name, (count, symbols) in fusebackend.metrics.specialized.items() if symbols}
    assert symbolic and all(count >= 2 for count in symbolic.values()), fusebackend.metrics.specialized
