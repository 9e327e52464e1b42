"""The model zoo on the CPU: real architectures (``benchmarks/zoo``) in their tiny configurations.

For every zoo model whose library imports here (transformers' models; torchvision's and timm's
skip with the reason where those are not installed):

- inference: ``model.eval()`` under ``torch.no_grad()``, compiled with ``backend="fuse"``; no
  graph may run eagerly and every output must match eager within ``OUTPUT_TOL`` of the output's
  largest magnitude.
- a training step (forward, the model's own loss, backward): the compiled fp32 model, an eager
  fp32 copy and an eager float64 copy of the same weights on the same batch. For the loss and every
  parameter gradient, the compiled result's distance from float64 must be at most twice eager's
  distance plus ``GRAD_ATOL`` times the largest float64 gradient of the model; batch norm's running
  statistics (updated in train mode) are held to the same rule. No graph may run eagerly.

Dropout is off in every zoo model, so the three runs compute the same function.

Time on 2 cores, cold kernel cache (2026-11-23): about 2.5 minutes for the file (45 s of inference,
110 s of training steps, MobileNetV2's 17 blocks a quarter of it), up to twice that while other
processes share the cores. ``pytest --zoo-train=core`` trains only ``TRAIN_SET`` (GPT-2, Llama,
BERT, T5, ViT, ResNet, MobileNetV2) and skips the other training steps.
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest
import torch

pytest.importorskip("transformers", reason="the zoo needs transformers: pip install -e '.[zoo]'")

import fusebackend  # noqa: E402
from benchmarks.zoo import TRAIN_SET, ZOO  # noqa: E402
from benchmarks.zoo.compare import (  # noqa: E402
    buffer_distances, gradient_distances, output_error, output_names, output_tensors, relative_error,
    training_step,
)

# Outputs against eager, relative to the output's largest magnitude. fp32 rounds at about 1.2e-7
# of that magnitude per operation; the compiled graph sums in another order than eager's kernels
# (LayerNorm, softmax and the losses are decomposed into primitive reductions), and two layers
# compound it: on this machine the tiny models differ from eager by at most 4.5e-7 (eager itself
# is up to 6e-7 from float64). 1e-5 leaves a factor of 20 for other CPUs and BLAS builds, and is
# still a thousand times below what a wrong op does (1e-2 and more).
OUTPUT_TOL = 1e-5
# The absolute term of the gradient rule, relative to the model's largest float64 gradient: about
# 8 units in the last place of fp32 at that magnitude. It covers gradients that eager happens to
# compute exactly (a bias gradient summed in the same order as float64's: distance 0) and that
# the compiled graph sums in another order.
GRAD_ATOL = 1e-6



def _available(name: str) -> None:
    reason = ZOO[name].available()
    if reason is not None:
        pytest.skip(reason)


def _fuse_compiled_something() -> None:
    m = fusebackend.metrics
    assert m.eager_graphs == 0, f"{m.eager_graphs} graph(s) ran eagerly (the warning above names the error)"
    assert m.graphs_compiled >= 1, "no graph reached the backend"


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_inference_matches_eager(name: str) -> None:
    _available(name)
    built = ZOO[name].build("tiny")
    model = built.model.eval()
    compiled = torch.compile(model, backend="fuse")
    with torch.no_grad():
        expected = model(**built.inputs)
        actual = compiled(**built.inputs)
    _fuse_compiled_something()
    assert len(output_tensors(actual)) >= 1
    errors = {n: relative_error(a, e)
              for n, a, e in zip(output_names(expected), output_tensors(actual), output_tensors(expected))}
    error = output_error(actual, expected)  # also checks the structure, shapes and dtypes
    assert error <= OUTPUT_TOL, f"outputs differ from eager (relative to their magnitude): {errors}"


def _train_set(config: pytest.Config) -> tuple[str, ...]:
    return TRAIN_SET if config.getoption("--zoo-train", default="all") == "core" else tuple(ZOO)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_training_step_gradients(name: str, request: pytest.FixtureRequest) -> None:
    if name not in _train_set(request.config):
        pytest.skip("--zoo-train=core: not in TRAIN_SET")
    _available(name)
    built = ZOO[name].build("tiny")
    model = built.model.train()
    eager = copy.deepcopy(model)
    exact = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="fuse")
    result = training_step(model, compiled, built)
    reference = training_step(eager, eager, built)
    exact_result = training_step(exact, exact, built, torch.float64)
    _fuse_compiled_something()
    names = [a.name for a in fusebackend.history()]
    assert any(n.startswith("backward") for n in names), f"no backward graph compiled by fuse: {names}"
    assert set(result.grads) == set(exact_result.grads), "parameters with gradients differ from float64's"
    distances = gradient_distances(result, reference, exact_result, GRAD_ATOL)
    distances += buffer_distances(result, reference, exact_result, GRAD_ATOL)
    bad = sorted((d for d in distances if not d.ok), key=lambda d: -d.ratio)
    worst = max(distances, key=lambda d: d.ratio)
    assert not bad, (f"{len(bad)} of {len(distances)} tensors further from float64 than twice eager "
                     f"+ {GRAD_ATOL:g} x largest gradient; worst first:\n  " + "\n  ".join(str(d) for d in bad[:8]))
    assert worst.ratio <= 1.0


def test_zoo_runner_tiny_smoke(tmp_path: pathlib.Path) -> None:
    """``python -m benchmarks.zoo --tiny`` on one model: eager and fuse, a table and the JSON."""
    from benchmarks.zoo import run

    # --keep-caches: the kernels compiled by the inference test above, in the test session's cache
    rows = run.main(["--tiny", "--models", "gpt2", "--out", str(tmp_path), "--repeats", "1", "--keep-caches"])
    assert [r.model for r in rows] == ["gpt2"]
    row = rows[0]
    assert row.status == "ok", row
    assert row.fuse is not None and row.fuse.eager_graphs == 0
    assert row.fuse.error is not None and row.fuse.error <= OUTPUT_TOL
    saved = json.loads((tmp_path / "zoo_tiny.json").read_text())
    assert saved["rows"][0]["model"] == "gpt2"
    assert (tmp_path / "zoo_tiny.md").exists()
