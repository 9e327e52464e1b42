"""Shared checks: compile with backend="fuse", compare with eager, inspect what was generated."""

from __future__ import annotations

from typing import Any, Callable

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
