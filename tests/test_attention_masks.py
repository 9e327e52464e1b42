"""Attention masks that are constants of the graph (``attention_masks.py``): an all-true mask is
dropped, a square causal one becomes ``is_causal=True``, and every other mask stays. Each case
compares with eager; the rewrite itself is asserted on the graph that AOTAutograd receives."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from fusebackend.attention_masks import drop_constant_masks
from helpers import check


def _sdpa_calls(fn: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
    """The attention calls of Dynamo's graph of ``fn`` after ``drop_constant_masks``: each call's
    mask (None, or the mask node's name) and ``is_causal``; the graph still matches eager."""
    calls: list[dict[str, Any]] = []

    def backend(gm: torch.fx.GraphModule, _: Any) -> Any:
        drop_constant_masks(gm)
        for node in gm.graph.nodes:
            if node.op == "call_function" and "scaled_dot_product" in str(node.target):
                mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
                calls.append({"mask": None if mask is None else mask.name,
                              "is_causal": node.kwargs.get("is_causal", False)})
        gm.graph.lint()
        return gm.forward

    torch._dynamo.reset()
    expected = fn(*args)
    actual = torch.compile(fn, backend=backend)(*args)
    torch.testing.assert_close(actual, expected)
    return calls


def _qkv(batch: int = 2, heads: int = 3, length: int = 7, kv_length: int | None = None,
         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    kv_length = length if kv_length is None else kv_length
    q = torch.randn(batch, heads, length, 8, dtype=dtype)
    k, v = (torch.randn(batch, heads, kv_length, 8, dtype=dtype) for _ in range(2))
    return q, k, v


def all_true(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # transformers' padding-free mask under compile: positions against a padding start past the end
    kv = torch.arange(k.shape[-2], device=q.device)
    mask = (kv + k.shape[-2] >= kv)[None, None, None, :].expand(q.shape[0], 1, q.shape[-2], -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(q.shape[-2], device=q.device)
    mask = (positions[None, :] <= positions[:, None]).expand(q.shape[0], 1, -1, -1)
    return F.scaled_dot_product_attention(q, k, v, mask, scale=0.3)


def causal_additive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    length = q.shape[-2]
    mask = torch.full((length, length), float("-inf"), dtype=q.dtype).triu(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_an_all_true_mask_is_dropped() -> None:
    assert _sdpa_calls(all_true, *_qkv()) == [{"mask": None, "is_causal": False}]
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    check(all_true, *_qkv(length=5))
    assert fusebackend.metrics.attention_masks == {"none": 1}


@pytest.mark.parametrize("fn", [causal, causal_additive], ids=["boolean", "additive"])
def test_a_square_causal_mask_becomes_is_causal(fn: Callable[..., torch.Tensor]) -> None:
    assert _sdpa_calls(fn, *_qkv(length=9)) == [{"mask": None, "is_causal": True}]
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    check(fn, *_qkv(batch=1, heads=2, length=6))
    assert fusebackend.metrics.attention_masks == {"causal": 1}


def test_a_mask_read_from_an_input_stays() -> None:
    def padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])

    q, k, v = _qkv()
    keep = torch.ones(2, 7, dtype=torch.bool)  # all true in value, but an input: it may change
    (call,) = _sdpa_calls(padded, q, k, v, keep)
    assert call["mask"] is not None
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    keep[1, 5:] = False
    check(padded, q, k, v, keep)
    assert not fusebackend.metrics.attention_masks


def band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(q.shape[-2])
    distance = positions[None, :] - positions[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(distance <= 0) & (distance > -3))


def causal_rectangle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # a cache's mask: 4 queries after 3 cached keys; is_causal would align it top-left, wrongly
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - q.shape[-2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def upper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn, kv_length", [(band, None), (causal_rectangle, 7), (upper, None)],
                         ids=["band", "causal-not-square", "upper-triangle"])
def test_other_constant_masks_stay(fn: Callable[..., torch.Tensor], kv_length: int | None) -> None:
    qkv = _qkv(length=4, kv_length=kv_length)
    (call,) = _sdpa_calls(fn, *qkv)
    assert call["mask"] is not None and call["is_causal"] is False
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    check(fn, *qkv)
    assert not fusebackend.metrics.attention_masks


def test_a_causal_mask_in_training_matches_eager_gradients() -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(length=6))
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    torch._dynamo.reset()
    compiled = torch.compile(causal, backend=fusebackend.fuse)
    grads = torch.autograd.grad(compiled(q, k, v).square().sum(), (q, k, v))
    expected = torch.autograd.grad(causal(q, k, v).square().sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    assert fusebackend.metrics.attention_masks == {"causal": 1}
    assert fusebackend.metrics.eager_graphs == 0


def _row_mask(kind: str, batch: int, length: int) -> torch.Tensor:
    """A mask the same along the keys, dropping query 2 of the first sample: ``expanded`` a
    boolean (batch, 1, length, 1) expanded over the keys (stride 0, as one crosses a graph
    break), ``column`` the same unexpanded, ``additive`` a float one of -inf and 1.5."""
    keep = torch.ones(batch, 1, length, 1, dtype=torch.bool)
    keep[0, 0, 2] = False
    if kind == "expanded":
        return keep.expand(batch, 1, length, length)
    if kind == "column":
        return keep
    return torch.where(keep, 1.5, float("-inf")).expand(batch, 1, length, length)


def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.4) * 2


@pytest.mark.parametrize("kind", ["expanded", "column", "additive"])
def test_a_mask_the_same_along_the_keys_leaves_the_call_and_zeroes_its_rows(kind: str) -> None:
    q, k, v = _qkv(length=6)
    mask = _row_mask(kind, 2, 6)
    assert _sdpa_calls(masked, q, k, v, mask) == [{"mask": None, "is_causal": False}]
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    out = check(masked, q, k, v, mask)
    assert fusebackend.metrics.attention_masks == {"rows": 1}
    assert out[0, :, 2].eq(0).all() and out[1, :, 2].ne(0).any()  # the dropped row is zeros, as in eager


def test_a_row_mask_in_bf16_keeps_the_dtype_and_nan_rows() -> None:
    q, k, v = _qkv(length=5, dtype=torch.bfloat16)
    mask = torch.zeros(2, 1, 5, 1, dtype=torch.bfloat16)
    mask[0, 0, 1], mask[1, 0, 3], mask[1, 0, 4] = float("nan"), float("inf"), float("-inf")
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    out = check(masked, q, k, v, mask.expand(2, 1, 5, 5))
    assert out.dtype == torch.bfloat16
    assert out[0, :, 1].isnan().all() and out[1, :, 3].isnan().all() and out[1, :, 4].eq(0).all()
    assert fusebackend.metrics.attention_masks == {"rows": 1}


def test_a_row_mask_in_training_matches_eager_gradients() -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(length=6))
    mask = _row_mask("expanded", 2, 6)
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    compiled = torch.compile(masked, backend=fusebackend.fuse)
    grads = torch.autograd.grad(compiled(q, k, v, mask).square().sum(), (q, k, v))
    expected = torch.autograd.grad(masked(q, k, v, mask).square().sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    assert grads[0][0, :, 2].eq(0).all()
    assert fusebackend.metrics.attention_masks == {"rows": 1}
    assert fusebackend.metrics.eager_graphs == 0
