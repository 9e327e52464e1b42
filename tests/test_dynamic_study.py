"""``benchmarks.studies.dynamic_study`` and ``benchmarks.dynamic_zoo`` on the CPU (the tiny GPT-2): each
variant of the study runs in a process of its own, matches eager, and fuse's compile counts are
what the variant names; the zoo's model compiles once for its three lengths."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the zoo needs transformers: pip install -e '.[zoo]'")

from benchmarks.studies import dynamic_study  # noqa: E402


@pytest.mark.full  # a study's, 45 s on 2 cores: pytest --full
def test_the_study_compiles_once_for_all_lengths_where_asked(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    # the two variants' processes at once (each run() waits on its own), as run() over both would
    # give them one after the other
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(dynamic_study.run, [variant], "gpt2", "tiny", [16, 11], 2, str(tmp_path), rounds=1)
                for variant in ("fuse-static", "fuse-symbolic")]
        results = [r for run in runs for r in run.result()]
    static, symbolic = results
    assert (static["variant"], symbolic["variant"]) == ("fuse-static", "fuse-symbolic")
    for r in results:
        assert [row["seq"] for row in r["rows"]] == [16, 11]
        assert max(row["error"] for row in r["rows"]) < 1e-5 and r["eager_graphs"] == 0
    assert static["fuse_graphs"] == 2 and not static["not_symbolic"]  # a static graph per length
    # Dynamo's graphs (it recompiles once after the first length), each compiled once by fuse
    assert not symbolic["per_shape"] and not symbolic["not_symbolic"] and symbolic["fuse_graphs"] == 2
    text = dynamic_study.table(results)
    assert "| fuse-symbolic |" in text and "first calls total s" in text
    assert "fuse-symbolic's step over fuse-static's" in text
    for r in results:
        for row in r["rows"]:
            assert row["host_ms"] > 0 and row["gpu_ms"] is None and len(row["step_ms_rounds"]) == 1


@pytest.mark.full  # a study's, 45 s on 2 cores: pytest --full
def test_the_interleaved_study_times_every_variant_in_turn_in_one_process() -> None:
    result = dynamic_study._interleaved(["fuse-static", "fuse-symbolic"], "gpt2", "tiny", [11], 2, rounds=1)
    assert [(r["variant"], r["seq"]) for r in result["rows"]] == [("fuse-static", 11), ("fuse-symbolic", 11)]
    assert all(r["paired"] == 1.0 for r in result["rows"] if r["variant"] == "fuse-static")
    assert max(result["errors"].values()) < 1e-5 and result["eager_graphs"] == 0 and not result["not_symbolic"]
    assert result["fuse_compiles"] == {"fuse-static": 1, "fuse-symbolic": 1}
    assert "| fuse-symbolic | 11 |" in dynamic_study.interleaved_table(result)


def test_the_dynamic_zoo_compiles_once_for_three_lengths(tmp_path) -> None:
    import json

    from benchmarks import dynamic_zoo

    dynamic_zoo.main(["--models", "gpt2", "--size", "tiny", "--out", str(tmp_path)])
    (line,) = (tmp_path / "dynamic_zoo.jsonl").read_text().splitlines()
    result = json.loads(line)
    assert result["sizes"] == [16, 13, 8] and max(result["errors"]) < 1e-5
    assert result["compiles"] == 1 and not result["not_symbolic"] and result["eager_graphs"] == 0
