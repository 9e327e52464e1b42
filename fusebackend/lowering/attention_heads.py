"""Grouped-query attention without the repeated keys and values, on the ATen graph.

A model whose attention has fewer key/value heads than query heads (Llama, Mistral, Qwen2,
Gemma...) repeats each key/value head for its group of query heads before calling
``scaled_dot_product_attention``: in transformers, ``repeat_kv`` expands a new axis and reshapes
it into the heads. Traced, that is ``unsqueeze(x, 2)``, ``expand``, ``clone`` and ``view``: a copy
of the keys and one of the values, each as many times larger as the group, written and read again
by the attention kernel. In a decode step over a static cache it copies the whole cache, twice,
every layer and every token.

``scaled_dot_product_attention(..., enable_gqa=True)`` takes the unrepeated heads and maps query
head ``h`` to key/value head ``h // group``, as the repeat does, and the flash and cuDNN kernels
read the cache in place. On an H100 (torch 2.11, 2026-11-28), bf16, 32 query and 8 key/value
heads of 64, one query position, a boolean mask, each call eager: batch 1 over 192 positions
91.3 us with the repeat against 16.7 us; batch 16 over 1024 positions 222.4 against 31.3 us;
the same outputs. The decode step of Llama 3.2 1B's shapes at batch 1 (``benchmarks.generate``,
lean loop, same H100 and day): 1.278 ms with the copies, 1.220-1.223 without (three processes).

``share_kv_heads`` rewrites each attention call of an inference graph whose keys and values are
such repeats: the call becomes ``aten.scaled_dot_product_attention`` on the unrepeated tensors
with ``enable_gqa=True``, an extern that picks its kernel at run time as eager's call does. Only
where the call's first output (the attention) is all the graph reads of it: a training graph's
forward returns the log-sum-exp its backward needs, and keeps the call it traced. Only over sizes
that are numbers (a symbolic size is left as traced), and without dropout.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
import torch.fx

from fusebackend import metrics
from fusebackend.lowering.registry import bind_arguments

aten = torch.ops.aten

# The attention kernels tracing may pick, and the name each gives its mask argument.
_KERNELS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: "attn_mask",
    aten._scaled_dot_product_efficient_attention.default: "attn_bias",
    aten._scaled_dot_product_cudnn_attention.default: "attn_bias",
    aten._scaled_dot_product_flash_attention.default: None,
}
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def share_kv_heads(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm``'s attention calls over repeated key/value heads (module docstring);
    returns how many changed."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _KERNELS:
            continue
        args = bind_arguments(node.target, node.args, node.kwargs)
        if args.get("dropout_p", 0.0) != 0.0:
            continue
        if not all(user.target is operator.getitem and user.args[1] == 0 for user in node.users):
            continue
        query = _value(args["query"])
        key, value = _repeated(args["key"]), _repeated(args["value"])
        if query is None or key is None or value is None or key[1] != value[1]:
            continue
        heads = key[1] * _value(key[0]).shape[1]
        if query.dim() != 4 or not isinstance(query.shape[1], int) or query.shape[1] != heads:
            continue
        mask_name = _KERNELS[node.target]
        kwargs = {
            "attn_mask": args.get(mask_name) if mask_name else None,
            "dropout_p": 0.0,
            "is_causal": bool(args.get("is_causal", False)),
            "scale": args.get("scale"),
            "enable_gqa": True,
        }
        inputs = (args["query"], key[0], value[0])
        example = _example(inputs, kwargs)
        if example is None:
            continue
        graph = gm.graph
        with graph.inserting_before(node):
            call = graph.call_function(aten.scaled_dot_product_attention.default, inputs, kwargs)
        call.meta = {**node.meta, "val": example}
        for user in list(node.users):
            user.replace_all_uses_with(call)
            graph.erase_node(user)
        repeats = [args["key"], args["value"]]
        graph.erase_node(node)
        for view in repeats:
            _erase_unused_chain(view)
        metrics.attention_masks["gqa"] += 1
        changed += 1
    if changed:
        gm.recompile()
    return changed


def _value(arg: Any) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _repeated(arg: Any) -> tuple[torch.fx.Node, int] | None:
    """``(x, group)`` where ``arg`` is ``view(clone(expand(unsqueeze(x, 2), [B, H, group, S,
    D])), [B, H * group, S, D])`` (or the view of the expand itself) over sizes that are
    numbers, with a group of 2 or more."""
    if not (isinstance(arg, torch.fx.Node) and arg.target in _VIEWS):
        return None
    expand = arg.args[0]
    if (isinstance(expand, torch.fx.Node) and expand.target == aten.clone.default
            and expand.kwargs.get("memory_format", torch.contiguous_format) in (torch.contiguous_format, None)):
        expand = expand.args[0]  # the copy the view needs (with one key/value head the view needs none)
    if not (isinstance(expand, torch.fx.Node) and expand.target == aten.expand.default):
        return None
    unsqueeze = expand.args[0]
    if not (isinstance(unsqueeze, torch.fx.Node) and unsqueeze.target == aten.unsqueeze.default
            and unsqueeze.args[1] in (2, -3)):
        return None
    base, out = _value(unsqueeze.args[0]), _value(arg)
    if base is None or out is None or base.dim() != 4 or out.dim() != 4:
        return None
    sizes = [*base.shape, *out.shape, *_value(expand).shape]
    if not all(isinstance(s, int) for s in sizes):
        return None
    b, h, s, d = base.shape
    group = _value(expand).shape[2]
    if tuple(_value(expand).shape) != (b, h, group, s, d) or tuple(out.shape) != (b, h * group, s, d) or group < 2:
        return None
    return unsqueeze.args[0], group


def _example(inputs: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The new call's result on the traced (fake) values, or None where it cannot be made."""
    values = [_value(a) for a in inputs]
    mask = kwargs["attn_mask"]
    mask_value = _value(mask) if mask is not None else None
    if any(v is None for v in values) or (mask is not None and mask_value is None):
        return None
    fake_mode = torch._guards.detect_fake_mode(values)
    try:
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            return aten.scaled_dot_product_attention.default(*values, **{**kwargs, "attn_mask": mask_value})
    except Exception:  # a combination this torch's attention refuses: left as traced
        return None


def _erase_unused_chain(node: torch.fx.Node) -> None:
    """Erase ``node`` and then each producer of the repeat that no longer has users."""
    graph = node.graph
    chain = (*_VIEWS, aten.clone.default, aten.expand.default, aten.unsqueeze.default)
    while isinstance(node, torch.fx.Node) and not node.users and node.target in chain:
        producer = node.args[0]
        graph.erase_node(node)
        node = producer
