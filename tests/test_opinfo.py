"""PyTorch's OpInfo database through ``backend="fuse"``: every op with float32 samples, compiled on
its first two samples (``benchmarks/opinfo_run.py``) and compared with eager.

Each op asserts that its outputs match eager's (values, or shapes and dtypes where values are
undefined: ``METADATA_ONLY``) and that no graph ran eagerly. An op known to fail is listed in
``EXPECTED_FAILURES`` with the failure it shows and why; it xfails on that failure only, and the
test fails as soon as it passes, so the list stays true.

By default a fixed sample of about three in ten ops runs (186 ops, ~1 minute on 2 cores):
the ops real models use (``MODEL_OPS``) and a stable eighth of the rest chosen by a hash of the op
name. Every op (``--full`` runs them too):

    python -m pytest tests/test_opinfo.py --opinfo=all

``python -m benchmarks.opinfo`` runs every op outside pytest and prints the figures and lists.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch

from benchmarks.opinfo_run import OpResult, float32_ops, op_name, run_op

# op -> (the failure it shows, why). Failures: "mismatch", "error" (the compiled call raises),
# "timeout", "eager_graph" (the backend ran a graph eagerly). Measured on main with two samples
# per op, 2026-11-24: none (narrow and tensor_split with tensor bounds, listed until then, now
# run alone as ATen calls in a split graph); `python -m benchmarks.opinfo` prints every cause.
EXPECTED_FAILURES: dict[str, tuple[str, str]] = {}

# Ops real models use (transformers, convnets, their training losses): always in the sample.
MODEL_OPS = frozenset({
    "add", "sub", "mul", "div.no_rounding_mode", "true_divide", "neg", "pow", "rsqrt", "sqrt", "exp",
    "log", "tanh", "sigmoid", "erf", "abs", "sin", "cos", "where", "masked_fill", "clamp",
    "maximum", "minimum", "to", "float", "half", "bfloat16", "long", "bool",
    "sum", "mean", "var", "var_mean", "amax", "argmax", "max.reduction_with_dim", "cumsum", "topk",
    "sort", "logsumexp",
    "softmax", "log_softmax", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.hardtanh", "nn.functional.hardswish", "nn.functional.mish",
    "nn.functional.softplus", "nn.functional.layer_norm", "nn.functional.rms_norm",
    "nn.functional.group_norm", "nn.functional.batch_norm", "native_layer_norm",
    "nn.functional.normalize", "nn.functional.dropout",
    "nn.functional.linear", "matmul", "mm", "bmm", "baddbmm", "addmm", "einsum",
    "nn.functional.scaled_dot_product_attention", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy_with_logits",
    "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d", "nn.functional.interpolate.nearest",
    "nn.functional.interpolate.bilinear", "nn.functional.pad.constant",
    "cat", "stack", "split", "chunk", "view", "reshape", "permute", "transpose", "expand",
    "unsqueeze", "squeeze", "flatten", "contiguous", "__getitem__", "index_select", "gather",
    "scatter", "index_put", "arange", "zeros", "ones", "full", "tril", "triu", "repeat", "roll",
    "outer",
})

# The rest of the sample: the ops whose name's CRC is below KEEP modulo OUT_OF (a CRC, so the
# sample is the same in every process and on every machine; Python's hash() is salted). The sample
# of three in four took 230 s of the suite's 35 minutes on 2 cores (2026-11-27; median 0.37 s an
# op); one in eight keeps the whole suite near 15 minutes.
KEEP, OUT_OF = 1, 8


def in_sample(name: str) -> bool:
    return name in MODEL_OPS or zlib.crc32(name.encode()) % OUT_OF < KEEP


def _device() -> str:
    return str(torch.get_default_device())  # FUSE_TEST_DEVICE=cuda (conftest.py) moves the run


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "op" not in metafunc.fixturenames:
        return
    every = metafunc.config.getoption("--opinfo") == "all" or metafunc.config.getoption("--full")
    ops = [op for op in float32_ops(_device()) if every or in_sample(op_name(op))]
    metafunc.parametrize("op", ops, ids=[op_name(op) for op in ops])


def failures(result: OpResult) -> dict[str, str]:
    """What failed, by kind, each with its first line."""
    found: dict[str, str] = {}
    if result.status in ("mismatch", "error", "timeout"):
        found[result.status] = result.problems[0] if result.problems else result.status
    if result.eager_graphs:
        backend = [w for w in result.warnings if w.startswith("fusebackend")]
        found["eager_graph"] = backend[0] if backend else "a graph ran eagerly"
    return found


def test_opinfo(op: Any) -> None:
    name = op_name(op)
    result = run_op(op, _device())
    if result.status == "skipped":
        pytest.skip("eager raises on every sample (or there is none)")
    found = failures(result)
    expected = EXPECTED_FAILURES.get(name)
    if expected is None:
        assert not found, f"{name}: " + "; ".join(f"{k}: {v}" for k, v in found.items())
        return
    kind, why = expected
    if not found:
        pytest.fail(f"{name} passes now: remove it from EXPECTED_FAILURES (listed as {kind}: {why})")
    unexpected = {k: v for k, v in found.items() if k != kind}
    assert not unexpected, f"{name}: " + "; ".join(f"{k}: {v}" for k, v in unexpected.items())
    pytest.xfail(f"{why}: {found[kind]}")


def test_expected_failures_name_real_ops() -> None:
    """Every listed op exists, so that a renamed op does not leave a stale entry behind."""
    names = {op_name(op) for op in float32_ops(_device())}
    assert set(EXPECTED_FAILURES) <= names, sorted(set(EXPECTED_FAILURES) - names)
    assert MODEL_OPS <= names, sorted(MODEL_OPS - names)
    assert all(kind in ("mismatch", "error", "timeout", "eager_graph") for kind, _ in EXPECTED_FAILURES.values())
