"""The table of lowerings: ATen op overload -> function that builds a node body.

A lowering is ``fn(ctx, **args) -> Expr`` where ``args`` are the op's schema arguments by name
(defaults filled in), tensors given as ``TensorArg`` and everything else as Python values. It
raises ``Unsupported`` for a case it does not handle; the op then becomes an extern ATen call.
Registering an op twice raises.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

Lowering = Callable[..., Any]

POINTWISE: dict[torch._ops.OpOverload, Lowering] = {}
REDUCTIONS: dict[torch._ops.OpOverload, Lowering] = {}


class Unsupported(Exception):
    """This op (or this use of it) has no lowering; it falls back to the ATen call."""


def _register(table: dict, ops: tuple[Any, ...]) -> Callable[[Lowering], Lowering]:
    def decorator(fn: Lowering) -> Lowering:
        for op in ops:
            overloads = (
                [getattr(op, name) for name in op.overloads()]
                if isinstance(op, torch._ops.OpOverloadPacket)
                else [op]
            )
            for overload in overloads:
                if overload in POINTWISE or overload in REDUCTIONS:
                    raise RuntimeError(f"a lowering for {overload} is already registered")
                table[overload] = fn
        return fn

    return decorator


def register_pointwise(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Register a pointwise lowering for op overloads (or every overload of a packet)."""
    return _register(POINTWISE, ops)


def register_reduction(*ops: Any) -> Callable[[Lowering], Lowering]:
    return _register(REDUCTIONS, ops)


def bind_arguments(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Name every schema argument of a call, defaults included."""
    bound: dict[str, Any] = {}
    schema_args = op._schema.arguments
    for k, arg in enumerate(schema_args):
        if k < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[k]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            raise Unsupported(f"{op}: missing argument {arg.name}")
    return bound
