"""The benchmark harness: its output check (``benchmarks/check.py``: a wrong output must fail it), and the
files a run writes."""

from __future__ import annotations

import functools
import json
import pathlib

import pytest
import torch

from benchmarks.check import Mismatch, against_reference, compare
from benchmarks.harness import _check


def test_fp32_output_is_held_to_fp32_tolerance() -> None:
    expected = torch.randn(1000)
    compare(expected * (1 + 1e-6), expected)
    with pytest.raises(Mismatch, match="output 0"):
        compare(expected * (1 + 1e-3), expected)


def test_precision_loosens_to_the_compute_dtype_and_never_tightens() -> None:
    # a bf16 model's fp32 loss: bf16 rounding is expected, a wrong value is not
    expected = torch.randn(1000)
    compare(expected * (1 + 1e-3), expected, precision=torch.bfloat16)
    with pytest.raises(Mismatch):
        compare(expected * 1.5, expected, precision=torch.bfloat16)
    half = torch.randn(1000, dtype=torch.bfloat16)
    compare((half.float() * (1 + 5e-3)).bfloat16(), half, precision=torch.float32)


def test_structure_and_nan_mismatches_fail() -> None:
    x = torch.randn(10)
    with pytest.raises(Mismatch, match="output tensors"):
        compare((x, x), (x,))
    y = x.clone()
    y[3] = float("nan")
    with pytest.raises(Mismatch, match="NaN"):
        compare(y, x)


def _noisy(ref: torch.Tensor, scale: float, seed: int) -> torch.Tensor:
    g = torch.Generator(device=ref.device).manual_seed(seed)
    return (ref + scale * ref.abs().mean() * torch.randn(ref.shape, generator=g)).bfloat16()


def test_fp32_reference_decides_where_eager_itself_is_coarse() -> None:
    # eager's bf16 result is 8% off the fp32 truth; the compiled one 3%: they differ from each
    # other beyond bf16's 2e-2, and the reference shows which one carries the error
    ref = torch.randn(4000)
    eager, compiled = _noisy(ref, 0.08, 1), _noisy(ref, 0.03, 2)
    with pytest.raises(Mismatch):
        compare(compiled, eager)
    err, note = against_reference((compiled, torch.tensor(3)), (eager, torch.tensor(3)), (ref, torch.tensor(3)))
    assert err > 2e-2 and "output 0" in note and "against fp32" in note
    # the harness's check takes that path only with a reference, and computes it once
    calls: list[int] = []
    reference = functools.cache(lambda: calls.append(1) or ref)  # as the harness passes it
    err_checked, notes = _check(compiled, eager, None, reference)
    assert err_checked == err and notes == [note]
    _check(compiled, eager, None, reference)
    assert calls == [1]
    with pytest.raises(Mismatch):
        _check(compiled, eager, None, None)


def test_fp32_reference_still_fails_a_wrong_output() -> None:
    ref = torch.randn(4000)
    eager = _noisy(ref, 0.08, 1)
    wrong = _noisy(ref, 0.3, 3)  # far more than twice eager's error
    with pytest.raises(Mismatch, match="against fp32"):
        against_reference(wrong, eager, ref)
    with pytest.raises(Mismatch, match="differs"):  # integer outputs stay exact
        against_reference((eager, torch.tensor(2)), (eager, torch.tensor(3)), (ref, torch.tensor(3)))
    # within eager's own tolerance, no note and no reference needed; an fp32 output of a bf16
    # computation (a loss) is held to bf16's tolerance, as in compare
    assert against_reference(eager, eager, ref) == (0.0, "")
    loss = torch.tensor(2.0)
    err, note = against_reference(loss * (1 + 3e-4), loss, torch.tensor(2.0001), precision=torch.bfloat16)
    assert note == "" and err == pytest.approx(3e-4, rel=1e-3)


@pytest.mark.full  # a study's, 20-30 s on 2 cores: pytest --full
def test_column_sum_study_kernels_sum_columns() -> None:
    # the study's hand-written kernels (both phases, one kernel with its counters reset between
    # calls, a first phase alone, a read-only pass) are checked against an fp32 sum on fresh
    # inputs, three times each; in a child process so that Triton picks the interpreter itself
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "benchmarks.studies.column_sum_study", "--check"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    checked = [line for line in done.stdout.splitlines() if line.startswith("checked ")]
    assert len(checked) >= 7 and "checked one kernel, split 8, 64 x 16, 4 warps" in checked


def test_a_harness_run_writes_its_chart_and_draws_it_again(tmp_path: pathlib.Path) -> None:
    # the memory-bound suite, two cases at tiny shapes on the CPU: the JSON, the Markdown and the
    # chart of the share of the floor each variant reached; then the chart again from the JSON
    from benchmarks import memory_bound, report

    out = tmp_path / "run"
    memory_bound.main(["--small", "--cases", "softmax_fp32,sum_dim1", "--device", "cpu", "--variants", "eager,fuse",
                       "--out", str(out), "--repeats", "1"])
    data = json.loads((out / "memory_bound_small.json").read_text())
    assert [c["name"] for c in data["cases"]] == ["softmax_fp32", "sum_dim1"]
    assert all(c["floor_ms"] and any(v["variant"] == "fuse" and v["floor_fraction"] for v in c["variants"])
               for c in data["cases"])
    assert (out / "memory_bound_small.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = tmp_path / "again.png"
    report.main([str(out / "memory_bound_small.json"), str(again)])
    assert again.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing with a floor: no chart, no file
    assert report.chart({"cases": [dict(data["cases"][0], floor_ms=None)]}, str(tmp_path / "none.png")) is None
    assert not (tmp_path / "none.png").exists()


def _study_check(module: str, *extra: str) -> tuple[list[str], str]:
    """``python -m benchmarks.studies.<module> --check`` in Triton's interpreter: the lines that
    give an error against float64, and the whole output."""
    import os
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.studies.{module}", "--check", *extra], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "error " in line], proc.stdout


def _errors(lines: list[str]) -> list[float]:
    return [float(line.split("error ")[1].split()[0]) for line in lines]


def test_the_int8_rows_study_checks_each_variant_against_float64() -> None:
    # benchmarks/studies/int8_rows.py times kernels that dequantize int8 weights in different
    # ways: each must compute the product it is timed for (bf16 rounding of the weights apart)
    lines, out = _study_check("int8_rows")
    errors = _errors(lines)
    assert len(errors) == 2 * 5 and max(errors) < 1e-2, out


def test_the_epilogue_gemm_study_checks_each_variant_against_float64() -> None:
    # benchmarks/studies/epilogue_gemm.py times Triton GEMMs that apply a bias and GELU, or a
    # GeGLU, to their accumulators, against a product and a kernel after it: each must compute
    # what it is timed for (float32 in the interpreter, at sizes whose tiles are ragged)
    lines, out = _study_check("epilogue_gemm")
    errors = _errors(lines)
    assert len(errors) == 2 * 3 and max(errors) < 1e-5, out
    assert sum("template" in line for line in lines) == 4, out


def test_the_column_configs_study_generates_each_variant_and_checks_it() -> None:
    # benchmarks/studies/column_configs_study.py: each case compiled under each variant's blocks
    # (their launches differ, so the cache did not hand one variant another's kernels) and each
    # output checked against eager before any timing
    _, out = _study_check("column_configs_study")
    rows = [line for line in out.splitlines() if line and not line.startswith((" ", "case", "copy"))]
    assert len(rows) == 6 and all(line.split()[-3:] == ["ok", "ok", "ok"] for line in rows), out
    today = [line for line in out.splitlines() if line.strip().startswith("today:")]
    one_block = [line for line in out.splitlines() if line.strip().startswith("one block:")]
    assert len(today) == len(one_block) == 6 and all(t.split(":", 1)[1] != o.split(":", 1)[1]
                                                      for t, o in zip(today, one_block)), out


def test_the_costly_recompute_study_checks_each_variant_and_stores_the_gelu_once() -> None:
    # benchmarks/studies/costly_recompute_study.py: GELU then GRN under each variant against
    # float64; recomputed, both kernels that read the GELU evaluate erf, stored only the sum's
    # (which then writes the GELU too); at these tiny sizes the default recomputes it (a small
    # kernel's worth of instructions is allowed)
    _, out = _study_check("costly_recompute_study")
    rows = [line for line in out.splitlines() if line.startswith("GELU, GRN")]
    assert len(rows) == 4 and all(line.count("ok, error") == 5 for line in rows), out
    kernels = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    runs = {name: [line for line in kernels if line.startswith(f"{name}:")] for name in ("default", "recomputed", "stored")}
    assert all(len(lines) == 4 for lines in runs.values()), out
    assert all(line.count("(erf)") == 2 for line in runs["recomputed"] + runs["default"]), out
    assert all(line.count("(erf)") == 1 for line in runs["stored"]), out


@pytest.mark.full  # a study's, about 11 s on 2 cores: pytest --full
def test_the_depthwise_tiles_study_checks_each_variant() -> None:
    # benchmarks/studies/depthwise_tiles_study.py: a depthwise convolution with its batch norm
    # and activation under each variant's blocks, against the module in float32, all ours
    _, out = _study_check("depthwise_tiles_study")
    rows = [line for line in out.splitlines() if line.startswith("b2 ")]
    assert len(rows) == 3 and all(line.count("ok, error") == 6 for line in rows), out


@pytest.mark.full  # a study's, about 10 s on 2 cores: pytest --full
def test_the_padded_window_study_checks_each_variant() -> None:
    # benchmarks/studies/padded_window_study.py: a padded depthwise block with the activation
    # kept apart and evaluated at each tap, against the module in float32; at stride 1 the
    # default keeps it apart (2 kernels), the rule before evaluated it at each tap (1)
    _, out = _study_check("padded_window_study")
    rows = [line for line in out.splitlines() if line.startswith("b2 ")]
    assert len(rows) == 2 and all(line.count("ok, error") == 3 for line in rows), out
    assert rows[0].endswith("2 / 1"), out


@pytest.mark.full  # a study's, about 10 s on 2 cores: pytest --full
def test_the_flat_configs_study_relaunches_each_kernel_at_each_config() -> None:
    # benchmarks/studies/flat_configs_study.py: a padded depthwise block's two flat kernels,
    # recorded in the graph's call and launched alone at every config (8 of them), each
    # relaunch's outputs equal to the recorded ones (it raises where not)
    _, out = _study_check("flat_configs_study")
    rows = [line for line in out.splitlines() if line.startswith("fused_pw")]
    assert len(rows) == 2 and all(len(line.split()) == 1 + 2 + 8 + 2 for line in rows), out
    assert "constant_pad_nd_convolution" in rows[1] and " - " not in rows[1], out


@pytest.mark.full  # a study's, about 30 s on 2 cores: pytest --full
def test_the_flat_configs_study_relaunches_a_models_reductions() -> None:
    # the same study's --reductions over the tiny BERT: its persistent reductions relaunched at
    # other XBLOCK and warps, each relaunch's outputs equal to the recorded ones
    _, out = _study_check("flat_configs_study", "--models", "bert", "--models-only", "--reductions", "--top", "1")
    assert "persistent reductions" in out and "(other outputs)" not in out, out
    rows = [line for line in out.splitlines() if line.startswith("fused_red")]
    assert len(rows) == 1 and rows[0].count(" us") + rows[0].count(", ") >= 4, out


@pytest.mark.full  # a study's, about 30 s on 2 cores: pytest --full
def test_the_odd_rows_study_checks_each_variant() -> None:
    # benchmarks/studies/odd_rows_study.py: every block of each row length against torch.softmax
    _, out = _study_check("odd_rows_study")
    checked = [line for line in out.splitlines() if line.startswith("  ") and "ok, error" in line]
    lengths = [line for line in out.splitlines() if line.startswith("rows of ")]
    assert len(lengths) == 6 and len(checked) == 6 * 9 + 5 * 8, out  # rows of 9 take no warp-a-row block


@pytest.mark.full  # a study's, 25-30 s on 2 cores: pytest --full
def test_the_cross_entropy_study_checks_each_variant_and_folds_the_one_hot() -> None:
    # benchmarks/studies/cross_entropy_study.py: the loss and its gradient under every variant
    # against eager's; folded, the backward's sum over nll_loss's one-hot is gone: its last
    # kernel is pointwise where today's is a reduction over the vocabulary
    _, out = _study_check("cross_entropy_study", "--models", "gpt2", "--rows", "2")
    (row,) = [line for line in out.splitlines() if line.startswith("gpt2")]
    assert row.split()[-4:] == ["ok", "ok", "ok", "ok"], out
    kernels = {line.split(":")[0].strip(): line.split(":", 2)[2] for line in out.splitlines() if "kernels:" in line}
    assert kernels["fuse"].split(", ")[-1].startswith("fused_red"), out
    assert kernels["one-hot folded"].split(", ")[-1].startswith("fused_pw"), out
