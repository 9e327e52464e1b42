"""The table of lowerings: ATen op overload -> function that builds a node body.

Two kinds, both called with the op's schema arguments by name (defaults filled in), tensors as
``TensorArg`` and everything else as Python values:

- pointwise: ``fn(ctx, **args) -> Expr``, the body of one node over the output's index;
- composite: ``fn(builder, **args) -> TensorArg | tuple``, which adds any number of nodes through
  the builder (``GraphLowering.reduce`` and ``GraphLowering.pointwise``); reductions are these.

Either raises ``Unsupported`` for a case it does not handle; the op then becomes an extern ATen
call. Registering an op twice raises.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

Lowering = Callable[..., Any]

POINTWISE: dict[torch._ops.OpOverload, Lowering] = {}
COMPOSITE: dict[torch._ops.OpOverload, Lowering] = {}
# lowerings that build right over symbolic sizes (``symbolic_sizes.py``)
SYMBOLIC: set[torch._ops.OpOverload] = set()


class Unsupported(Exception):
    """This op (or this use of it) has no lowering; it falls back to the ATen call."""


def _register(table: dict, ops: tuple[Any, ...], symbolic: bool = False) -> Callable[[Lowering], Lowering]:
    def decorator(fn: Lowering) -> Lowering:
        for op in ops:
            overloads = (
                [getattr(op, name) for name in op.overloads()]
                if isinstance(op, torch._ops.OpOverloadPacket)
                else [op]
            )
            for overload in overloads:
                if overload in POINTWISE or overload in COMPOSITE:
                    raise RuntimeError(f"a lowering for {overload} is already registered")
                table[overload] = fn
                if symbolic:
                    SYMBOLIC.add(overload)
        return fn

    return decorator


def register_pointwise(*ops: Any, symbolic: bool = False) -> Callable[[Lowering], Lowering]:
    """Register a pointwise lowering for op overloads (or every overload of a packet);
    ``symbolic``: as ``register_elementwise``."""
    return _register(POINTWISE, ops, symbolic)


def register_elementwise(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Register a pointwise lowering that reads its arguments at the output's index and uses
    no size: right over symbolic sizes too (``SYMBOLIC``)."""
    return _register(POINTWISE, ops, True)


def register_composite(*ops: Any, symbolic: bool = False) -> Callable[[Lowering], Lowering]:
    """Register a lowering that builds several nodes (reductions, normalizations...);
    ``symbolic``: it builds right over symbolic sizes too (``SYMBOLIC``)."""
    return _register(COMPOSITE, ops, symbolic)


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


def is_view_op(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    if schema.is_mutable or not schema.returns:
        return False
    info = schema.returns[0].alias_info
    return info is not None and not info.is_write
