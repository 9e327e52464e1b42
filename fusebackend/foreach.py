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
calls over more than ``MAX_TENSORS`` tensors (the scheduler's time; see there).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

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
