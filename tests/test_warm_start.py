"""Warm starts as users meet them: the same work run twice, in two processes, over the same cache
folders (fuse's, Inductor's with AOTAutograd's entries, Triton's).

Every graph that compiles in the first process must compile or load in the second: no graph run
eagerly where the first ran none, the same answers, and every graph the first stored taken from
fuse's cache (none compiled again).

- The OpInfo sweep (``python -m benchmarks.opinfo --warm``) on a sample: ops whose graphs hold an
  effectful call (linalg's error checks, ordered by AOTAutograd's effect tokens, which ran eagerly
  warm until the tokens were made inside the graph), and ops real models use (``SAMPLE_OPS`` by
  default, ``OPS`` with ``pytest --full``). Every op: ``python -m benchmarks.opinfo --warm`` (about
  twice the sweep's time).
- With ``pytest --full``, the tiny zoo (``python -m benchmarks.zoo --tiny --cache-dir DIR``) on
  GPT-2, inference and a training step (37 s of the default run on 2 cores for the training step
  alone). By default a second process loads a training step's and an inference call's graphs in
  ``tests/test_cache.py``, and the zoo's ResNet in ``tests/test_compile_time.py``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks.opinfo import run_warm, warm_regressions

_ROOT = pathlib.Path(__file__).resolve().parent.parent

# linalg ops whose graphs hold an error check (with_effects), and a few of the ops models use:
# elementwise, reductions, norms in training mode (an input mutated), indexing, a scan
OPS = ("linalg.inv", "linalg.cholesky", "linalg.solve", "linalg.lu_factor", "linalg.ldl_factor",
       "linalg.tensorinv", "linalg.tensorsolve", "add", "softmax", "nn.functional.batch_norm",
       "nn.functional.layer_norm", "argmax", "sum", "index_put", "cumsum", "nn.functional.embedding")
# the default run's (the two processes over OPS took 35 s on 2 cores): two of the linalg checks,
# an elementwise op, a norm in training mode (an input mutated) and indexing
SAMPLE_OPS = ("linalg.inv", "linalg.cholesky", "add", "nn.functional.batch_norm", "index_put")


def test_the_opinfo_sample_compiles_warm_as_it_does_cold(tmp_path: pathlib.Path,
                                                         request: pytest.FixtureRequest) -> None:
    ops = OPS if request.config.getoption("--full") else SAMPLE_OPS
    cold, warm, regressions = run_warm(["--ops", ",".join(ops)], str(tmp_path / "caches"))
    assert regressions == [], "\n".join(regressions)
    assert cold["figures"]["eager_graph"] == 0 and warm["figures"]["eager_graph"] == 0
    assert [r["status"] for r in warm["ops"]] == ["match"] * len(ops), [(r["name"], r["status"]) for r in warm["ops"]]
    # the first process stored what the second loads: no graph compiled twice
    assert sum(r["cache_misses"] for r in cold["ops"]) == sum(r["graphs"] for r in cold["ops"]) > len(ops)
    assert sum(r["cache_misses"] for r in warm["ops"]) == 0
    assert sum(r["cache_hits"] for r in warm["ops"]) == sum(r["graphs"] for r in warm["ops"])


def _op(name: str, eager_graphs: int = 0, status: str = "match", hits: int = 0, misses: int = 1) -> dict:
    return {"name": name, "eager_graphs": eager_graphs, "status": status, "cache_hits": hits,
            "cache_misses": misses, "warnings": ["fusebackend: compiling graph failed"], "problems": []}


def test_warm_regressions_names_what_got_worse() -> None:
    cold = [_op("a"), _op("b"), _op("c"), _op("d", eager_graphs=1, status="mismatch")]
    warm = [_op("a", hits=1, misses=0), _op("b", eager_graphs=2, hits=1, misses=0), _op("c"),
            _op("d", eager_graphs=1, status="mismatch")]
    lines = warm_regressions(cold, warm)
    assert lines == ["b: 2 graph(s) ran eagerly (fusebackend: compiling graph failed)",
                     "c: 1 graph(s) compiled again, 0 loaded"]
    assert warm_regressions(cold, [_op("a", status="error", hits=1, misses=0)]) == ["a: match cold, error warm ()"]


@pytest.mark.slow
@pytest.mark.full
def test_the_tiny_zoo_loads_every_graph_warm(tmp_path: pathlib.Path) -> None:
    caches = tmp_path / "caches"
    runs = []
    for which in ("cold", "warm"):
        out = tmp_path / which
        done = subprocess.run([sys.executable, "-m", "benchmarks.zoo", "--tiny", "--models", "gpt2", "--mode", "both",
                               "--no-timing", "--cache-dir", str(caches), "--out", str(out)],
                              cwd=_ROOT, capture_output=True, text=True, env=dict(os.environ), timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs.append(json.loads((out / "zoo_tiny.json").read_text())["rows"])
    assert [row["mode"] for row in runs[0]] == ["inference", "train"]
    for cold_row, warm_row in zip(*runs):
        assert (cold_row["model"], cold_row["mode"]) == (warm_row["model"], warm_row["mode"])
        cold, warm = ({v["variant"]: v for v in row["variants"]}["fuse"] for row in (cold_row, warm_row))
        assert cold["status"] == warm["status"] == "ok", (cold, warm)
        assert cold["eager_graphs"] == warm["eager_graphs"] == 0
        assert cold["cache_hits"] == 0 and cold["cache_misses"] == cold["graphs"] > 0, cold
        assert warm["cache_misses"] == 0 and warm["cache_hits"] == warm["graphs"] == cold["graphs"], warm
        assert warm["aot_cache_hits"] >= 1, warm
        assert warm["error"] <= 1e-5, warm
