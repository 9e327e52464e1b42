"""The backend's edges: ATen fallbacks, graphs that fail and run eagerly, the entry point in a
fresh process, dumps, metrics and recompilation for new shapes.

Failures are simulated by monkeypatching ``fusebackend.backend.compile_graph`` (the name the
backend calls); no product code carries a test hook.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any, Callable

import pytest
import torch

import fusebackend
import fusebackend.backend
from helpers import assert_same, check, compile_fn, kernel_count, kernels


def fuse_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if "fusebackend" in str(w.message)]


def run_recording(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
    """Compile and call ``fn`` twice; return the first output and the fusebackend warnings."""
    compiled = torch.compile(fn, backend="fuse")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = compiled(*args)
        again = compiled(*args)
    assert_same(again, out)
    return out, fuse_warnings(record)


# ------------------------------------------------------------------------------ ATen fallbacks

FALLBACKS = {
    "sort": lambda x: torch.sort(x * 2, dim=-1).values + 1,
    "kthvalue": lambda x: torch.kthvalue(x + 1, 2, 0).values.sigmoid(),
}


@pytest.mark.parametrize("op", list(FALLBACKS))
def test_op_without_lowering_is_an_aten_call(op: str) -> None:
    check(FALLBACKS[op], torch.randn(6, 7))
    assert fusebackend.metrics.fallbacks[op] == 1
    assert sum(fusebackend.metrics.fallbacks.values()) == 1
    assert kernel_count() == 2  # the pointwise work before and after the extern
    assert f"torch.ops.aten.{op}." in fusebackend.last_compiled().wrapper


def test_fallback_with_several_outputs() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.sort(x.abs(), dim=0, descending=True)
        return values * 2, indices + 1

    check(fn, torch.randn(9, 4))
    assert fusebackend.metrics.fallbacks["sort"] == 1


def test_fallback_counts_by_name() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.sort(torch.kthvalue(x, 2, 1, keepdim=True).values, 0).values + torch.sort(x, 0).values

    check(fn, torch.randn(5, 6))
    assert fusebackend.metrics.fallbacks["sort"] == 2
    assert fusebackend.metrics.fallbacks["kthvalue"] == 1


def test_extern_result_keeps_the_layout_eager_gives() -> None:
    # On meta tensors a convolution of channels-last inputs comes out NCHW; on the CPU and on CUDA
    # it is NHWC. The wrapper must expect ATen's real layout, not copy the result into another.
    x = torch.randn(2, 3, 6, 5).contiguous(memory_format=torch.channels_last)
    w = torch.randn(8, 3, 3, 3).contiguous(memory_format=torch.channels_last)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.nn.functional.conv2d(x, w, padding=1)) * 2

    out = check(fn, x, w)
    eager_strides = torch.nn.functional.conv2d(x, w, padding=1).stride()
    assert out.stride() == eager_strides == (240, 1, 40, 8)
    assert f"(2, 8, 6, 5), {eager_strides})" in fusebackend.last_compiled().wrapper


def test_unused_results_are_not_lowered() -> None:
    # batch norm (eval) decomposes to a tuple whose extra outputs are empty tensors nobody reads;
    # a graph traced without dead-code elimination still keeps them, and they must not become calls
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusebackend import ir, lowering
    from fusebackend.decompositions import decomposition_table

    def fn(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.batch_norm(x, mean, var, training=False) + 1

    args = [torch.randn(4, 3, 5), torch.randn(3), torch.rand(3) + 0.5]
    gm = make_fx(fn, decomposition_table=decomposition_table())(*args)
    assert any(n.target == torch.ops.aten.empty.memory_format for n in gm.graph.nodes)
    graph, _ = lowering.lower(gm, args, "dead_code")
    assert not [n for n in graph.nodes if isinstance(n, ir.Extern)]


# ---------------------------------------------------------------------- graphs run eagerly


def test_compile_failure_runs_eagerly_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("simulated codegen bug")

    monkeypatch.setattr(fusebackend.backend, "compile_graph", broken)
    x = torch.randn(10, 3)
    fn = lambda x: torch.sigmoid(x) * 2 + x  # noqa: E731
    out, messages = run_recording(fn, x)
    assert_same(out, fn(x))
    assert len(messages) == 1, messages
    assert "RuntimeError" in messages[0] and "simulated codegen bug" in messages[0]
    assert fusebackend.metrics.eager_graphs == 1
    assert fusebackend.metrics.graphs_compiled == 0


def _failing_first_run(real: Callable[..., Any]) -> Callable[..., Any]:
    """compile_graph whose result raises when called, after clearing its inputs as wrappers do."""

    def compile_graph(gm: Any, args: Any, name: str, *rest: Any) -> Any:
        compiled = real(gm, args, name, *rest)

        def call(inputs: list[Any]) -> Any:
            inputs.clear()
            raise ValueError("simulated launch failure")

        return dataclasses.replace(compiled, call=call)

    return compile_graph


def test_first_run_failure_runs_eagerly_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fusebackend.backend, "compile_graph", _failing_first_run(fusebackend.backend.compile_graph))
    x, y = torch.randn(7, 5), torch.randn(5)
    fn = lambda x, y: torch.tanh(x + y) - y  # noqa: E731
    out, messages = run_recording(fn, x, y)
    assert_same(out, fn(x, y))
    assert len(messages) == 1, messages
    assert "ValueError" in messages[0] and "simulated launch failure" in messages[0]
    assert fusebackend.metrics.eager_graphs == 1


def test_backward_compile_failure_keeps_forward_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    real = fusebackend.backend.compile_graph

    def only_forward(gm: Any, args: Any, name: str, *rest: Any) -> Any:
        if name.startswith("backward"):
            raise NotImplementedError("no backward today")
        return real(gm, args, name, *rest)

    monkeypatch.setattr(fusebackend.backend, "compile_graph", only_forward)
    x = torch.randn(6, 4, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    fn = lambda x: (torch.sigmoid(x) * x).sum()  # noqa: E731
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loss = torch.compile(fn, backend="fuse")(x)
        loss.backward()
    ref = fn(x_ref)
    ref.backward()
    assert_same(loss.detach(), ref.detach())
    assert_same(x.grad, x_ref.grad)
    messages = fuse_warnings(record)
    assert len(messages) == 1 and "no backward today" in messages[0], messages
    assert fusebackend.metrics.eager_graphs == 1
    assert fusebackend.metrics.graphs_compiled == 1  # the forward


def test_tensors_on_the_wrong_device_run_eagerly() -> None:
    # Kernels asked to run compiled (not interpreted) cannot take CPU tensors: a real compile
    # failure, reported once, and the answer is still eager's. (On CPU whatever the test device.)
    x = torch.randn(20, device="cpu")
    fn = lambda x: x.exp() + 1  # noqa: E731
    with fusebackend.config.patch(interpret=False):
        out, messages = run_recording(fn, x)
    assert_same(out, fn(x))
    assert len(messages) == 1 and "FUSE_INTERPRET" in messages[0], messages
    assert fusebackend.metrics.eager_graphs == 1


# ---------------------------------------------------------------------------- entry point


CHILD = """
import os, sys
import torch

def fn(x, y):
    return torch.nn.functional.gelu(x * y + 1.0).sigmoid()

assert "fusebackend" not in sys.modules
x, y = torch.randn(37, 19), torch.randn(19)
out = torch.compile(fn, backend="fuse", fullgraph=True)(x, y)
torch.testing.assert_close(out, fn(x, y), atol=1e-5, rtol=1e-5)
metrics = sys.modules["fusebackend"].metrics  # loaded by the entry point, not by this script
print("OK", metrics.kernels_generated, metrics.eager_graphs)
"""


def test_fresh_process_uses_entry_point(tmp_path: Any) -> None:
    dump, cache = tmp_path / "dump", tmp_path / "cache"
    env = dict(os.environ, FUSE_DUMP_DIR=str(dump), FUSE_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split()[:3] == ["OK", "1", "0"], proc.stdout
    kernel_files = glob.glob(str(dump / "*" / "kernel_*.py"))
    assert len(kernel_files) == 1, os.listdir(dump) if dump.exists() else "no dump folder"
    assert "@triton.jit" in open(kernel_files[0]).read()
    assert glob.glob(str(cache / "kernels" / "*.py")), "no kernel module in FUSE_CACHE_DIR"


# ---------------------------------------------------------------------------------- dumps


def test_dump_dir_holds_every_stage(tmp_path: Any) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x * 2) @ w).sigmoid()

    with fusebackend.config.patch(dump_dir=str(tmp_path)):
        check(fn, torch.randn(8, 16), torch.randn(16, 4))
    art = fusebackend.last_compiled()
    assert art is not None and art.dump_path is not None
    folders = os.listdir(tmp_path)
    assert folders == [art.name]
    folder = os.path.join(tmp_path, art.name)
    assert os.path.samefile(folder, art.dump_path)
    files = set(os.listdir(folder))
    expected = {"aten_graph.py": art.aten_graph, "ir.txt": art.ir, "ir_fused.txt": art.fused_ir,
                "schedule.txt": art.schedule, "wrapper.py": art.wrapper}
    expected.update({f"kernel_{name}.py": src for name, src in art.kernels.items()})
    assert files == set(expected)
    assert len([f for f in files if f.startswith("kernel_")]) == 2
    for fname, text in expected.items():
        with open(os.path.join(folder, fname)) as f:
            assert f.read() == text, fname
    # The texts are the real stages, not placeholders.
    assert "aten.mm" in art.aten_graph and "extern" in art.ir and "fused_" in art.wrapper
    assert all("@triton.jit" in src for src in art.kernels.values())
    assert art.name in str(art)


def test_no_dump_without_dump_dir(tmp_path: Any) -> None:
    with fusebackend.config.patch(dump_dir=""):
        check(lambda x: x * 2, torch.randn(8))
    assert fusebackend.last_compiled().dump_path is None


def test_history_keeps_every_graph() -> None:
    x = torch.randn(5, 4, requires_grad=True)
    loss = torch.compile(lambda x: (x.exp() * 3).sum(), backend="fuse")(x)
    loss.backward()
    names = [a.name for a in fusebackend.history()]
    assert any(n.startswith("forward") for n in names) and any(n.startswith("backward") for n in names)
    assert fusebackend.last_compiled().name == names[-1]
    torch.testing.assert_close(x.grad, x.detach().exp() * 3)


# ---------------------------------------------------------------------------------- metrics


def test_metrics_count_and_reset() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x * 2) @ w).sigmoid()

    x, w = torch.randn(8, 16), torch.randn(16, 4)
    compiled = compile_fn(fn)
    assert_same(compiled(x, w), fn(x, w))
    m = fusebackend.metrics
    assert m.graphs_compiled == 1
    assert m.kernels_generated == 2 == kernel_count() == len(kernels())
    assert m.fallbacks == {"mm": 1}
    assert m.eager_graphs == 0
    assert {"aot", "cache", "lower", "schedule", "codegen", "store", "load", "triton", "launch"} <= set(m.stage_seconds)
    assert (m.cache_hits, m.cache_misses) == (0, 1)  # compiled here, and stored
    assert_same(compiled(x, w), fn(x, w))  # same signature: no new compilation
    assert m.graphs_compiled == 1 and m.kernels_generated == 2
    assert "graphs compiled:    1" in m.summary() and "mm x1" in m.summary()
    m.reset()
    assert (m.graphs_compiled, m.kernels_generated, m.eager_graphs, m.cache_hits, m.cache_misses) == (0, 0, 0, 0, 0)
    assert not m.fallbacks and not m.stage_seconds


def test_metrics_count_forward_and_backward_graphs() -> None:
    x = torch.randn(16, 8, requires_grad=True)
    loss = torch.compile(lambda x: torch.tanh(x * 2).sum(), backend="fuse")(x)
    loss.backward()
    assert fusebackend.metrics.graphs_compiled == 2
    assert fusebackend.metrics.kernels_generated >= 2
    torch.testing.assert_close(x.grad, 2 * (1 - torch.tanh(x.detach() * 2) ** 2))


# ----------------------------------------------------------------------------- recompilation


def test_new_shapes_recompile_and_stay_correct() -> None:
    fn = lambda x, y: torch.sigmoid(x) * y + y.exp()  # noqa: E731
    compiled = torch.compile(fn, backend="fuse")
    for shape in [(8, 16), (5, 3), (8, 16)]:
        x, y = torch.randn(shape), torch.randn(shape[-1])
        assert_same(compiled(x, y), fn(x, y))
    compiled_so_far = fusebackend.metrics.graphs_compiled
    assert compiled_so_far >= 2
    x, y = torch.randn(8, 16), torch.randn(16)
    assert_same(compiled(x, y), fn(x, y))
    assert fusebackend.metrics.graphs_compiled == compiled_so_far  # (8, 16) is cached by now
    assert fusebackend.metrics.eager_graphs == 0


def test_new_layout_recompiles() -> None:
    fn = lambda x: x * 2 + 1  # noqa: E731
    compiled = torch.compile(fn, backend="fuse")
    a = torch.randn(6, 9)
    b = torch.randn(9, 6).t()
    c = torch.randn(7, 9)[1:]
    for x in (a, b, c, a):
        out = compiled(x)
        assert_same(out, fn(x))
        assert out.stride() == fn(x).stride()
    assert fusebackend.metrics.eager_graphs == 0


def test_int_argument_changes() -> None:
    fn = lambda x, n: x * n + n  # noqa: E731
    compiled = torch.compile(fn, backend="fuse")
    x = torch.randn(10)
    for n in (2, 3, 7, 2):
        assert_same(compiled(x, n), fn(x, n))
    assert fusebackend.metrics.eager_graphs == 0
