"""``torch._foreach_*`` ops as the per-tensor ops they stand for.

PyTorch's optimizers (``foreach=True``, the default on a GPU) update every parameter with one
``_foreach_*`` call per step of the formula: ``_foreach_mul(exp_avgs, beta1)``,
``_foreach_addcdiv(params, exp_avgs, denoms, step_sizes)``... Each is, element of its lists by
element, the op of the same name without the prefix (``aten.mul``, ``aten.addcdiv``). Left whole
they are ATen calls that fuse cannot see into; decomposed here, before lowering, into those
per-tensor ops, each parameter's update becomes pointwise nodes that fuse with the rest of its
step (the moments' updates, the parameter's, its copy back in place).

``decompositions()`` covers every functional overload (not ``_out``, not in place: AOTAutograd's
functional graphs hold the functional ones) whose per-tensor op exists, generically from its
schema: the arguments that are lists (``Tensor[]``, ``Scalar[]``) are taken element by element,
the others (a scalar, a 0-dim tensor, ``alpha``) passed to every call. ``_foreach_norm`` is
``linalg_vector_norm``, ``_foreach_max`` the maximum of each tensor, and ``_foreach_addcmul`` and
``_foreach_addcdiv`` ``self + value * (tensor1 op tensor2)``, whose value may be a 0-dim tensor
(``.Tensor``: one element of a 1-dim tensor per tensor of the lists). Left as ATen calls:
``_foreach_mm`` and ``_foreach_powsum``, any foreach op whose per-tensor op is unknown, and
calls over more than ``MAX_TENSORS`` tensors (the scheduler's time; see there). Those calls
update the graph's inputs in place where their results are only copied back into them
(``in_place_chains``, before lowering), as eager's optimizers do, and each run of them becomes
one generated kernel over every tensor of the lists (``lowering/foreach_lists.py``).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx

aten = torch.ops.aten

_PREFIX = "_foreach_"
# Lists of more tensors stay whole ATen calls: each tensor's update is several nodes, and a
# compiled step's time grows with them. A compiled AdamW step (foreach) over 8, 16, 32 and 64
# small tensors spent 0.26, 0.76, 1.63 and 3.12 s scheduling, and at 64 tensors 5.5 s in
# AOTAutograd and 1.4 s lowering (CPU, 2 cores, 2026-11-27; before the step counters' copies
# stopped ordering every node against every other, scheduling grew with the square: 17.3 s at
# 40). Whole, the ATen call is one multi-tensor kernel per op.
MAX_TENSORS = 16
# per-tensor ops under another name
_RENAMED = {"norm": "linalg_vector_norm"}
# not an op per tensor with the same arguments
_SKIPPED = {"mm", "powsum"}


def _is_list(arg: torch._C.Argument) -> bool:
    return isinstance(arg.type, torch._C.ListType)


def _per_tensor(name: str, overload: torch._ops.OpOverload) -> Callable[..., Any] | None:
    base_name = _RENAMED.get(name, name)
    base = getattr(aten, base_name, None)
    if base is None:
        return None
    schema = overload._schema
    listed = [a.name for a in schema.arguments if _is_list(a)]
    names = [a.name for a in schema.arguments]
    # addcmul's and addcdiv's ``.Tensor`` overloads take their scalars as one 1-dim tensor, an
    # element per tensor of the lists
    per_element = {"scalars"} if name in ("addcmul", "addcdiv") else set()

    def per_tensor(*args: Any, **kwargs: Any) -> list[Any]:
        bound = dict(zip(names, args)) | kwargs
        count = len(bound[next(n for n in listed if n in bound)])
        if count > MAX_TENSORS:
            return NotImplemented  # stays the ATen call (MAX_TENSORS says why)
        out = []
        for k in range(count):
            each = {n: (v[k] if n in listed or n in per_element else v) for n, v in bound.items()}
            positional = [each.pop(a.name) for a in schema.arguments if not a.kwarg_only and a.name in each]
            out.append(_call(name, base, positional, each))
        return out

    per_tensor.__name__ = f"per_tensor_{name}_{overload._overloadname}"
    return per_tensor


def _call(name: str, base: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if name in ("addcmul", "addcdiv"):  # (self, tensor1, tensor2, value or scalars) -> self + value * (t1 op t2)
        self, tensor1, tensor2, *rest = args
        value = rest[0] if rest else next(iter(kwargs.values()), 1)
        product = (aten.mul if name == "addcmul" else aten.div)(tensor1, tensor2)
        return aten.add(self, aten.mul(product, value))
    if name == "norm":  # (self, ord, dtype) -> linalg_vector_norm(self, ord, dim=None, keepdim=False, dtype)
        return base(args[0], args[1] if len(args) > 1 else kwargs.get("ord", 2), dtype=kwargs.get("dtype",
                    args[2] if len(args) > 2 else None))
    if name == "max":  # the maximum of each tensor
        return aten.max.default(args[0])
    return base(*args, **kwargs)


def decompositions() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """Each functional ``_foreach_*`` overload -> the per-tensor calls it stands for."""
    table = {}
    names = sorted({n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                    if n.startswith("aten::" + _PREFIX)})
    for full in names:
        name = full[len(_PREFIX):]
        if full.endswith("_") or name in _SKIPPED:
            continue
        packet = getattr(aten, full)
        for overload_name in packet.overloads():
            overload = getattr(packet, overload_name)
            if overload._schema.is_mutable or overload_name.endswith("out"):
                continue
            fn = _per_tensor(name, overload)
            if fn is not None:
                table[overload] = fn
    return table


def in_place_chains(gm: torch.fx.GraphModule) -> int:
    """Chains of functional ``_foreach_*`` calls left whole (lists of more than ``MAX_TENSORS``)
    whose last results are copied back into the graph's inputs, rewritten as the in-place calls
    eager makes; returns how many calls were rewritten.

    AOTAutograd's functional graph of ``opt.step`` writes each updated list into new tensors and
    copies them back into the parameters and states (``copy_``), so a step over N tensors makes
    N copies per list updated, each reading and writing the whole tensor again, and N launches.
    ``_foreach_mul(bufs, m) -> _foreach_add(that, grads) -> copy_(bufs[i], ...)`` becomes
    ``_foreach_mul_(bufs, m); _foreach_add_(bufs, grads)``, and readers of the chain's last
    results read ``bufs``. The lowering makes each an ATen call that mutates (a barrier no node
    moves across, ``scheduler/groups.py``). Taken only where, for the inputs ``P`` of a chain:

    - every result of the chain's last call is copied into an element of ``P`` (one each), is not
      returned, and nothing uses those copies;
    - each call's list argument ``self`` is ``P`` (the first) or the previous call's results,
      which nothing else uses;
    - no call reads ``P`` in another argument, and nothing reads ``P`` after the first call.
    """
    graph = gm.graph
    rewritten = 0
    removed: set[torch.fx.Node] = set()
    for last in [n for n in graph.nodes if _functional_foreach(n) is not None]:
        if last in removed:  # a call of a chain rewritten before
            continue
        # the order again for each chain: a rewritten chain's in-place calls are new nodes
        chain = _chain(last, {n: k for k, n in enumerate(graph.nodes)})
        if chain is None:
            continue
        calls, inputs, copies = chain
        removed.update(calls)
        for call in calls:
            in_place = _functional_foreach(call)
            with graph.inserting_before(call):
                new = graph.call_function(in_place, (list(inputs), *call.args[1:]), dict(call.kwargs))
            new.meta = {k: v for k, v in call.meta.items() if k not in ("val", "tensor_meta")}
            new.meta["val"] = None
        for copy in copies:
            graph.erase_node(copy)
        for k, getter in enumerate(_getters(calls[-1])):
            getter.replace_all_uses_with(inputs[k])
        for call in reversed(calls):
            for getter in _getters(call):
                graph.erase_node(getter)
            graph.erase_node(call)
        rewritten += len(calls)
    if rewritten:
        graph.lint()
        gm.recompile()
    return rewritten


def _functional_foreach(node: torch.fx.Node) -> torch._ops.OpOverload | None:
    """The in-place overload of a functional ``_foreach_*`` call, or None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    name = target.overloadpacket.__name__
    if not name.startswith(_PREFIX) or name.endswith("_") or target._schema.is_mutable:
        return None
    packet = getattr(aten, name + "_", None)
    overload = getattr(packet, target._overloadname, None) if packet is not None else None
    if overload is None or not node.args or not isinstance(node.args[0], (list, tuple)):
        return None
    return overload


def _getters(call: torch.fx.Node) -> list[torch.fx.Node]:
    """The ``getitem`` users of a call returning a list, by index; every user must be one."""
    found: dict[int, torch.fx.Node] = {}
    for user in call.users:
        if user.target is not operator.getitem or user.args[0] is not call or not isinstance(user.args[1], int):
            return []
        found[user.args[1]] = user
    return [found[k] for k in sorted(found)] if sorted(found) == list(range(len(call.args[0]))) else []


def _chain(last: torch.fx.Node, order: dict[torch.fx.Node, int]
           ) -> tuple[list[torch.fx.Node], list[torch.fx.Node], list[torch.fx.Node]] | None:
    """The calls of the chain ending at ``last`` (first first), the inputs they update, and the
    ``copy_`` nodes that copy ``last``'s results into them; None where the rewrite does not hold."""
    getters = _getters(last)
    if not getters:
        return None
    inputs: list[torch.fx.Node] = []
    copies: list[torch.fx.Node] = []
    for getter in getters:
        if any(u.op == "output" for u in getter.users):  # returned: a tensor of its own, not the input
            return None
        copy = [u for u in getter.users if u.target is aten.copy_.default and u.args[1] is getter]
        if len(copy) != 1 or copy[0].users or copy[0].args[0].op != "placeholder":
            return None
        copies.append(copy[0])
        inputs.append(copy[0].args[0])
    if len(set(inputs)) != len(inputs):
        return None
    calls = [last]
    while True:
        first = calls[0]
        self_list = list(first.args[0])
        if self_list == inputs:
            break
        previous = self_list[0].args[0] if self_list and self_list[0].target is operator.getitem else None
        if previous is None or _functional_foreach(previous) is None or _getters(previous) != self_list:
            return None
        if any(len(g.users) != 1 for g in self_list):  # read by ``first`` alone
            return None
        calls.insert(0, previous)
    start = order[calls[0]]
    members = set(calls)
    for call in calls:
        others = list(call.args[1:]) + list(call.kwargs.values())
        if set(_leaves(others)) & set(inputs):
            return None
    for p in inputs:
        for user in p.users:
            if user in members or user in copies:
                continue
            if order[user] > start:
                return None
    return calls, inputs, copies


def _leaves(args: Any) -> list[torch.fx.Node]:
    """The FX nodes in ``args`` (lists and dicts walked)."""
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(args, lambda n: found.append(n) or n)
    return found
