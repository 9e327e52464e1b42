"""Grouped-query attention over repeated key/value heads (``lowering/attention_heads.py``): an
inference graph calls ``scaled_dot_product_attention`` with ``enable_gqa=True`` on the unrepeated
heads and copies nothing; a training graph keeps the call it traced. Each case compares with
eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from fusebackend.lowering import attention_heads
from helpers import assert_same, compile_fn, kernel_count


def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    # transformers' repeat_kv: a new axis expanded, then reshaped into the heads
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, group, s, d).reshape(b, h * group, s, d)


def attention(q, k, v, mask, group: int, causal: bool = False):
    out = F.scaled_dot_product_attention(q, repeat_kv(k, group), repeat_kv(v, group), attn_mask=mask,
                                         is_causal=causal, scale=0.3)
    return out.transpose(1, 2).flatten(2)


def _inputs(batch, heads, group, length, kv_length, dtype, transposed=False):
    if transposed:  # as a model makes them: [b, s, h, d] projections viewed as heads
        q = torch.randn(batch, length, heads * group, 8, dtype=dtype).transpose(1, 2)
        k = torch.randn(batch, kv_length, heads, 8, dtype=dtype).transpose(1, 2)
    else:
        q = torch.randn(batch, heads * group, length, 8, dtype=dtype)
        k = torch.randn(batch, heads, kv_length, 8, dtype=dtype)
    v = torch.randn(batch, heads, kv_length, 8, dtype=dtype)
    return q, k, v


def _compiled(fn, *args):
    fusebackend.metrics.reset()
    torch._dynamo.reset()
    with fusebackend.config.patch(graph_cache=False):
        return compile_fn(fn)(*args)


# removed: the kernels the rewrite saves. The repeated keys and values are two copies; one
# key/value head repeats as a view, which the call as traced needs copied once; a boolean mask
# is made additive by a kernel as traced, and by the call itself, as eager's, once rewritten.
@pytest.mark.parametrize("batch,heads,group,length,kv_length,mask_kind,transposed,dtype,removed", [
    (1, 2, 4, 1, 12, "bool", False, torch.float32, 3),    # a decode step over a static cache
    (2, 2, 3, 5, 7, "additive", True, torch.float32, 2),  # odd group and lengths, strided inputs
    (3, 1, 2, 6, 6, "causal", False, torch.float32, 1),   # one key/value head, no mask, is_causal
    (2, 2, 2, 4, 9, "bool", True, torch.bfloat16, 3),
])
def test_repeated_heads_not_copied(batch, heads, group, length, kv_length, mask_kind, transposed, dtype, removed,
                                   monkeypatch):
    torch.manual_seed(0)
    q, k, v = _inputs(batch, heads, group, length, kv_length, dtype, transposed)
    if mask_kind == "bool":
        mask = torch.rand(batch, 1, length, kv_length) > 0.3
        mask[..., 0] = True  # no row masked whole
    elif mask_kind == "additive":
        mask = torch.where(torch.rand(batch, 1, length, kv_length) > 0.3, 0.0, float("-inf")).to(dtype)
        mask[..., 0] = 0.0
    else:
        mask = None

    def fn(q, k, v, mask):
        return attention(q, k, v, mask, group, causal=mask_kind == "causal") * 2

    expected = fn(q, k, v, mask)
    actual = _compiled(fn, q, k, v, mask)
    assert_same(actual, expected)
    assert fusebackend.metrics.attention_masks["gqa"] == 1
    assert fusebackend.metrics.fallbacks["scaled_dot_product_attention"] == 1
    compiled = fusebackend.last_compiled()
    assert "aten.scaled_dot_product_attention.default" in compiled.schedule
    assert "aten.expand" not in "\n".join(compiled.kernels.values())
    kernels = kernel_count()
    monkeypatch.setattr(attention_heads, "share_kv_heads", lambda gm: 0)  # the call as traced
    assert_same(_compiled(fn, q, k, v, mask), expected)
    assert kernel_count() == kernels + removed


def test_training_keeps_the_traced_call():
    # the forward's log-sum-exp is saved for the backward: the call stays as traced, gradients right
    torch.manual_seed(1)
    q, k, v = (t.requires_grad_() for t in _inputs(2, 2, 2, 5, 5, torch.float32))

    def fn(q, k, v):
        return attention(q, k, v, None, 2).square().sum()

    expected = torch.autograd.grad(fn(q, k, v), (q, k, v))
    loss = _compiled(fn, q, k, v)
    actual = torch.autograd.grad(loss, (q, k, v))
    assert_same(actual, expected)
    assert fusebackend.metrics.attention_masks["gqa"] == 0


def test_other_repeats_stay():
    # heads repeated one by one (repeat_interleave's order is the same, but a tile is not): the
    # expand of a leading axis maps query head h to key head h % heads, which enable_gqa does not
    torch.manual_seed(2)
    q, k, v = _inputs(1, 2, 2, 3, 6, torch.float32)

    def tiled(x):
        b, h, s, d = x.shape
        return x[:, None].expand(b, 2, h, s, d).reshape(b, 2 * h, s, d)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, tiled(k), tiled(v))

    assert_same(_compiled(fn, q, k, v), fn(q, k, v))
    assert fusebackend.metrics.attention_masks["gqa"] == 0
