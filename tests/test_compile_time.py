"""Compile times apart: Inductor's first call by stage (the zoo), and each backend's cold and warm
first calls in processes of their own (``benchmarks/compile_time.py``)."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("transformers")

import fusebackend  # noqa: E402
from benchmarks import compile_time  # noqa: E402
from benchmarks.zoo import run  # noqa: E402


def test_inductors_first_call_is_split_by_dynamos_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    timers = {"_compile.compile_inner": [9.0, 5.0, 1.5], "OutputGraph.call_user_compiler": [8.0, 4.0, 1.0],
              "compile_fx_inner": [7.0, 3.0, 0.25]}
    monkeypatch.setattr(fusebackend.metrics, "dynamo_timers", lambda: timers)
    before = {"_compile.compile_inner": 1, "OutputGraph.call_user_compiler": 1, "compile_fx_inner": 1}
    # two frames since `before`: 6.5 s in them, 5 s of it the backend, 3.25 s of that Inductor's own
    assert run.inductor_stages(before, 7.0, train=False) == {"dynamo": 1.5, "aot": 1.75, "inductor": 3.25, "other": 0.5}
    assert run.inductor_stages(before, 7.0, train=True) == {"dynamo": 1.5, "backend": 5.0, "other": 0.5}


@pytest.mark.full  # four processes, 30-60 s on 2 cores: pytest --full
def test_each_backend_compiles_cold_then_warm_in_processes_of_its_own(tmp_path: pathlib.Path) -> None:
    compile_time.run("resnet", "inference", repeats=1, out=str(tmp_path), timeout=600, backends=["fuse"], tiny=True)
    found = compile_time.collect(str(tmp_path))
    assert set(found) == {("resnet (inference)", "fuse", "cold"), ("resnet (inference)", "fuse", "warm")}
    cold, = found[("resnet (inference)", "fuse", "cold")]
    warm, = found[("resnet (inference)", "fuse", "warm")]
    assert "schedule" in cold["stages"] and "schedule" not in warm["stages"]  # the warm process loaded it
    text = compile_time.table(found)
    row = next(line for line in text.splitlines() if line.startswith("| resnet (inference) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "-" and float(cells[2]) == pytest.approx(cold["s"], abs=0.05), row  # no Inductor run
    assert float(cells[7]) < float(cells[2])  # fuse's own stages warm: a part of the cold first call
    assert "- resnet (inference), fuse warm: " in text


def test_the_chart_gives_fuse_over_inductor_per_model(tmp_path: pathlib.Path) -> None:
    found = {("gpt2 (inference)", "inductor", "cold"): [{"s": 10.0, "stages": {}}, {"s": 12.0, "stages": {}}],
             ("gpt2 (inference)", "fuse", "cold"): [{"s": 5.5, "stages": {}}],
             ("gpt2 (inference)", "inductor", "warm"): [{"s": 2.0, "stages": {}}]}
    path = compile_time.chart(found, str(tmp_path / "ct.png"), "title")
    assert path is not None and (tmp_path / "ct.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert compile_time.chart({}, str(tmp_path / "none.png"), "title") is None
    assert not (tmp_path / "none.png").exists()
