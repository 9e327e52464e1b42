"""Values of an FX graph that depend on no input: found, evaluated once at compile time, folded.

A node is constant when it is a call whose arguments are constants or plain values, that draws no
random numbers and mutates nothing; in AOTAutograd's graphs a ``get_attr`` is a lifted constant
(``torch.tensor([...])`` in the model's code) and constant too. Two passes use them:

- ``attention_masks.py``, on Dynamo's graph (where a ``get_attr`` may be a buffer the user
  changes, so it is not constant): an attention mask built from ``arange``;
- ``fold_foreign``, on AOTAutograd's graph: tensors a CUDA graph makes on the CPU (``torch.arange``
  without a device, as BEiT's relative position index is made in every forward), which would
  otherwise be ATen calls on the CPU at every call and a synchronous copy to the GPU each
  (``ir.IRGraph.foreign``). Folded, each is a constant the compiled graph holds on its device.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.fx

_RANDOM = ("rand", "bernoulli", "normal", "uniform", "dropout", "exponential", "multinomial", "seed", "empty")
FOLD_LIMIT_BYTES = 16 << 20  # a larger value stays computed at each call


def is_constant_call(node: torch.fx.Node) -> bool:
    """Whether ``node`` computes the same value at every call from constant arguments: a call
    (function or method) that draws no random numbers, mutates nothing and is no higher-order op."""
    if node.op not in ("call_function", "call_method"):
        return False
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        return False
    if isinstance(target, torch._ops.OpOverload):
        if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
            return False
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if not isinstance(name, str) or any(word in name.lower() for word in _RANDOM):
        return False
    return not (node.op == "call_method" and name.endswith("_") and not name.startswith("__"))  # in place


def constant_ancestry(node: torch.fx.Node, attributes: bool) -> list[torch.fx.Node] | None:
    """The nodes ``node`` is computed from, itself included, in graph order, if all are
    constant (``attributes``: a ``get_attr`` counts as one); else None."""
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op == "get_attr" and attributes:
            continue
        if not is_constant_call(current):
            return None
        stack.extend(current.all_input_nodes)
    return [n for n in node.graph.nodes if n in seen]


def evaluate(nodes: Iterable[torch.fx.Node], gm: torch.fx.GraphModule) -> dict[torch.fx.Node, Any] | None:
    """Run ``nodes`` (constants, in graph order) eagerly on real tensors; their values, or None
    where one raises."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    env: dict[torch.fx.Node, Any] = {}

    def value(arg: Any) -> Any:
        return torch.fx.node.map_arg(arg, lambda n: env[n])

    try:
        with unset_fake_temporarily(), torch.no_grad():
            for node in nodes:
                if node.op == "get_attr":
                    env[node] = _attribute(gm, str(node.target))
                    continue
                args, kwargs = value(node.args), value(node.kwargs)
                if node.op == "call_method":
                    env[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
                else:
                    env[node] = node.target(*args, **kwargs)
    except Exception:  # anything unexpected: the nodes stay in the graph
        return None
    return env


def fold_foreign(gm: torch.fx.GraphModule, device: torch.device) -> int:
    """Replace the constant tensors of AOTAutograd's graph ``gm`` that are made on another device
    than ``device`` (the graph's) by constants of the graph module, evaluated here; returns how
    many. Only where the tensor is read by a node that is not itself such a constant (the
    frontier), and is at most ``FOLD_LIMIT_BYTES``."""
    foreign: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if (isinstance(value, torch.Tensor) and value.device != device and is_constant_call(node)
                and all(n in foreign or n.op == "get_attr" for n in node.all_input_nodes)):
            foreign.add(node)
    frontier = [n for n in foreign if any(u not in foreign for u in n.users)
                and all(u in foreign or _on(u, device) for u in n.users)  # read on the graph's device
                and n.meta["val"].numel() * n.meta["val"].element_size() <= FOLD_LIMIT_BYTES]
    if not frontier:
        return 0
    position = {n: k for k, n in enumerate(gm.graph.nodes)}
    ancestry = {a for n in frontier for a in constant_ancestry(n, attributes=True) or ()}
    needed = sorted(ancestry, key=position.__getitem__)
    env = evaluate(needed, gm)
    if env is None:
        return 0
    folded = 0
    for node in frontier:
        value = env.get(node)
        if not isinstance(value, torch.Tensor):
            continue
        name = f"_folded_constant{folded}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value.detach().clone(), persistent=False)
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta.update(node.meta)
        node.replace_all_uses_with(attr)
        gm.graph.erase_node(node)
        folded += 1
    for node in reversed(needed):  # what only the folded nodes read
        if node.graph is gm.graph and not node.users and node not in frontier:
            gm.graph.erase_node(node)
    gm.recompile()
    return folded


def _on(node: torch.fx.Node, device: torch.device) -> bool:
    values = [v for v in torch.utils._pytree.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
    return bool(values) and all(v.device == device for v in values)


def _attribute(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value
