"""Shared checks: compile with backend="fuse", compare with eager, inspect what was generated."""

from __future__ import annotations

import itertools
import subprocess
from typing import Any, Callable, Mapping, Sequence

import pytest
import torch

import fusebackend

# (atol, rtol) per dtype. Half types are computed in fp32 and rounded once, while eager rounds
# after every op, so they differ by a few units in the last place.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-10, 1e-10),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def assert_same(actual: Any, expected: Any, atol: float | None = None, rtol: float | None = None) -> None:
    """Outputs match eager: same structure, shapes, dtypes, and values within the dtype's tolerance."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, atol, rtol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype.is_floating_point:
        d_atol, d_rtol = TOLERANCE[expected.dtype]
        torch.testing.assert_close(
            actual, expected, atol=atol if atol is not None else d_atol,
            rtol=rtol if rtol is not None else d_rtol, equal_nan=True,
        )
    else:
        assert torch.equal(actual, expected), f"mismatch:\n{actual}\n!=\n{expected}"

# Reduced dims used by the reduction and normalization op matrices, by name, with keepdim choices.
DIMS: dict[str, Any] = {"last": -1, "first": 0, "middle": 1, "0_2": (0, 2), "all": None}
DIMS_KEEP = [("last", False), ("last", True), ("first", False), ("middle", True), ("0_2", False),
             ("0_2", True), ("all", False), ("all", True)]
DIMS_KEEP_IDS = {f"{d}-{'keep' if k else 'nokeep'}": (d, k) for d, k in DIMS_KEEP}  # for helpers.diagonal


def compile_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, backend="fuse", fullgraph=True)


def check(fn: Callable[..., Any], *args: Any, atol: float | None = None, rtol: float | None = None) -> Any:
    """Run ``fn`` compiled and eagerly on the same inputs; assert the outputs match; return them."""
    expected = fn(*args)
    actual = compile_fn(fn)(*args)
    assert_same(actual, expected, atol, rtol)
    assert fusebackend.metrics.eager_graphs == 0, "a graph fell back to eager"
    return actual


def check_lowered(fn: Callable[..., Any], *args: Any, atol: float | None = None, rtol: float | None = None) -> Any:
    """``check`` plus: at least one kernel was generated and no op fell back to ATen."""
    out = check(fn, *args, atol=atol, rtol=rtol)
    assert kernel_count() >= 1, "no kernel generated"
    assert not fusebackend.metrics.fallbacks, f"ATen fallbacks: {dict(fusebackend.metrics.fallbacks)}"
    return out


def kernels() -> dict[str, str]:
    """Kernel name -> source for every graph compiled since the test started."""
    out: dict[str, str] = {}
    for artifacts in fusebackend.history():
        out.update(artifacts.kernels)
    return out


def kernel_count() -> int:
    return sum(a.kernel_count for a in fusebackend.history())


# ----------------------------------------------------------------------------- sampled matrices
# A long matrix runs a fixed sample of its cases; the others are marked ``full``, which the
# default run deselects and ``pytest --full`` runs (conftest.py).

FULL = pytest.mark.full
ParameterSet = type(pytest.param(None))


def sampled(cases: Sequence[Any], keep: Callable[[int], bool]) -> list[ParameterSet]:
    """``cases`` (values or ``pytest.param``s) as params; the case at index ``i`` runs by default
    where ``keep(i)``, and is marked ``full`` otherwise."""
    out = []
    for i, case in enumerate(cases):
        param = case if isinstance(case, ParameterSet) else pytest.param(case)
        if not keep(i):
            param = pytest.param(*param.values, id=param.id, marks=[*param.marks, FULL])
        out.append(param)
    return out


class Args(tuple):
    """A value of an axis of ``diagonal`` that is several arguments of the test."""


def diagonal(*axes: Mapping[str, Any], per: int = 1) -> list[ParameterSet]:
    """Every combination of the axes' values (each axis a mapping of id to value; the first axis
    outermost, ids joined by "-"), as params. By default each value of the first axis runs with
    ``per`` of the ``n`` combinations of the other axes, taken in turn down the first axis: value
    ``i`` with combinations ``i``, ``i + n // per``, ``i + 2 * (n // per)``... modulo ``n``. Every
    value of every axis runs (where the first axis has at least ``n / per`` values), and the
    combinations of the others spread evenly over the first. The other cases are marked
    ``full``. A value that is an ``Args`` gives several arguments."""
    others = list(itertools.product(*(list(a.items()) for a in axes[1:])))
    step = max(1, len(others) // per)
    out = []
    for i, (first_id, first) in enumerate(axes[0].items()):
        chosen = {(i + j * step) % len(others) for j in range(per)}
        for k, rest in enumerate(others):
            ids = [first_id] + [r[0] for r in rest]
            values = [v for value in [first] + [r[1] for r in rest]
                      for v in (value if isinstance(value, Args) else (value,))]
            out.append(pytest.param(*values, id="-".join(ids), marks=() if k in chosen else (FULL,)))
    return out


def in_turn(rows: Sequence[Sequence[Any]]) -> set[tuple[int, int]]:
    """The default run's ``(i, j)`` of rows of choices (each op's dtypes): row ``i`` with its
    choice ``i`` modulo their number, and each value those leave out with its first row: every
    row runs, and every value."""
    kept = {(i, i % len(row)) for i, row in enumerate(rows)}
    seen = {rows[i][j] for i, j in kept}
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            if value not in seen:
                kept.add((i, j))
                seen.add(value)
    return kept


# ---------------------------------------------------------------------------- child processes


def run_together(commands: Sequence[tuple[list[str], dict[str, str]]], cwd: Any,
                 timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Each ``(argv, env)`` in a child process of its own, all started at once (independent runs
    share the machine's cores instead of waiting for each other); their results in order."""
    procs = [subprocess.Popen(argv, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv, env in commands]
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return done


def without_tails(source: str) -> str:
    """A kernel's source without the last, partial block of each looped pass (the masked copy of
    the pass's body after its unmasked loop: ``codegen.reduction.TAIL_COMMENT``), so that counts
    of loads and stores are per step of a pass."""
    from fusebackend.codegen.reduction import TAIL_COMMENT

    out: list[str] = []
    tail_indent: int | None = None
    for line in source.splitlines():
        indent = len(line) - len(line.lstrip())
        if tail_indent is not None and (indent > tail_indent or not line.strip()):
            continue
        tail_indent = None
        if TAIL_COMMENT in line:
            tail_indent = indent
            continue
        out.append(line)
    return "\n".join(out)

