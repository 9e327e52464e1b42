"""The zoo's tiny language models with ``dynamic=True`` over three sequence lengths (CPU).

Dynamo's graphs are symbolic. By default (``config.symbolic`` "auto") fuse compiles each of them
once for every length (README, "Dynamic shapes"); with "off", once per length. Each length must
match eager, no graph may run eagerly, and ``metrics.specialized`` names the graphs compiled per
shape: none by default, the symbolic graph with "off".

By default Llama (rotary positions) runs with "auto". GPT-2 with "auto" is what
``tests/test_dynamic_study.py`` checks of ``benchmarks.dynamic_zoo`` (one compile for three
lengths, each matching eager, no graph run eagerly, nothing compiled per shape), and "off" (a
compile per shape, named in ``metrics.specialized``) is ``tests/test_dynamic.py``'s setting; they
and the other language models (BERT, DistilBERT, Qwen2, GPT-NeoX, T5: 104 s on 2 cores, T5's
relative positions 46 s of it) run with ``pytest --full``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the zoo needs transformers: pip install -e '.[zoo]'")

import fusebackend  # noqa: E402
from benchmarks.zoo.compare import output_error  # noqa: E402
from benchmarks.zoo.registry import ZOO  # noqa: E402
from benchmarks.zoo.spec import narrow  # noqa: E402
from helpers import FULL  # noqa: E402

LENGTHS = (16, 11, 7)


LANGUAGE_MODELS = ["gpt2", "bert", "distilbert", "llama", "qwen2", "gpt_neox", "t5"]
SAMPLE = ("llama",)  # the default run's


@pytest.mark.parametrize("name,symbolic", [pytest.param(name, "auto", marks=() if name in SAMPLE else FULL)
                                           for name in LANGUAGE_MODELS] + [pytest.param("gpt2", "off", marks=FULL)])
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
