"""Graphs that AOTAutograd cannot trace whole: the op that fails runs alone, the rest is compiled.

Some ops cannot be traced ahead of their inputs' values: ``torch.narrow`` with a start given as a
tensor, ``torch.tensor_split`` with split points in a tensor. Their output shape is read from the
data (``.item()``), and AOTAutograd's trace raises (``DataDependentOutputException``). Rather than
run Dynamo's whole graph eagerly, ``split_at_failure`` cuts it in three around the node that
failed (the trace names it: "While executing %node"):

- the nodes before it, compiled with ``fuse`` on the first call's values;
- the node alone, run eagerly (an ATen call, counted in ``metrics.fallbacks``);
- the nodes after it, compiled with ``fuse`` for each signature of their inputs, because those
  inputs' shapes may change from call to call with the data; a suffix that sees more than
  ``MAX_SIGNATURES`` of them runs eagerly from then on.

A part that fails again is split again (``fuse`` calls back here), up to ``MAX_SPLITS`` cuts in one
graph. Each part is an AOTAutograd function of its own, so autograd links them through real
tensors, as it links any two functions.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from fusebackend import metrics
from fusebackend.signature import input_key

log = logging.getLogger(__name__)

MAX_SPLITS = 8
MAX_SIGNATURES = 8

_NODE_NAMED = re.compile(r"While executing %(\w+)")


def failing_node(gm: torch.fx.GraphModule, exc: BaseException) -> torch.fx.Node | None:
    """The call node the failed trace names, searching the exception's chain and notes."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for text in [str(error), *getattr(error, "__notes__", [])]:
            for name in _NODE_NAMED.findall(text):
                for node in gm.graph.nodes:
                    if node.name == name and node.op in ("call_function", "call_method", "call_module"):
                        return node
        error = error.__cause__ or error.__context__
    return None


def op_label(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)


def _signature(args: Sequence[Any]) -> tuple:
    return input_key(args), tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


class CompiledPart(torch.nn.Module):
    """A part of a split graph, compiled with ``compile_fn`` on its first call with each signature.

    Run eagerly beyond ``MAX_SIGNATURES`` signatures (after one warning): a part whose input shapes
    follow the data would otherwise compile without end.
    """

    def __init__(self, gm: torch.fx.GraphModule, compile_fn: Callable[..., Callable[..., Any]],
                 name: str) -> None:
        super().__init__()
        # AOTAutograd takes graphs that return a tuple; split_module's parts return a lone value bare
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        self.bare = not isinstance(output.args[0], (tuple, list))
        if self.bare:
            output.args = ((output.args[0],),)
            gm.recompile()
        self.gm = gm
        self.compile_fn = compile_fn
        self.part_name = name
        self.compiled: dict[tuple, Callable[..., Any]] = {}
        self.eager = False

    def forward(self, *args: Any) -> Any:
        out = self._run(args)
        return out[0] if self.bare else out

    def _run(self, args: tuple) -> Any:
        if self.eager:
            return self.gm(*args)
        key = _signature(args)
        run = self.compiled.get(key)
        if run is None:
            if len(self.compiled) >= MAX_SIGNATURES:
                warnings.warn(
                    f"fusebackend: {self.part_name} of a split graph met {MAX_SIGNATURES + 1} input "
                    "signatures (shapes that follow the data); running it eagerly from now on",
                    stacklevel=2,
                )
                metrics.eager_graphs += 1
                self.eager = True
                return self.gm(*args)
            run = self.compile_fn(self.gm, list(args))
            self.compiled[key] = run
        return run(*args)


def split_at_failure(gm: torch.fx.GraphModule, exc: BaseException,
                     compile_fn: Callable[..., Callable[..., Any]]) -> torch.fx.GraphModule | None:
    """``gm`` cut around the node its failed trace names, with the parts before and after it
    compiled by ``compile_fn`` (lazily); None if no node is named or the graph is cut enough."""
    node = failing_node(gm, exc)
    depth = getattr(gm, "_fuse_splits", 0)
    if node is None or depth >= MAX_SPLITS:
        return None
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    at = order[node]

    def part(n: torch.fx.Node) -> int:
        return 0 if order[n] < at else 1 if n is node else 2

    # Without the fake values Dynamo left in the nodes' meta: split_module would track the free
    # symbols of each (a narrow's symbolic storage offset has no node that defines it), and the
    # parts are traced again on real values anyway.
    kept = {n: {k: n.meta.pop(k) for k in ("example_value", "val") if k in n.meta} for n in gm.graph.nodes}
    try:
        split = split_module(gm, gm, part, keep_original_order=True)
    finally:
        for n, meta in kept.items():
            n.meta.update(meta)
    label = op_label(node)
    metrics.fallbacks[label] += 1
    log.info("fusebackend: %s cannot be traced ahead of its values (%s: %s); it runs as an ATen "
             "call and the graph around it is compiled", label, type(exc).__name__, exc)
    for index, role in ((0, "the part before"), (2, "the part after")):
        name = f"submod_{index}"
        sub = getattr(split, name, None)
        if sub is None:
            continue
        sub._fuse_splits = depth + 1
        split._modules[name] = CompiledPart(sub, compile_fn, f"{role} {label}")
    return split
