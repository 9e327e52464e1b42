"""The OpInfo runner itself (``benchmarks/opinfo_run.py``): its comparison, its input copies, its
time limit, and how it classifies an op, on small stand-in ops whose behaviour is known."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import pytest
import torch

from benchmarks import opinfo_run
from benchmarks.opinfo_run import OpTimeout, clone, compare, run_op, time_limit, TIGHT, REDUCTION


@dataclasses.dataclass
class Sample:
    input: Any
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class FakeOp:
    """What ``run_op`` reads from an OpInfo: names, the callable, the samples."""

    name: str
    op: Callable[..., Any]
    samples: list[Sample]
    variant_test_name: str = ""

    def sample_inputs(self, device: str, dtype: torch.dtype) -> list[Sample]:
        return self.samples


def _samples() -> list[Sample]:
    return [Sample(torch.randn(5, 7)), Sample(torch.randn(6, 4).t())]


# ------------------------------------------------------------------ compare


def test_compare_nan_equal_and_tight_tolerance() -> None:
    x = torch.tensor([1.0, float("nan"), -3.0])
    assert compare(x, x.clone(), TIGHT) is None
    assert compare(x * (1 + 1e-7), x, TIGHT) is None
    assert "Mismatched elements: 1 / 3" in compare(x + torch.tensor([0.0, 0.0, 1e-3]), x, TIGHT)
    assert compare(torch.tensor([1.0, 0.0]), torch.tensor([1.0, float("nan")]), TIGHT) is not None


def test_compare_reduction_tolerance_is_looser() -> None:
    x = torch.full((4,), 100.0)
    assert compare(x + 5e-4, x, TIGHT) is not None
    assert compare(x + 5e-4, x, REDUCTION) is None


def test_compare_structures_and_exact_integers() -> None:
    a = (torch.ones(2), [torch.arange(3), 2.5], {"k": torch.zeros(1, dtype=torch.bool)})
    assert compare(clone(a), a, TIGHT) is None
    assert "output[1][0]" in compare((a[0], [torch.tensor([0, 1, 3]), 2.5], a[2]), a, TIGHT)
    assert "list of 1" in compare((a[0], [a[1][0]], a[2]), a, TIGHT)
    assert "[4]" in compare(torch.ones(4), torch.ones(2), TIGHT)
    assert "torch.float64" in compare(torch.ones(2, dtype=torch.float64), torch.ones(2), TIGHT)
    assert compare(3, 4, TIGHT) is not None


def test_compare_metadata_only_ignores_values() -> None:
    assert compare(torch.randn(3, 2), torch.randn(3, 2), None) is None
    assert compare(torch.randn(3, 2), torch.randn(2, 3), None) is not None


# ------------------------------------------------------------------ clone and the time limit


def test_clone_keeps_layout_and_is_separate() -> None:
    base = torch.randn(6, 8)
    x = base[1:, ::2].t()
    y = clone(x)
    assert (y.shape, y.stride(), y.storage_offset()) == (x.shape, x.stride(), x.storage_offset())
    assert torch.equal(y, x)
    y.add_(1)
    assert not torch.equal(y, x)


def test_time_limit_escapes_except_exception() -> None:
    start = time.perf_counter()
    with pytest.raises(OpTimeout):
        with time_limit(0.2):
            try:
                while True:
                    pass
            except Exception:  # the backend's fallback handler must not swallow the alarm
                pass
    assert time.perf_counter() - start < 5


# ------------------------------------------------------------------ classification


def test_run_op_match_with_kernels() -> None:
    result = run_op(FakeOp("add_one", lambda x: x * 2 + 1, _samples()))
    assert (result.status, result.kind, result.samples) == ("match", "kernels", 2)
    assert result.kernels >= 2 and not result.problems and not result.eager_graphs


def test_run_op_mismatch() -> None:
    def differs(x: torch.Tensor) -> torch.Tensor:
        return x + (2 if torch.compiler.is_compiling() else 1)

    result = run_op(FakeOp("differs", differs, _samples()))
    assert result.status == "mismatch"
    assert result.problems[0].startswith("sample 0: output: Mismatched elements")


def test_run_op_error_and_skipped_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    def compiled_call_raises(op: Any, sample: Any) -> Any:
        raise ValueError("boom\nmore")

    with monkeypatch.context() as m:
        m.setattr(opinfo_run, "_compiled_call", compiled_call_raises)
        result = run_op(FakeOp("raises", torch.neg, _samples()))
    assert result.status == "error"
    assert result.problems == ["sample 0: ValueError: boom", "sample 1: ValueError: boom"]

    def eager_raises(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 5:
            raise RuntimeError("bad sample")
        return x + 1

    result = run_op(FakeOp("eager_raises", eager_raises, _samples()))
    assert (result.status, result.samples) == ("match", 1)
    assert run_op(FakeOp("no_samples", torch.neg, [])).status == "skipped"


def test_run_op_random_values_compared_on_metadata() -> None:
    result = run_op(FakeOp("noisy", lambda x: x + torch.rand_like(x), _samples()))
    assert result.status == "match"
    assert any("vary" in note for note in result.notes)


def test_run_op_time_limit() -> None:
    def slow(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.1)
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            pass
        return x

    result = run_op(FakeOp("slow", slow, _samples()), limit=0.5)
    assert result.status == "timeout"
    assert result.seconds < 10


# ------------------------------------------------------------------ the CLI's report


def test_report_figures_and_causes() -> None:
    from benchmarks.opinfo import figures, grouped, report
    from benchmarks.opinfo_run import OpResult

    warn = "fusebackend: compiling graph inference_{} failed (Unsupported: get_attr); running this graph eagerly"
    results = [
        OpResult("a", "match", "kernels", samples=2, kernels=3),
        OpResult("b", "match", "eager_graph", samples=2, kernels=1, eager_graphs=1, warnings=[warn.format(7)]),
        OpResult("c", "match", "eager_graph", samples=2, eager_graphs=2, warnings=[warn.format(12)]),
        OpResult("d", "mismatch", "aten_only", samples=2, graphs=2, fallbacks=["cumsum"],
                 problems=["sample 1: output: Mismatched elements: 1 / 4 (25.0%)"]),
    ]
    f = figures(results)
    assert (f["ops"], f["match"], f["kernels"], f["eager_graph"], f["kind_aten_only"]) == (4, 3, 2, 2, 1)
    groups = grouped(results)
    assert [[name for name, _ in members] for members in groups.values()] == [["b", "c"], ["d"]]
    text = report(results, 2)
    assert "match eager:         3 / 4" in text and "d: cumsum" in text
