"""Op tests for normalizations against eager: softmax, log_softmax, layer/group/batch/RMS norm, vector norms.

Each case compiles with ``backend="fuse"``, compares with eager on fresh random inputs and
asserts that the work became generated kernels with no ATen fallback (``helpers.check_lowered``).
Sizes stay small: Triton's interpreter runs a reduction's combine function once per element.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from helpers import DIMS, DIMS_KEEP, TOLERANCE, assert_same, check, check_lowered, compile_fn, kernel_count

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32

# -------------------------------------------------------------------------- normalizations


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_and_log_softmax_dims(dim: int) -> None:
    check_lowered(lambda x: (torch.softmax(x, dim), torch.log_softmax(x, dim)), torch.randn(5, 6, 7) * 4)


def test_softmax_large_values_stable() -> None:
    x = torch.randn(8, 64) * 50 + 500  # exp would overflow without subtracting the max
    out = check_lowered(lambda x: torch.softmax(x, -1), x)
    assert torch.isfinite(out).all()


def test_softmax_half_to_float() -> None:
    check_lowered(lambda x: torch.softmax(x, -1, dtype=torch.float32), torch.randn(8, 64).to(f16))


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=str)
def test_layer_norm(affine: bool, dtype: torch.dtype) -> None:
    x = torch.randn(4, 9, 48).to(dtype)
    if affine:
        w, b = torch.randn(48).to(dtype), torch.randn(48).to(dtype)
        check_lowered(lambda x, w, b: F.layer_norm(x, (48,), w, b, 1e-5), x, w, b)
    else:
        check_lowered(lambda x: F.layer_norm(x, (48,)), x)


def test_layer_norm_over_two_dims() -> None:
    x, w, b = torch.randn(4, 6, 8), torch.randn(6, 8), torch.randn(6, 8)
    check_lowered(lambda x, w, b: F.layer_norm(x, (6, 8), w, b), x, w, b)


@pytest.mark.parametrize("groups", [1, 4, 8])
def test_group_norm(groups: int) -> None:
    x, w, b = torch.randn(3, 8, 5, 6), torch.randn(8), torch.randn(8)
    check_lowered(lambda x, w, b: F.group_norm(x, groups, w, b, 1e-5), x, w, b)


def test_group_norm_half() -> None:
    x, w, b = torch.randn(2, 8, 4, 4).to(f16), torch.randn(8).to(f16), torch.randn(8).to(f16)
    check_lowered(lambda x, w, b: F.group_norm(x, 2, w, b), x, w, b, atol=4e-3, rtol=4e-3)


def test_batch_norm_eval() -> None:
    x = torch.randn(6, 5, 7, 3)
    rm, rv = torch.randn(5), torch.rand(5) + 0.5
    w, b = torch.randn(5), torch.randn(5)
    check_lowered(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5), x, rm, rv, w, b)


@pytest.mark.parametrize("shape", [(16, 6), (6, 5, 7, 3)], ids=str)
def test_batch_norm_training_updates_running_stats(shape: tuple[int, ...]) -> None:
    c = shape[1]
    x = torch.randn(shape) * 2 + 0.5
    w, b = torch.randn(c), torch.randn(c)
    rm0, rv0 = torch.randn(c), torch.rand(c) + 0.5

    def fn(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)

    rm_e, rv_e = rm0.clone(), rv0.clone()
    expected = fn(x, rm_e, rv_e, w, b)
    rm_c, rv_c = rm0.clone(), rv0.clone()
    actual = compile_fn(fn)(x, rm_c, rv_c, w, b)
    assert_same(actual, expected)
    assert fusebackend.metrics.eager_graphs == 0
    assert kernel_count() >= 1
    assert not torch.equal(rm_c, rm0), "running mean was not updated"
    torch.testing.assert_close(rm_c, rm_e, atol=1e-5, rtol=1e-5)  # rv uses the unbiased variance
    torch.testing.assert_close(rv_c, rv_e, atol=1e-5, rtol=1e-5)


def test_batch_norm_module_training_two_steps() -> None:
    bn_e, bn_c = torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)
    with torch.no_grad():
        bn_e.weight.copy_(torch.randn(4))
        bn_e.bias.copy_(torch.randn(4))
    bn_c.load_state_dict(bn_e.state_dict())
    compiled = compile_fn(bn_c)
    for _ in range(2):
        x = torch.randn(3, 4, 5, 5) * 3 + 1
        with torch.no_grad():
            assert_same(compiled(x), bn_e(x))
    assert fusebackend.metrics.eager_graphs == 0
    torch.testing.assert_close(bn_c.running_mean, bn_e.running_mean)
    torch.testing.assert_close(bn_c.running_var, bn_e.running_var)
    assert int(bn_c.num_batches_tracked) == 2


@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=str)
def test_rms_norm_written_out(dtype: torch.dtype) -> None:
    x, w = torch.randn(6, 10, 64).to(dtype), torch.randn(64).to(dtype)

    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)

    check_lowered(rms, x, w)


def test_rms_norm_functional() -> None:
    x, w = torch.randn(6, 10, 64), torch.randn(64)
    check_lowered(lambda x, w: F.rms_norm(x, (64,), w, 1e-6), x, w)


# aten.linalg_vector_norm has no lowering and no decomposition in the table: it runs as an ATen
# call. The values are checked here; test_vector_norm_is_generated says when that changes.


def check_norm(fn: Callable[..., Any], *args: Any, atol: float | None = None, rtol: float | None = None) -> Any:
    out = check(fn, *args, atol=atol, rtol=rtol)
    assert set(fusebackend.metrics.fallbacks) <= {"linalg_vector_norm"}, dict(fusebackend.metrics.fallbacks)
    return out


def test_vector_norm_is_generated() -> None:
    check_lowered(lambda x: torch.linalg.vector_norm(x, 2, -1), torch.randn(6, 10))


@pytest.mark.parametrize("dims, keepdim", DIMS_KEEP, ids=[f"{d}-{'keep' if k else 'nokeep'}" for d, k in DIMS_KEEP])
def test_vector_norm_dims(dims: str, keepdim: bool) -> None:
    d = DIMS[dims]
    check_norm(lambda x: torch.linalg.vector_norm(x * 2 + 1, 2, d, keepdim=keepdim), torch.randn(4, 6, 8))


@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=str)
def test_vector_norm_dtype(dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCE[dtype]
    check_norm(lambda x: torch.linalg.vector_norm(x, dim=-1), torch.randn(8, 60).to(dtype), atol=atol, rtol=rtol)


NORMS: dict[str, Callable[[torch.Tensor], Any]] = {
    "l2_all": lambda x: torch.linalg.vector_norm(x),
    "l1_last": lambda x: torch.linalg.vector_norm(x, 1, -1),
    "l3_0_2": lambda x: torch.linalg.vector_norm(x, 3, (0, 2), keepdim=True),
    "linf": lambda x: torch.linalg.vector_norm(x, math.inf, -1),
    "lminf_first": lambda x: torch.linalg.vector_norm(x, -math.inf, 0),
    "l0": lambda x: torch.linalg.vector_norm(x, 0, -1),
    "norm": lambda x: torch.norm(x),
    "norm_dim": lambda x: torch.norm(x, dim=1),
    "norm_p1": lambda x: torch.norm(x, p=1, dim=(1, 2)),
    "normalize": lambda x: F.normalize(x, dim=-1),
}


@pytest.mark.parametrize("name", list(NORMS), ids=str)
def test_vector_norm(name: str) -> None:
    x = torch.randn(5, 6, 7)
    x[0, 0, :3] = 0.0  # zeros for the 0-"norm"
    check_norm(NORMS[name], x)
