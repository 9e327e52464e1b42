"""The on-disk cache of compiled graphs (``fusebackend/cache.py``).

A second process loads what the first compiled, without lowering, scheduling or generating
anything; a truncated or changed entry is reported once and compiled again; two processes
compiling at once both succeed; any change of an option misses; a cache folder that cannot be
written costs one warning and compiles anyway; ``python -m fusebackend.cache`` shows and clears.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import pytest
import torch

import fusebackend
from fusebackend import cache
from tests.helpers import assert_same

# A training step and an inference call of a small model: a forward, a backward and an inference
# graph. The child checks its results against eager and prints what the metrics say.
CHILD = """
import json, sys
import torch
import fusebackend

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.LayerNorm(24), torch.nn.GELU(),
                            torch.nn.Linear(24, 5), torch.nn.Softmax(dim=-1))
x = torch.randn(7, 12)
compiled = torch.compile(model, backend="fuse")
out = compiled(x)
out.pow(2).sum().backward()
grads = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
model(x).pow(2).sum().backward()
for got, want in zip(grads, [p.grad for p in model.parameters()]):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
with torch.no_grad():
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
m = fusebackend.metrics
print(json.dumps({"hits": m.cache_hits, "misses": m.cache_misses, "aot_hits": m.aot_cache_hits,
                  "graphs": m.graphs_compiled,
                  "kernels": m.kernels_generated, "eager": m.eager_graphs, "stages": sorted(m.stage_seconds),
                  "warm": sorted(m.warm_stage_seconds), "fallbacks": dict(m.fallbacks)}))
"""


def _child(cache_dir: Any, cwd: Any, **env_vars: str) -> subprocess.Popen:
    """A process running CHILD with fuse's cache in ``cache_dir`` and Inductor's (AOTAutograd's
    cache) beside it."""
    env = dict(os.environ, FUSE_CACHE_DIR=str(cache_dir), TORCHINDUCTOR_CACHE_DIR=f"{cache_dir}-inductor", **env_vars)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD)], env=env, cwd=str(cwd),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    return json.loads(out.strip().splitlines()[-1])


# Appended to CHILD in the first process: its portable artifacts, written to the file it is given.
SAVE = """
data, info = torch.compiler.save_cache_artifacts()
open(sys.argv[1], "wb").write(data)
"""


@pytest.fixture(scope="module")
def first_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    """CHILD in a first process over empty cache folders (``ROOT/cache``, ``ROOT/cache-inductor``),
    its portable artifacts saved to ``ROOT/artifacts.bin``: its metrics and ROOT. The second
    process of each test below starts from it (one cold compile for both: about 15 s on 2 cores)."""
    root = tmp_path_factory.mktemp("first-process")
    env = dict(os.environ, FUSE_CACHE_DIR=str(root / "cache"), TORCHINDUCTOR_CACHE_DIR=str(root / "cache-inductor"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD) + textwrap.dedent(SAVE),
                           str(root / "artifacts.bin")], env=env, cwd=str(root), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), root


def test_a_second_process_loads_every_graph_without_compiling(first_process: tuple[dict[str, Any], Any],
                                                              tmp_path: Any) -> None:
    first, root = first_process
    assert first["hits"] == 0 and first["misses"] == first["graphs"] == 3 and first["eager"] == 0
    assert first["aot_hits"] == 0
    assert {"lower", "schedule", "codegen", "store"} <= set(first["stages"])
    second = _result(_child(root / "cache", tmp_path))
    assert second["hits"] == second["graphs"] == 3 and second["misses"] == 0 and second["eager"] == 0
    # AOTAutograd traced neither Dynamo graph (the training step's, the inference call's) again
    assert second["aot_hits"] == 2
    assert not {"lower", "verify", "schedule", "codegen", "store"} & set(second["stages"]), second["stages"]
    assert {"cache", "load"} <= set(second["warm"])
    # the same kernels, and the ATen calls (the matrix products) counted as when compiled
    assert second["kernels"] == first["kernels"] and second["fallbacks"] == first["fallbacks"] != {}


def test_two_processes_compiling_at_once_both_succeed(tmp_path: Any) -> None:
    procs = [_child(tmp_path / "cache", tmp_path) for _ in range(2)]
    results = [_result(p) for p in procs]  # each checked its results against eager
    assert all(r["graphs"] == 3 and r["eager"] == 0 for r in results)
    entries = glob.glob(str(tmp_path / "cache" / "graphs" / f"*{cache.SUFFIX}"))
    assert len(entries) == 3
    assert not glob.glob(str(tmp_path / "cache" / "graphs" / "*.tmp"))
    for path in entries:  # whole entries, whichever process wrote last
        with open(path, "rb") as f:
            assert isinstance(cache.decode(f.read()), cache.Entry)


def _fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.relu(x @ w) * 3.0, dim=-1) + x.sum(-1, keepdim=True)


def _compile_and_check(x: torch.Tensor, w: torch.Tensor) -> None:
    torch._dynamo.reset()
    assert_same(torch.compile(_fn, backend="fuse", fullgraph=True)(x, w), _fn(x, w))


def _entries() -> list[str]:
    return glob.glob(os.path.join(fusebackend.config.cache_dir, "graphs", f"*{cache.SUFFIX}"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_entry_is_reported_once_and_compiled_again(damage: str) -> None:
    x, w = torch.randn(9, 6), torch.randn(6, 11)
    _compile_and_check(x, w)
    (path,) = _entries()
    with open(path, "rb") as f:
        data = f.read()
    damaged = {"truncate": data[: len(data) // 2], "flip": data[:-1] + bytes([data[-1] ^ 1]), "empty": b"",
               "garbage": b"\x00" * len(data)}[damage]
    with open(path, "wb") as f:
        f.write(damaged)
    m = fusebackend.metrics
    m.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compile_and_check(x, w)
        _compile_and_check(x, w)  # the entry written again: loaded, with no second warning
    reports = [str(c.message) for c in caught if "cache entry" in str(c.message)]
    assert len(reports) == 1 and "unreadable" in reports[0] and path in reports[0], reports
    assert (m.cache_misses, m.cache_hits, m.eager_graphs) == (1, 1, 0)
    with open(path, "rb") as f:
        assert isinstance(cache.decode(f.read()), cache.Entry)


def test_every_change_that_matters_misses_and_the_graph_name_does_not() -> None:
    x, w = torch.randn(9, 6), torch.randn(6, 11)
    m = fusebackend.metrics
    _compile_and_check(x, w)
    assert (m.cache_misses, m.cache_hits) == (1, 0)
    _compile_and_check(x, w)  # Dynamo reset: a new graph name, the same graph
    assert (m.cache_misses, m.cache_hits, m.aot_cache_hits) == (1, 1, 1)
    with fusebackend.config.patch(max_fusion_size=2):  # an option: AOTAutograd's cache misses too
        _compile_and_check(x, w)
    assert (m.cache_misses, m.cache_hits, m.aot_cache_hits) == (2, 1, 1)
    with fusebackend.config.patch(fusion=False):
        _compile_and_check(x, w)
    assert (m.cache_misses, m.cache_hits) == (3, 1)
    _compile_and_check(x.t().contiguous().t(), w)  # strides
    _compile_and_check(x[:, :5], w[:5])  # sizes
    _compile_and_check(x.double(), w.double())  # dtypes
    assert (m.cache_misses, m.cache_hits) == (6, 1)
    assert len(_entries()) == 6
    with fusebackend.config.patch(dump_dir="", compile_threads=1):  # where files go, how compiled: the same
        _compile_and_check(x, w)
    assert (m.cache_misses, m.cache_hits, m.aot_cache_hits) == (6, 2, 2)


def test_the_key_covers_the_graph_and_its_constants() -> None:
    def traced(scale: float) -> torch.fx.GraphModule:
        return torch.fx.symbolic_trace(lambda a: a * scale + 1)

    args = [torch.randn(4, 3)]
    assert cache.graph_key(traced(2.0), args, None) == cache.graph_key(traced(2.0), args, None)
    assert cache.graph_key(traced(2.0), args, None) != cache.graph_key(traced(3.0), args, None)
    assert cache.graph_key(traced(2.0), args, None) != cache.graph_key(traced(2.0), args, 1)

    class Holds(torch.nn.Module):
        def __init__(self, value: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("c", value)

        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return a + self.c

    for scalar in (torch.tensor(2.0, dtype=torch.bfloat16), torch.tensor(3)):  # 0-dim constants key too
        keyed = cache.graph_key(torch.fx.symbolic_trace(Holds(scalar)), args, None)
        assert keyed == cache.graph_key(torch.fx.symbolic_trace(Holds(scalar.clone())), args, None)
        assert keyed != cache.graph_key(torch.fx.symbolic_trace(Holds(scalar + 1)), args, None)
    c = torch.randn(3)
    same = cache.graph_key(torch.fx.symbolic_trace(Holds(c.clone())), args, None)
    assert same == cache.graph_key(torch.fx.symbolic_trace(Holds(c.clone())), args, None)
    assert same != cache.graph_key(torch.fx.symbolic_trace(Holds(c + 1)), args, None)


def test_a_cache_folder_that_cannot_be_written_costs_one_warning(tmp_path: Any) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    x, w = torch.randn(9, 6), torch.randn(6, 11)
    m = fusebackend.metrics
    with fusebackend.config.patch(cache_dir=str(blocker / "cache")), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compile_and_check(x, w)
        _compile_and_check(x.double(), w.double())
        _compile_and_check(x, w)
    reports = [str(c.message) for c in caught if "cannot be written" in str(c.message)]
    assert len(reports) == 1 and str(blocker / "cache") in reports[0], [str(c.message) for c in caught]
    assert (m.cache_hits, m.eager_graphs, m.graphs_compiled) == (0, 0, 3)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes read-only folders")
def test_a_read_only_cache_folder_still_compiles(tmp_path: Any) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    os.chmod(root, 0o555)
    try:
        x, w = torch.randn(9, 6), torch.randn(6, 11)
        with fusebackend.config.patch(cache_dir=str(root)), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _compile_and_check(x, w)
        assert sum("cannot be written" in str(c.message) for c in caught) == 1
    finally:
        os.chmod(root, 0o755)


def test_the_cache_command_shows_and_clears(tmp_path: Any) -> None:
    x, w = torch.randn(9, 6), torch.randn(6, 11)
    _compile_and_check(x, w)
    where = fusebackend.config.cache_dir
    run = [sys.executable, "-m", "fusebackend.cache", "--dir", where]
    shown = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert shown.returncode == 0 and not shown.stderr, shown.stderr
    assert "compiled graphs: 1 " in shown.stdout and "inference_" in shown.stdout and " kernels, " in shown.stdout
    cleared = subprocess.run(run + ["--clear"], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert cleared.returncode == 0, cleared.stderr
    assert "compiled graphs: 0 " in cleared.stdout and "kernel and wrapper modules: 0 " in cleared.stdout
    assert not _entries()
    m = fusebackend.metrics
    m.reset()
    _compile_and_check(x, w)  # compiled again, from nothing
    assert (m.cache_misses, m.cache_hits) == (1, 0)


def test_the_cache_can_be_turned_off() -> None:
    x, w = torch.randn(9, 6), torch.randn(6, 11)
    m = fusebackend.metrics
    with fusebackend.config.patch(graph_cache=False):
        _compile_and_check(x, w)
        _compile_and_check(x, w)
    assert (m.cache_hits, m.cache_misses, m.graphs_compiled) == (0, 0, 2) and not _entries()
    assert m.aot_cache_hits == 0  # and AOTAutograd's cache was not written
    assert not os.path.isdir(_aot_folder()) or not os.listdir(_aot_folder())


def _aot_folder() -> str:
    return os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "aotautograd")


def test_a_graph_from_aotautograds_cache_without_fuses_entry_is_compiled_from_its_saved_graph() -> None:
    x, w = torch.randn(9, 6), torch.randn(6, 11)
    m = fusebackend.metrics
    _compile_and_check(x, w)
    assert os.listdir(_aot_folder())  # AOTAutograd's entry, in Inductor's folder
    for path in _entries():
        os.remove(path)
    _compile_and_check(x, w)  # checked against eager
    assert (m.aot_cache_hits, m.cache_misses, m.cache_hits, m.eager_graphs) == (1, 2, 0, 0)
    _compile_and_check(x, w)  # both caches hit; the graph itself is never unpickled
    assert (m.aot_cache_hits, m.cache_misses, m.cache_hits) == (2, 2, 1)


def test_a_graph_from_aotautograds_cache_that_fuse_cannot_compile_runs_eagerly(monkeypatch: Any) -> None:
    from fusebackend import backend

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 6)

    def grads(call: Any) -> list[torch.Tensor]:
        model.zero_grad()
        call(x).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    want = grads(model)
    grads(torch.compile(model, backend="fuse"))  # both caches filled
    for path in _entries():
        os.remove(path)
    compile_graph = backend.compile_graph

    def no_backward(gm: Any, args: Any, name: str, *rest: Any) -> Any:
        if name.startswith("backward"):
            raise RuntimeError("no kernel for this")
        return compile_graph(gm, args, name, *rest)

    monkeypatch.setattr(backend, "compile_graph", no_backward)
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="running this graph's ATen ops eagerly"):
        got = grads(torch.compile(model, backend="fuse"))
    m = fusebackend.metrics
    assert (m.aot_cache_hits, m.eager_graphs) == (1, 1)  # the backward graph, unpickled, ran op by op
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def _with_constants(x: torch.Tensor) -> torch.Tensor:
    # tensors made in the function: the ATen graph reads them as constants (get_attr)
    return torch.relu(x * torch.tensor(3.0) + torch.tensor([1.0, -2.0, 0.5, 4.0, -1.0])).sum(0)


def test_a_saved_graph_keeps_its_constant_tensors() -> None:
    x = torch.randn(6, 5)
    m = fusebackend.metrics
    for _ in range(2):
        torch._dynamo.reset()
        assert_same(torch.compile(_with_constants, backend="fuse", fullgraph=True)(x), _with_constants(x))
        for path in _entries():  # fuse's entry gone: the second compile unpickles AOTAutograd's graph
            os.remove(path)
    assert (m.aot_cache_hits, m.cache_misses, m.eager_graphs) == (1, 2, 0)


def test_aotautograds_key_carries_fuses_versions_options_and_mode() -> None:
    from fusebackend import aot_cache
    from fusebackend.modes import Mode

    def tag(mode: Mode = Mode()) -> str:
        with aot_cache.enabled(mode):
            return torch.compiler.config.cache_key_tag

    plain = tag()
    assert plain.startswith("fusebackend ") and plain == tag()
    with fusebackend.config.patch(fusion=False):
        assert tag() != plain
    assert tag(Mode(cudagraphs=True)) == plain + " cudagraphs"
    assert tag(Mode(autotune=True)) == plain + " autotune"
    with torch.compiler.config.patch(cache_key_tag="user"):  # a user's own tag is kept
        assert tag() == f"user {plain}"
    assert torch.compiler.config.cache_key_tag == ""


# The portable artifacts: the child saves them after its compile (SAVE), or loads them into its
# empty folders before it compiles (LOAD); fusebackend is imported first, so that PyTorch knows
# fuse's artifact type when it unpacks them.
PORTABLE = """
import os, sys
import torch
import fusebackend
if os.environ.get("LOAD"):
    with open(os.environ["LOAD"], "rb") as f:
        info = torch.compiler.load_cache_artifacts(f.read())
    print("loaded", len(info.artifacts.get("fusebackend", [])), len(info.artifacts.get("aot_autograd", [])))
"""


def test_a_fresh_process_loaded_with_the_portable_artifacts_lowers_no_graph(first_process: tuple[dict[str, Any], Any],
                                                                           tmp_path: Any) -> None:
    first, root = first_process
    saved = root / "artifacts.bin"
    assert first["misses"] == first["graphs"] == 3 and saved.stat().st_size > 0
    # a fresh machine: other, empty folders; the artifacts loaded before anything is compiled
    env = dict(os.environ, FUSE_CACHE_DIR=str(tmp_path / "fresh"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "fresh-inductor"),
               LOAD=str(saved))
    load = textwrap.dedent(PORTABLE) + textwrap.dedent(CHILD)
    done = subprocess.run([sys.executable, "-c", load], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "loaded 3 2", lines  # fuse's three graphs, AOTAutograd's two Dynamo graphs
    second = json.loads(lines[-1])
    assert second["hits"] == second["graphs"] == 3 and second["misses"] == 0 and second["eager"] == 0, second
    assert second["aot_hits"] == 2
    assert not {"lower", "schedule", "codegen"} & set(second["stages"]), second["stages"]


def test_an_optimizer_step_unpickled_from_aotautograds_cache_steps_as_eager() -> None:
    # a step over long lists: its saved graph pickles each list item and each input's copy_ as
    # the list's and the input's traced value (aot_cache._share_values); unpickled and compiled
    # (fuse's entry gone), the step is eager's
    from fusebackend import aot_cache, foreach

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3 + i % 4, 5)) for i in range(foreach.MAX_TENSORS + 2)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, twin_opt = torch.optim.AdamW(params, foreach=True), torch.optim.AdamW(twins, foreach=True)
    shared: list[int] = []
    share_values = aot_cache._share_values

    def counted(gm: Any) -> Any:
        replaced = share_values(gm)
        shared.append(len(replaced))
        return replaced

    m = fusebackend.metrics
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aot_cache, "_share_values", counted)
        for _ in range(2):
            torch._dynamo.reset()
            step = torch.compile(opt.step, backend="fuse")
            for _ in range(2):
                for p, q in zip(params, twins):
                    p.grad = torch.randn_like(p)
                    q.grad = p.grad.clone()
                step()
                twin_opt.step()
            for path in _entries():  # the second round unpickles AOTAutograd's graphs
                os.remove(path)
    for got, want in zip(params, twins):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert m.aot_cache_hits >= 1 and m.eager_graphs == 0
    # the steady step's graph: its items of every list and its copies into the inputs
    assert max(shared) >= 3 * len(params)


def test_every_shape_of_a_graph_the_lowering_rewrites_loads_warm() -> None:
    # the lowering rewrites a graph in place (here foreach calls whose results are copied back
    # into the inputs, made in place on them: foreach.in_place_chains); each shape's key names
    # the graph as AOTAutograd saved it (FusedGraph.graph_digest), so that a second compile,
    # handed the saved graph's digest, finds the entries of both shapes
    from fusebackend import foreach

    def update(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
        torch._foreach_mul_(xs, 0.5)
        torch._foreach_add_(xs, ys)

    count = foreach.MAX_TENSORS + 2  # foreach calls kept whole
    m = fusebackend.metrics
    with fusebackend.config.patch(symbolic="off"):  # one compile a shape, in one graph
        for _ in range(2):
            torch._dynamo.reset()
            compiled = torch.compile(update, backend="fuse", dynamic=True)
            for length in (5, 7):
                xs, ys = [torch.randn(length, 3) for _ in range(count)], [torch.randn(length, 3) for _ in range(count)]
                want = [x * 0.5 + y for x, y in zip(xs, ys)]
                compiled(xs, ys)
                for got, expected in zip(xs, want):
                    assert_same(got, expected)
    assert m.aot_cache_hits == 1 and m.eager_graphs == 0
    assert (m.cache_misses, m.cache_hits) == (2, 2)
