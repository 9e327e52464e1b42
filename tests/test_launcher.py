"""Launching a compiled kernel: Triton's binding at the first call, then the compiled kernel
called directly (``runtime.Launcher``), as long as the pointers keep the alignment it was
specialized on, with no profiler hook or scratch memory asked for; programmatic dependent launch as a
compile option; and the wrapper's allocators."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import fusebackend
from fusebackend.kernels import runtime, wrapper_calls


class _Compiled:
    """Stands in for Triton's CompiledKernel: ``compiled[grid](*args)`` launches directly."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return lambda *args: self.launches.append((grid, args))


class _Jit:
    """Stands in for a JITFunction: ``kernel[grid](*args, **launch)`` binds, compiles, launches."""

    def __init__(self) -> None:
        self.compiled = _Compiled()
        self.bound: list[tuple[Any, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., _Compiled]:
        def run(*args: Any, **launch: int) -> _Compiled:
            self.bound.append((grid, args, launch))
            return self.compiled

        return run


def test_launcher_skips_binding_after_the_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    jit = _Jit()
    launch = runtime.Launcher(jit, 12, {"XBLOCK": 64, "RBLOCK": 8, "num_warps": 4})
    a, b = torch.empty(64), torch.empty(64)
    launch(77, a, b, 100, 7)
    assert jit.bound == [((12, 1, 1), (a, b, 100, 7), {"XBLOCK": 64, "RBLOCK": 8, "num_warps": 4})]
    launch(77, b, a, 100, 7)
    # the compiled kernel takes every parameter in order: constexprs last, num_warps is not one
    assert jit.compiled.launches == [((12, 1, 1), (b, a, 100, 7, 64, 8))]
    assert len(jit.bound) == 1


def test_launcher_rebinds_when_alignment_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Triton specialized the kernel on 16-byte-aligned pointers: an unaligned view must not reuse it
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    jit = _Jit()
    launch = runtime.Launcher(jit, 1, {"XBLOCK": 64})
    base = torch.empty(65)
    launch(77, base[:64], 64)
    launch(77, base[1:], 64)
    assert len(jit.bound) == 2 and not jit.compiled.launches


class _Launcher36:
    """Stands in for Triton 3.6's CudaLauncher: a C ``launch`` behind a Python ``__call__``."""

    global_scratch_size = 0
    profile_scratch_size = 0
    launch_cooperative_grid = False
    launch_pdl = False

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.launch = lambda *args: self.calls.append(args)

    def __call__(self, gridX: int, gridY: int, gridZ: int, stream: int, function: Any, *args: Any) -> None:
        raise AssertionError("the direct path calls launch, not __call__")


def _jit36() -> tuple[_Jit, _Launcher36]:
    jit = _Jit()
    launcher = _Launcher36()
    jit.compiled.run = launcher  # type: ignore[attr-defined]
    jit.compiled.function, jit.compiled.packed_metadata = "cufunction", "packed"  # type: ignore[attr-defined]
    return jit, launcher


def test_launcher_calls_the_c_launcher_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    jit, launcher = _jit36()
    launch = runtime.Launcher(jit, 12, {"XBLOCK": 64, "RBLOCK": 8, "num_warps": 4})
    a, b = torch.empty(64), torch.empty(64)
    launch(77, a, b, 100, 7)
    launch(77, b, a, 100, 7)
    # tensors go to the C launcher as their addresses
    assert launcher.calls == [(12, 1, 1, 77, "cufunction", False, False, None, None, "packed", None, None, None,
                               b.data_ptr(), a.data_ptr(), 100, 7, 64, 8)]
    assert not jit.compiled.launches and len(jit.bound) == 1
    # the launch is written for this kernel: one alignment test for both pointers, the ints as given
    source = launch.fast.__source__
    assert "not ((p0 | p1) & 15)" in source and "p0, p1, a2, a3, *constexprs" in source, source
    assert "c_launch(gx, gy, gz, stream, " in source  # the stream the wrapper read once per call


def test_launcher_puts_its_direct_launch_where_the_wrapper_finds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # after the first call the wrapper's name for the kernel is the direct launch itself: one
    # Python call per launch, not the Launcher's and then the launch function's
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    jit, launcher = _jit36()
    home: dict[str, Any] = {}
    launch = runtime.Launcher(jit, 4, {"XBLOCK": 64}, home, "fused_pw0_add")
    home["fused_pw0_add"] = launch
    a = torch.empty(64)
    home["fused_pw0_add"](5, a, 64)
    assert home["fused_pw0_add"] is launch.fast and launch.fast is not None
    home["fused_pw0_add"](6, a, 64)
    assert launcher.calls == [(4, 1, 1, 6, "cufunction", False, False, None, None, "packed", None, None, None,
                               a.data_ptr(), 64, 64)]
    assert len(jit.bound) == 1


def test_launcher_direct_path_checks_unaligned_pointers_stay_unaligned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    jit, launcher = _jit36()
    launch = runtime.Launcher(jit, 2, {"XBLOCK": 64})
    base = torch.empty(130)
    aligned, odd = base[:64], base[1:65]  # 4-byte offset: not 16-byte aligned
    fusebackend.metrics.reset()
    launch(77, aligned, odd, 64)
    launch(77, aligned, odd, 64)  # the same alignments: direct
    launch(77, aligned, aligned, 64)  # the kernel assumed p1 unaligned; an aligned one is another specialization
    assert launcher.calls == [(2, 1, 1, 77, "cufunction", False, False, None, None, "packed", None, None, None,
                               aligned.data_ptr(), odd.data_ptr(), 64, 64)]
    assert len(jit.bound) == 2
    assert fusebackend.metrics.slow_launches == {"a pointer's alignment changed": 1}


def test_launcher_takes_tritons_path_for_profiler_hooks_and_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    import triton

    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    jit, launcher = _jit36()
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    launch = runtime.Launcher(jit, 3, {"XBLOCK": 64})
    x = torch.empty(64)
    fusebackend.metrics.reset()
    launch(77, x, 64)
    launch(77, x, 64)
    assert not launcher.calls and jit.compiled.launches == [((3, 1, 1), (x, 64, 64))]
    assert fusebackend.metrics.slow_launches == {"a launch hook set": 1}  # the first call compiles: not counted
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", None)
    jit, launcher = _jit36()
    launcher.global_scratch_size = 128  # type: ignore[misc]
    launch = runtime.Launcher(jit, 3, {"XBLOCK": 64})
    launch(77, x, 64)
    launch(77, x, 64)
    assert not launcher.calls and len(jit.compiled.launches) == 1
    assert fusebackend.metrics.slow_launches == {"a launch hook set": 1, "no C launcher": 1}


def test_allocators_follow_the_graph_device() -> None:
    fast, general = wrapper_calls.allocators(torch.device("cpu"))
    assert fast is None  # the fast allocator is CUDA's
    t = general((3, 4), (1, 3), torch.float16)
    assert t.shape == (3, 4) and t.stride() == (1, 3) and t.dtype == torch.float16 and t.device.type == "cpu"
    fast, _ = wrapper_calls.allocators(torch.device("cuda", 0))
    assert fast is getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None)
    assert not wrapper_calls.on_device(None)


def test_launcher_in_the_interpreter_always_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "use_interpreter", lambda: True)
    jit = _Jit()
    launch = runtime.Launcher(jit, 1, {"XBLOCK": 64})
    x = torch.empty(64)
    launch(77, x, 64)
    launch(77, x, 64)
    assert len(jit.bound) == 2 and not jit.compiled.launches


def test_pdl_is_a_compile_option_not_a_kernel_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    jit, launcher = _jit36()
    launcher.launch_pdl = True  # type: ignore[misc]  # what Triton reads off the compiled metadata
    launch = runtime.Launcher(jit, 12, {"XBLOCK": 64, "num_warps": 4, "launch_pdl": True})
    a = torch.empty(64)
    launch(77, a, 100)
    launch(77, a, 100)
    assert jit.bound == [((12, 1, 1), (a, 100), {"XBLOCK": 64, "num_warps": 4, "launch_pdl": True})]
    assert launcher.calls == [(12, 1, 1, 77, "cufunction", False, True, None, None, "packed", None, None, None,
                               a.data_ptr(), 100, 64)]
