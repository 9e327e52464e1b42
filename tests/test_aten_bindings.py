"""ATen calls the wrapper makes through PyTorch's Python bindings (``wrapper_calls.aten_call``): each
binding computes what its OpOverload computes, and other ops keep the OpOverload."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fusebackend.kernels import wrapper_calls


def _binding_cases(device: str) -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cpu").to(device)

    q, k, v = r(2, 3, 5, 8), r(2, 3, 7, 8), r(2, 3, 7, 8)
    return {
        "convolution": ((r(2, 4, 6, 5), r(6, 2, 3, 3), r(6), [2, 1], [1, 0], [1, 2], False, [0, 0], 2), {}),
        "mm": ((r(3, 4), r(4, 5)), {}),
        "addmm": ((r(5), r(3, 4), r(4, 5)), {"beta": 0.5, "alpha": 2.0}),
        "bmm": ((r(2, 3, 4), r(2, 4, 5)), {}),
        "baddbmm": ((r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)), {"alpha": 0.5}),
        "_scaled_dot_product_efficient_attention": ((q, k, v, None, False, 0.0, False), {"scale": 0.3}),
        "_scaled_dot_product_flash_attention_for_cpu": ((q, k, v, 0.0, True), {"scale": 0.3}),
    }


def test_every_python_binding_has_a_case() -> None:
    assert set(_binding_cases("cpu")) == set(wrapper_calls.PYTHON_BINDINGS)


@pytest.mark.parametrize("name", wrapper_calls.PYTHON_BINDINGS)
def test_python_bindings_compute_what_their_overloads_do(name: str) -> None:
    """Each op the wrapper calls through its Python binding gives what the OpOverload gives for
    the same arguments, positional and keyword: values on the CPU where it runs there, else
    sizes, strides and dtypes on the meta device."""
    op = getattr(torch.ops.aten, name).default
    call = wrapper_calls.aten_call(op)
    if getattr(torch._C._VariableFunctions, name, None) is None:
        assert call is op  # this torch has no binding: the OpOverload
        return
    assert call is not op
    cpu = "efficient" not in name
    args, kwargs = _binding_cases("cpu" if cpu else "meta")[name]
    expected, actual = op(*args, **kwargs), call(*args, **kwargs)
    flat_e = expected if isinstance(expected, (tuple, list)) else (expected,)
    flat_a = actual if isinstance(actual, (tuple, list)) else (actual,)
    assert len(flat_a) == len(flat_e)
    for a, e in zip(flat_a, flat_e):
        if isinstance(e, torch.Tensor):
            assert (a.shape, a.stride(), a.dtype) == (e.shape, e.stride(), e.dtype)
            if cpu:
                torch.testing.assert_close(a, e, rtol=0, atol=0)
        else:
            assert type(a) is type(e)


def test_other_ops_and_overloads_keep_the_opoverload() -> None:
    aten = torch.ops.aten
    for op in (aten.convolution_backward.default, aten.mm.out, aten.sort.default, aten.addmm.dtype,
               aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_cudnn_attention.default):
        assert wrapper_calls.aten_call(op) is op
    # why not these two: the binding returns the SymInt results (the longest sequences) as tensors
    q = torch.empty(1, 1, 4, 8, device="meta")
    binding = torch._C._VariableFunctions._scaled_dot_product_flash_attention
    assert isinstance(aten._scaled_dot_product_flash_attention.default(q, q, q)[4], int)
    assert isinstance(binding(q, q, q)[4], torch.Tensor)
