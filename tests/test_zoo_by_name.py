"""Models outside the zoo by their library's name (``benchmarks/zoo/by_name.py``), and the GPU's
turns when zoo processes share one (``parallel.gpu_turn``).

timm and torchvision do not load on the CPU machines beside torch 2.13, so a stand-in ``timm``
module is put in their place: what is checked is what the zoo does with a named model (its
library, its image size from the model's own configuration, its loss), and that the runner takes
the name."""

from __future__ import annotations

import fcntl
import sys
import types

import pytest
import torch
import torch.nn as nn

from benchmarks.zoo import by_name, parallel, registry, run
from benchmarks.zoo.spec import Unavailable


class _Net(nn.Module):
    def __init__(self, num_classes: int, drop_rate: float, drop_path_rate: float = 0.0) -> None:
        super().__init__()
        self.asked = dict(drop_rate=drop_rate, drop_path_rate=drop_path_rate)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, num_classes)
        self.pretrained_cfg = {"input_size": (3, 20, 24)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean((2, 3)))


@pytest.fixture
def fake_timm(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    module = types.ModuleType("timm")

    def create_model(name: str, pretrained: bool, **options) -> nn.Module:
        assert not pretrained
        made.append(name)
        return _Net(**options)

    module.create_model = create_model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "timm", module)
    return made


def test_a_timm_model_by_name_is_built_at_its_own_image_size(fake_timm: list[str]) -> None:
    entry = registry.entry("timm:some_net")
    assert entry.library == "timm" and entry.available() is None
    built = entry.build("real", "cpu", torch.float32)
    assert fake_timm == ["some_net"]
    assert built.model.asked == {"drop_rate": 0.0, "drop_path_rate": 0.0}
    assert built.inputs["x"].shape == (by_name.BATCH, 3, 20, 24) and built.shapes == f"b{by_name.BATCH} 3x20x24"
    assert built.inputs["x"].std() > 0.5  # random images, not zeros
    logits = built.model(**built.inputs)
    assert logits.shape == (by_name.BATCH, by_name.CLASSES)
    loss = built.loss(logits)
    assert loss.dim() == 0 and torch.isfinite(loss)
    with pytest.raises(Unavailable, match="no tiny configuration"):
        entry.build("tiny", "cpu", torch.float32)


def test_the_runner_takes_models_by_name_and_refuses_other_unknown_names() -> None:
    assert run.select("timm:a,tv:b", "both") == [("timm:a", "inference"), ("tv:b", "inference")]
    assert run.select("tv:b", "train") == [("tv:b", "train")]
    assert registry.entry("tv:vgg16").library == "torchvision"
    for name in ("no_such_model", "timm:", "hf:bert"):
        with pytest.raises(SystemExit, match="unknown model"):
            run.select(name, "inference")
        with pytest.raises(KeyError):
            registry.entry(name)


def test_a_gpu_turn_is_held_alone_where_the_gpu_is_shared(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gpu0.turn"
    monkeypatch.setenv(parallel.TURN, str(path))
    with parallel.gpu_turn():
        with open(path, "a") as other:  # another process's try: the lock is taken
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(path, "a") as other:  # given back
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(other, fcntl.LOCK_UN)
    path.unlink()
    monkeypatch.delenv(parallel.TURN)
    with parallel.gpu_turn():  # not shared: no lock file is made or held
        assert not path.exists()
