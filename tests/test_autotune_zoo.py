"""``benchmarks/studies/autotune_zoo.py``'s table: tuned over untuned per process, the slower mark only
where tuned is slower in every process, and each variant's geometric mean over eager."""

from __future__ import annotations

import json
import os
from typing import Any

from benchmarks.studies import autotune_zoo


def _write(folder: str, times: dict[str, tuple[float, float, float]]) -> None:
    os.makedirs(folder)
    rows = [{"model": m, "variants": [{"variant": v, "status": "ref" if v == "eager" else "ok", "gpu_ms": t}
                                      for v, t in zip(("eager", "fuse", autotune_zoo.TUNED), ts)]}
            for m, ts in times.items()]
    with open(os.path.join(folder, "zoo_inference.json"), "w") as f:
        json.dump({"rows": rows}, f)


def test_the_table_marks_a_model_slower_only_in_every_process(tmp_path: Any) -> None:
    _write(str(tmp_path / "p1"), {"gpt2": (4.0, 2.0, 2.1), "bert": (4.0, 2.0, 2.1), "resnet": (8.0, 4.0, 2.0)})
    _write(str(tmp_path / "p2"), {"gpt2": (4.0, 2.0, 2.1), "bert": (4.0, 2.0, 1.9), "resnet": (8.0, 4.0, 2.0)})
    text = autotune_zoo.table(str(tmp_path))
    assert text.splitlines()[-1].endswith(": gpt2")  # bert is faster tuned in one process
    assert "| resnet | 8.000-8.000 | 4.000-4.000 | 2.000-2.000 | 0.500 0.500 |  |" in text
    geo = (2 * 2 * 2) ** (1 / 3), (4 / 2.1 * 4 / 2.1 * 4) ** (1 / 3)
    assert f"process 1: geomean speedup over eager by GPU ms over 3 models: fuse {geo[0]:.3f}x, tuned {geo[1]:.3f}x" in text
