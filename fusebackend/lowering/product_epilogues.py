"""A product's bias and activation in cuBLASLt's epilogue, on the ATen graph.

A linear layer followed by ReLU or tanh-approximated GELU (GPT-2's, Phi's and GPT-J's MLP, OPT's
and T5's ReLU) is ``addmm(bias, x, w)`` and then pointwise ops on its output. fuse calls cuBLAS
for the product, which writes the output, and generates a kernel that reads it back for the
activation. cuBLASLt applies the bias and the activation to its accumulators before it stores
them: ``aten._addmm_activation(bias, x, w, use_gelu=...)``, one call, the output written once
and never read again. ``benchmarks/studies/epilogue_gemm.py`` (H200, bf16, 2026-11-28): GPT-2's
MLP up projection with its GELU (8192 x 768 x 3072) took 88.9 us as cuBLAS and a kernel, 69.3
us as cuBLASLt's epilogue, and 91.7 us as the best of five generated Triton GEMMs with the
epilogue in them.

``fold_activations`` rewrites each such pair: the product's output read by nothing but a chain of
pointwise ops (through views), ending in one value, that computes ``relu`` or ``gelu_tanh`` of
it. Which function the chain computes is decided by evaluating it, in float64, on a grid of
values and comparing with each (``_identify``), so that every way a model writes the formula
(``F.gelu(approximate="tanh")``, transformers' ``NewGELUActivation`` as eight ops, ``FastGELU``)
is found, and an exact (erf) GELU, which differs by up to 1e-3, is not. The activation is then
computed on the fp32 accumulators, not on the product rounded to the dtype as eager computes
it: within the dtype's rounding of eager's value.

In a training graph the product's output stays where the backward needs it (GELU's gradient
reads its input: the output has another reader, and is left as traced); ReLU's gradient reads
the activation's output, which the call returns, so a ReLU folds in training too. Not for
products of ``config.row_products`` rows or fewer (a decode step's, generated with their
epilogue, ``matmuls._row_product``). ``config.product_epilogues``: ``auto`` rewrites on a GPU
in half precision (the default), ``always`` on every device and dtype (the tests, on the CPU,
where ATen computes the call as the product and then the activation), ``never`` leaves every
product as traced. GELU only on a GPU: ATen's CPU kernel of the call computes the exact GELU
(``tanh_gelu_epilogue``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
import torch.fx

from fusebackend.config import config

aten = torch.ops.aten

MODES = ("auto", "always", "never")

# Ops a chain from the product's output to its activation may hold: pointwise on one tensor
# (with numbers), and casts between floating dtypes. Views pass the shape through unchanged.
_POINTWISE = {
    aten.mul.Tensor, aten.mul.Scalar, aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar,
    aten.div.Tensor, aten.div.Scalar, aten.pow.Tensor_Scalar, aten.tanh.default, aten.neg.default,
    aten.relu.default, aten.gelu.default, aten.clamp_min.default, aten.clamp.default, aten.maximum.default,
    aten.where.self, aten.gt.Scalar, aten.ge.Scalar, aten.lt.Scalar, aten.le.Scalar,
    aten._to_copy.default, torch.ops.prims.convert_element_type.default,
}
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_MAX_CHAIN = 24  # ops in a chain (NewGELUActivation is eight, with casts a dozen)

_PROBE = torch.linspace(-8.0, 8.0, 2001, dtype=torch.float64)
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
}


def fold_activations(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm``'s products followed by ReLU or tanh-GELU into one ``_addmm_activation``
    each (module docstring); returns how many."""
    if config.product_epilogues not in MODES:
        raise ValueError(f"FUSE_PRODUCT_EPILOGUES={config.product_epilogues!r}: choose from {', '.join(MODES)}")
    if config.product_epilogues == "never":
        return 0
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.addmm.default and _eligible(node):
            changed += _fold(gm, node)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _eligible(node: torch.fx.Node) -> bool:
    bias, mat1, mat2 = node.args[:3]
    if node.args[3:] or any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")):
        return False
    vals = [getattr(n, "meta", {}).get("val") for n in (node, bias, mat1, mat2)]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    out, b, x, w = vals
    if any(not isinstance(s, int) for v in vals for s in v.shape):
        return False  # symbolic sizes: left as traced
    if b.dim() != 1 or b.shape[0] != out.shape[1] or not b.is_contiguous() or x.shape[0] <= max(config.row_products, 1):
        return False
    if any(size * out.element_size() % 16 for size in (x.shape[1], out.shape[1])):
        return False  # rows not 16-byte aligned: a product ``matmuls`` pads for cuBLAS's fast kernels
    if config.product_epilogues == "always":
        return out.dtype.is_floating_point
    return out.device.type == "cuda" and out.dtype in (torch.bfloat16, torch.float16)


def _fold(gm: torch.fx.GraphModule, product: torch.fx.Node) -> int:
    for views, ops, sink in _chains(product):
        found = _identify(product, views, ops, sink)
        if found is not None:
            break
    else:
        return 0
    if found == "gelu_tanh" and not tanh_gelu_epilogue(product.meta["val"].device):
        return 0
    graph = gm.graph
    with graph.inserting_after(product):
        fused = graph.call_function(aten._addmm_activation.default, tuple(product.args[:3]),
                                    {"use_gelu": found == "gelu_tanh"})
    fused.meta = dict(product.meta)
    out = fused
    for view in views:  # the same views of the fused output
        with graph.inserting_after(out):
            out = graph.call_function(view.target, (out, *view.args[1:]), dict(view.kwargs))
        out.meta = dict(view.meta)
    sink.replace_all_uses_with(out)
    for node in reversed([product, *views, *ops]):
        if not node.users:
            graph.erase_node(node)
    return 1


def tanh_gelu_epilogue(device: torch.device) -> bool:
    """Whether ``_addmm_activation(use_gelu=True)`` computes the tanh-approximated GELU on
    ``device``: on a GPU (cuBLASLt's epilogue, or ATen's ``gelu_(..., "tanh")`` after the product
    where cuBLASLt is not used); ATen's CPU kernel computes the exact (erf) GELU."""
    return device.type == "cuda"


def _chains(product: torch.fx.Node) -> Iterator[tuple[list[torch.fx.Node], list[torch.fx.Node], torch.fx.Node]]:
    """The ways to end a chain at the product's output: the views of the output (each its only
    reader), the pointwise ops computed from the last of them alone (in graph order), and the
    last of those ops, whose value may be read elsewhere; the latest ends first. None where
    anything else reads the output or an op of the chain before its end."""
    views: list[torch.fx.Node] = []
    start = product
    while len(start.users) == 1 and next(iter(start.users)).target in _VIEWS:
        start = next(iter(start.users))
        views.append(start)
    # every pointwise op reachable from the start, then less those that read anything else
    ops: set[torch.fx.Node] = set()
    frontier = [start]
    while frontier and len(ops) <= _MAX_CHAIN:
        for user in frontier.pop().users:
            if user not in ops and user.op == "call_function" and user.target in _POINTWISE:
                ops.add(user)
                frontier.append(user)
    if len(ops) > _MAX_CHAIN:
        return
    while True:
        outside = {n for n in ops if any(isinstance(a, torch.fx.Node) and a is not start and a not in ops
                                         for a in _flat_args(n))}
        if not outside:
            break
        ops -= outside
    if any(u not in ops for u in start.users):
        return  # the output itself has another reader
    # the chain's end: the last op that every op before it feeds alone (later ops read its value
    # only, as ReLU's ``le`` mask for the backward does, and stay)
    order = {n: i for i, n in enumerate(product.graph.nodes)}
    for sink in sorted(ops, key=order.__getitem__, reverse=True):
        chain = _ancestors(sink, start, ops)
        if chain is None or any(u not in chain for n in chain if n is not sink for u in n.users):
            continue
        if any(u not in chain for u in start.users):
            continue
        val, want = sink.meta.get("val"), product.meta["val"]
        if isinstance(val, torch.Tensor) and val.dtype == want.dtype and tuple(val.shape) == tuple(start.meta["val"].shape):
            yield views, sorted(chain, key=order.__getitem__), sink


def _ancestors(sink: torch.fx.Node, start: torch.fx.Node, ops: set[torch.fx.Node]) -> set[torch.fx.Node] | None:
    """The ops ``sink`` is computed from (itself included), back to ``start``."""
    found, frontier = {sink}, [sink]
    while frontier:
        for a in _flat_args(frontier.pop()):
            if isinstance(a, torch.fx.Node) and a is not start and a not in found:
                if a not in ops:
                    return None
                found.add(a)
                frontier.append(a)
    return found


def _flat_args(node: torch.fx.Node) -> list[Any]:
    return [*node.args, *node.kwargs.values()]


def _identify(product: torch.fx.Node, views: list[torch.fx.Node], ops: list[torch.fx.Node],
              sink: torch.fx.Node) -> str | None:
    """Which of ``_ACTIVATIONS`` the chain computes, by its values in float64 on ``_PROBE``."""
    start = views[-1] if views else product
    values: dict[torch.fx.Node, Any] = {start: _PROBE}

    def value(a: Any) -> Any:
        return values[a] if isinstance(a, torch.fx.Node) else a

    try:
        for node in ops:
            args = [value(a) for a in node.args]
            kwargs = {k: value(v) for k, v in node.kwargs.items()}
            if node.target in (aten._to_copy.default, torch.ops.prims.convert_element_type.default):
                out = args[0]  # a cast between floating dtypes: the value, in float64 here
                dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
                if dtype is not None and not dtype.is_floating_point:
                    return None
            else:
                out = node.target(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or out.shape != _PROBE.shape:
                return None
            values[node] = out.double() if out.dtype.is_floating_point else out
    except Exception:  # an op that takes no float64 probe: not an activation this knows
        return None
    got = values[sink]
    for name, fn in _ACTIVATIONS.items():
        want = fn(_PROBE)
        if torch.allclose(got, want, rtol=1e-6, atol=1e-6):
            return name
    return None
