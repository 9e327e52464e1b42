"""Launching a compiled kernel from Triton's C launcher directly, without ``kernel[grid](...)``'s
per-call binding in Python (``runtime.Launcher`` builds one at a kernel's first call), and the
stream the wrapper reads once per graph call."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from fusebackend import metrics

__all__ = ["DirectLaunch", "current_stream", "direct_launch", "direct_launcher"]


def current_stream() -> int:
    """The current CUDA device's current stream, for the launches of one wrapper call (they go
    to the current device's context, as Triton's own launches do)."""
    return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())


@dataclasses.dataclass(frozen=True)
class DirectLaunch:
    """What a direct launch of a compiled kernel needs (``direct_launch``)."""

    runner: Any  # Triton's ``compiled[grid]``: takes the tensors, calls the hooks
    launch: Any  # the C launcher's ``launch``; None: always the runner
    head: tuple[Any, ...]  # its arguments between the stream and the kernel's own
    grid: tuple[int, int, int]
    hooks: Any  # triton.knobs.runtime: its launch hooks are looked at on every launch


def direct_launch(compiled: Any, grid: tuple[int, int, int]) -> DirectLaunch:
    """How to launch ``compiled`` from its C launcher directly.

    The launcher (``Launcher.__call__``) passes the kernel's runtime arguments with each tensor
    replaced by its address, then the constexprs (the compiled kernel takes every parameter). Triton's
    ``compiled[grid]`` looks up the device, the stream, the launch hooks and the kernel's
    scratch sizes on every call, in Python, before its C launcher. Where the launcher is the one
    this was written against (Triton 3.6's ``CudaLauncher``, whose ``__call__`` takes
    ``(gridX, gridY, gridZ, stream, function, *args)`` and needs no scratch memory for our
    kernels), its C ``launch`` is called directly, with the addresses: 4.4 us a launch of eight
    pointers on an H200 host, against 5.8 us given the tensors and 14.9 us through
    ``kernel[grid](...)`` (2026-11-23). Anything else takes ``compiled[grid]`` with the tensors.
    """
    runner = compiled[grid]  # also loads the kernel and its launcher
    launcher = getattr(compiled, "run", None)
    launch = getattr(launcher, "launch", None)
    try:
        params = list(inspect.signature(type(launcher).__call__).parameters)
    except (TypeError, ValueError):
        params = []
    known = params == ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]
    import triton

    if (launch is None or not known or getattr(launcher, "global_scratch_size", 1)
            or getattr(launcher, "profile_scratch_size", 1)):
        return DirectLaunch(runner, None, (), grid, triton.knobs.runtime)

    head = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
            compiled.packed_metadata, None, None, None)
    return DirectLaunch(runner, launch, head, grid, triton.knobs.runtime)



def direct_launcher(direct: DirectLaunch, args: tuple[Any, ...], constexprs: tuple[Any, ...],
                     slow: Any, per_call: bool = False) -> Any:
    """A function ``(stream, *args)`` launching ``direct`` for arguments laid out like ``args``
    (the first call's).

    Its source is written for this kernel: each tensor's address read once, one test that the
    pointers aligned to 16 bytes at the first call still are (and the others still are not: the
    compiled kernel was specialized on both), that no launch hook is set (a profiler's), and the
    C call on ``stream``. Otherwise ``slow``: Triton's path, or the runner with the hooks. The
    generated source is kept on the function (``__source__``) for the dumps. ``per_call``: the
    grid comes first in each call (``Launcher``), and the ints must stay in int32's range, which
    Triton compiled them as (a larger one takes Triton's path, which compiles for int64).
    """
    names = [f"a{i}" for i in range(len(args))]
    pointers = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    aligned = [f"p{i}" for i in pointers if args[i].data_ptr() % 16 == 0]
    unaligned = [f"p{i}" for i in pointers if args[i].data_ptr() % 16 != 0]
    passed = [f"p{i}" if i in pointers else names[i] for i in range(len(args))]
    lines = [f"def launch(stream, {', '.join(names)}):"]
    lines += [f"    p{i} = a{i}.data_ptr()" for i in pointers]
    tests = ([f"not (({' | '.join(aligned)}) & 15)"] if aligned else []) + [f"{p} & 15" for p in unaligned]
    if per_call:
        lines[0] = f"def launch(stream, gx, {', '.join(names)}):"
        tests += [f"{names[i]} <= {2**31 - 1}" for i, a in enumerate(args) if type(a) is int]
    cond = " and ".join(tests) or "True"
    lines.append(f"    if {cond}:")
    if direct.launch is not None:
        lines.append("        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook")
        lines.append("        if (enter is None or not getattr(enter, 'calls', True)) and (")
        lines.append("                leave is None or not getattr(leave, 'calls', True)):")
        lines.append(f"            c_launch(gx, gy, gz, stream, *head, {', '.join(passed)}, *constexprs)")
        lines.append("            return")
    grid_arg = "gx, " if per_call else ""
    if per_call and direct.launch is None:
        lines.append("        pass")
    if not per_call:  # the runner launches the first call's grid
        lines.append(f"        runner({', '.join(names)}, *constexprs)  # a profiler's hooks: Triton's path")
        lines.append("        return")
    lines.append(f"    slow(stream, {grid_arg}{', '.join(names)})  # a pointer of another alignment"
                 + (", an int past int32, or hooks" if per_call else "") + ": Triton specializes again")
    source = "\n".join(lines) + "\n"
    scope = {"hooks": direct.hooks, "c_launch": direct.launch, "head": direct.head,
             "runner": _counted(direct.runner, "a launch hook set" if direct.launch is not None else "no C launcher"),
             "constexprs": constexprs, "slow": _counted(slow, "a pointer's alignment changed"),
             "gx": direct.grid[0], "gy": direct.grid[1], "gz": direct.grid[2]}
    exec(compile(source, "<fusebackend direct launch>", "exec"), scope)
    fn = scope["launch"]
    fn.__source__ = source
    return fn


def _counted(fn: Any, why: str) -> Any:
    """``fn``, counting its calls in ``metrics.slow_launches[why]`` (the slow paths only)."""

    def call(*args: Any) -> None:
        metrics.slow_launches[why] += 1
        fn(*args)

    return call
