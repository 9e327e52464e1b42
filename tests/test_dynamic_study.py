"""``benchmarks.dynamic_study`` on the CPU (the tiny GPT-2, two lengths): each variant runs in a
process of its own, matches eager, and fuse's compile counts are what the variant names."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the zoo needs transformers: pip install -e '.[zoo]'")

from benchmarks import dynamic_study  # noqa: E402


def test_the_study_compiles_once_for_all_lengths_where_asked(tmp_path) -> None:
    results = dynamic_study.run(["fuse-static", "fuse-symbolic"], "gpt2", "tiny", [16, 11, 7], 2, str(tmp_path))
    static, symbolic = results
    for r in results:
        assert [row["seq"] for row in r["rows"]] == [16, 11, 7]
        assert max(row["error"] for row in r["rows"]) < 1e-5 and r["eager_graphs"] == 0
    assert static["fuse_graphs"] == 3 and not static["not_symbolic"]  # a static graph per length
    # Dynamo's graphs (it recompiles once after the first length), each compiled once by fuse
    assert not symbolic["per_shape"] and not symbolic["not_symbolic"] and symbolic["fuse_graphs"] == 2
    text = dynamic_study.table(results)
    assert "| fuse-symbolic |" in text and "first calls total s" in text
