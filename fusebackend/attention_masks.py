"""Attention masks that are constants of the graph, dropped before AOTAutograd traces it.

Under ``torch.compile`` transformers cannot look at a mask's values to see that it masks nothing
(that would break the graph), so it builds the mask in the graph from ``arange``: an all-true
mask for an encoder with no padding (ViT, wav2vec 2.0 in transformers 5.17), a causal one for a
decoder given no ``attention_mask`` (Llama, GPT-2, Qwen2). Eager passes ``None`` or
``is_causal=True`` instead. With a mask, ``scaled_dot_product_attention`` cannot take the flash
or cuDNN kernel, and a boolean mask expanded along the key dimension (stride 0) leaves it the
math path: two batched products and a softmax in fp32 around them, where eager runs one fused
attention kernel (ViT-B/16 b64 and wav2vec 2.0 b8 on an H100 under both Inductor and fuse,
2026-11-27).

A mask computed from no input of the graph (no placeholder, no attribute: only ``arange``,
arithmetic, comparisons and views of fixed sizes) is a constant. It is evaluated once here, on
its device, and where its values prove it:

- true everywhere (boolean) or zero everywhere (additive): the call gets no mask;
- the lower triangle of a square (query length equal to key length; boolean, or additive with
  ``-inf`` or the dtype's lowest value above the diagonal): the call gets no mask and
  ``is_causal=True``, the same top-left alignment.

A mask the same along the key dimension (its last dim of one element, or of stride 0: a
per-query mask expanded over the keys), whatever its values and wherever it comes from, adds one
value to each row of scores. Softmax ignores it, except where the row is masked whole, which the
math path's safe softmax turns into a row of zeros. Such a call gets no mask, and its output rows
are zeroed where the mask drops them (``keep_rows``). Masks cross graph breaks this way: wav2vec
2.0's encoder, in transformers 5.17 with torch 2.11, breaks after building its all-true mask, so
each layer's attention took it as a graph input, (8, 1, 499, 499) bool of strides (0, 499, 1, 0),
and ran the math path: six fp32 products a layer, 6.7 ms of a 63 ms training step under fuse and
Inductor alike, slower than eager, which passes no mask (H100, 2026-11-28). The strides are the
graph input's, which Dynamo's guards fix.

Anything else is left as the model wrote it. ``metrics.attention_masks`` counts the calls
changed, by what they became (``none``, ``causal``, ``rows``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from fusebackend import metrics
from fusebackend.constants import constant_ancestry, evaluate

_SDPA = {torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_MASK_ARG = 3  # attn_mask's position in (query, key, value, attn_mask, dropout_p, is_causal, scale)
_MAX_NUMEL = 1 << 26  # a mask's producer larger than this is not evaluated at compile time


def _too_large(node: torch.fx.Node) -> bool:
    example = node.meta.get("example_value")
    return isinstance(example, torch.Tensor) and example.numel() > _MAX_NUMEL


def drop_constant_masks(gm: torch.fx.GraphModule) -> int:
    """Rewrite the SDPA calls of Dynamo's graph ``gm`` whose mask is a constant that masks
    nothing or is causal, or is the same along the keys (module docstring); returns how many
    calls changed."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        mask = _mask_arg(node)
        if not isinstance(mask, torch.fx.Node):
            continue
        if keep_rows(node, mask):
            changed += 1
            continue
        producers = constant_ancestry(mask, attributes=False)  # a get_attr may be a buffer that changes
        if producers is None or any(_too_large(n) for n in producers):
            continue
        env = evaluate(producers, gm)
        value = env.get(mask) if env is not None else None
        if not isinstance(value, torch.Tensor):
            continue
        became = _what_it_is(node, value)
        if became is None:
            continue
        _set_mask(node, None)
        if became == "causal":
            node.kwargs = {**node.kwargs, "is_causal": True}
        metrics.attention_masks[became] += 1
        _erase_unused(producers)
        changed += 1
    if changed:
        gm.recompile()
    return changed


def keep_rows(sdpa: torch.fx.Node, mask: torch.fx.Node) -> bool:
    """Where ``mask`` is the same along the keys, call ``sdpa`` without it and zero the output
    rows it drops whole (module docstring); whether it did."""
    example, query, key = _example(mask), *(_example(sdpa.args[i] if len(sdpa.args) > i else None) for i in (0, 1))
    if example is None or query is None or key is None or example.dim() < 1 or example.requires_grad:
        return False
    if not (example.dtype == torch.bool or example.is_floating_point()):
        return False
    length, stride = example.shape[-1], example.stride()[-1]
    if not (isinstance(length, int) and isinstance(stride, int) and (length == 1 or stride == 0)):
        return False  # a symbolic size or stride: not known to hold on every call
    scores = (*query.shape[:-1], key.shape[-2])
    try:
        if tuple(torch.broadcast_shapes(tuple(example.shape), scores)) != scores:
            return False
    except RuntimeError:
        return False
    if sdpa.kwargs.get("is_causal", sdpa.args[5] if len(sdpa.args) > 5 else False) is not False:
        return False
    graph = sdpa.graph
    with graph.inserting_before(sdpa):
        rows = graph.call_function(operator.getitem, (mask, (Ellipsis, slice(None, 1))))
    _set_mask(sdpa, None)
    with graph.inserting_before(sdpa.next):
        if example.dtype == torch.bool:
            zeroed = graph.call_function(torch.where, (rows, sdpa, 0.0))
        else:  # an additive mask: a row of -inf is dropped, one of NaN or +inf is NaN, as in softmax
            nan = graph.call_function(operator.mul, (rows, float("nan")))  # in the mask's dtype
            minus_inf = graph.call_function(operator.eq, (rows, float("-inf")))
            dropped = graph.call_function(torch.where, (minus_inf, 0.0, nan))
            zeroed = graph.call_function(torch.where, (graph.call_function(torch.isfinite, (rows,)), sdpa, dropped))
    sdpa.replace_all_uses_with(zeroed, delete_user_cb=lambda user: user is not zeroed)
    metrics.attention_masks["rows"] += 1
    return True


def _mask_arg(node: torch.fx.Node) -> Any:
    if "attn_mask" in node.kwargs:
        return node.kwargs["attn_mask"]
    return node.args[_MASK_ARG] if len(node.args) > _MASK_ARG else None


def _set_mask(node: torch.fx.Node, value: Any) -> None:
    if "attn_mask" in node.kwargs:
        node.kwargs = {**node.kwargs, "attn_mask": value}
    else:
        node.args = (*node.args[:_MASK_ARG], value, *node.args[_MASK_ARG + 1:])


def _what_it_is(sdpa: torch.fx.Node, mask: torch.Tensor) -> str | None:
    """"none" where ``mask`` masks nothing, "causal" where it is the square causal pattern and
    the call is not causal already, else None."""
    query, key = (_example(sdpa.args[i] if len(sdpa.args) > i else sdpa.kwargs.get(name))
                  for i, name in ((0, "query"), (1, "key")))
    if query is None or key is None:
        return None
    scores = (*query.shape[:-1], key.shape[-2])
    try:  # the mask must not widen the scores' shape (then it decides the output's)
        if tuple(torch.broadcast_shapes(tuple(mask.shape), scores)) != scores:
            return None
    except RuntimeError:
        return None
    if mask.dtype == torch.bool:
        keep, drop = mask, ~mask
    elif mask.is_floating_point():
        keep = mask == 0
        drop = (mask == float("-inf")) | (mask == torch.finfo(mask.dtype).min)
    else:
        return None
    if not bool((keep | drop).all()):
        return None
    if bool(keep.all()):
        return "none"
    length = scores[-1]
    causal_now = sdpa.kwargs.get("is_causal", sdpa.args[5] if len(sdpa.args) > 5 else False)
    if scores[-2] != length or causal_now is not False or mask.dim() < 2:
        return None
    lower = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    return "causal" if bool((keep == lower).all()) else None


def _example(arg: Any) -> torch.Tensor | None:
    if isinstance(arg, torch.fx.Node):
        example = arg.meta.get("example_value")
        return example if isinstance(example, torch.Tensor) else None
    return None


def _erase_unused(producers: list[torch.fx.Node]) -> None:
    for node in reversed(producers):
        if not node.users:
            node.graph.erase_node(node)

