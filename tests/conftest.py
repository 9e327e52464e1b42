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


@pytest.fixture(scope="session", autouse=True)
def _no_guard_latency_profile():
    # Dynamo times the guards of each frame it compiles, once, after flushing the CPU's caches
    # (torch/_dynamo/guards.py, profile_guard_manager: 24 ms a frame on 2 cores, a fifth of a
    # small function's whole compile here), for a logged metric only (guard_latency_us). The
    # suite compiles thousands of frames and reads no guard latency: none is measured.
    from torch._dynamo import guards

    profile = getattr(guards, "profile_guard_manager", None)
    if profile is None:
        yield
        return
    guards.profile_guard_manager = lambda *args: 0.0
    try:
        yield
    finally:
        guards.profile_guard_manager = profile


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
    # The default run keeps to about 15 minutes on 2 cores: the long matrices run a fixed sample
    # of their cases (the others are marked ``full``), the zoo and op_db a fixed sample of their
    # models and ops. --full runs everything.
    parser.addoption("--full", action="store_true", default=False,
                     help="run every case: the cases of sampled matrices (marked full, deselected by default), "
                          "every zoo model and training step (as --zoo=all --zoo-train=all) and every OpInfo op "
                          "(as --opinfo=all)")
    # test_zoo.py runs the first zoo models and a fixed sample of the others by default; --zoo=all runs every one.
    parser.addoption("--zoo", choices=("sample", "all"), default="sample",
                     help="zoo models for tests/test_zoo.py: the default set (DEFAULT_MODELS there) or all")
    parser.addoption("--zoo-train", choices=("sample", "all", "core"), default=None,
                     help="tests/test_zoo.py: train the models of TRAIN_SAMPLE there (sample; the default with "
                          "--zoo=sample), every zoo model tested (all; the default with --zoo=all or --full), or "
                          "only TRAIN_SET (core)")
    # test_opinfo.py runs a fixed sample of op_db by default; --opinfo=all runs every op.
    parser.addoption("--opinfo", choices=("sample", "all"), default="sample",
                     help="OpInfo ops for tests/test_opinfo.py: a fixed sample (default) or all")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "full: a case of a sampled matrix, left out of the default run; "
                                       "pytest --full runs it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the cases marked full leave the default run as deselected (the summary counts them)
    if config.getoption("--full"):
        return
    kept = [item for item in items if item.get_closest_marker("full") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("full") is not None])
        items[:] = kept
