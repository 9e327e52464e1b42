"""Test set-up: each test starts clean, with cache folders of its own (fuse's compiled graphs and
kernel modules, and Inductor's folder, where AOTAutograd's cache is), so that no test loads what
another compiled; ``tests/test_cache.py`` tests the caches."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("FUSE_CACHE_DIR", os.path.join(tempfile.gettempdir(), "fusebackend-test-cache"))

import torch  # noqa: E402

import fusebackend  # noqa: E402

# Where the package is on the path but not installed (no entry point), register the name directly.
try:
    torch._dynamo.lookup_backend("fuse")
except Exception:
    torch._dynamo.register_backend(name="fuse")(fusebackend.fuse)

# FUSE_TEST_DEVICE=cuda runs the suite on a GPU: tests make their tensors without a device.
if os.environ.get("FUSE_TEST_DEVICE", "cpu") != "cpu":
    torch.set_default_device(os.environ["FUSE_TEST_DEVICE"])


@pytest.fixture(autouse=True)
def _fresh_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    torch._dynamo.reset()
    fusebackend.metrics.reset()
    fusebackend.dump.clear()
    torch.manual_seed(0)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor-cache")))
    with fusebackend.config.patch(cache_dir=str(tmp_path_factory.mktemp("fuse-cache"))):
        yield


def pytest_addoption(parser: pytest.Parser) -> None:
    # test_zoo.py runs the first zoo models and a fixed sample of the others by default; --zoo=all runs every one.
    parser.addoption("--zoo", choices=("sample", "all"), default="sample",
                     help="zoo models for tests/test_zoo.py: the default set (DEFAULT_MODELS there) or all")
    parser.addoption("--zoo-train", choices=("all", "core"), default="all",
                     help="tests/test_zoo.py: train every zoo model (all, the default) or only TRAIN_SET (core)")
    # test_opinfo.py runs a fixed sample of op_db by default; --opinfo=all runs every op.
    parser.addoption("--opinfo", choices=("sample", "all"), default="sample",
                     help="OpInfo ops for tests/test_opinfo.py: a fixed sample (default) or all")
