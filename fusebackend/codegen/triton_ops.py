"""The one table from IR op to Triton expression text.

Operands arrive rendered (temporaries or literals). Helpers that need several instructions live
in ``fusebackend/kernels/triton_helpers.py`` (imported by every kernel as ``th``). Only Triton
builtins appear here, never Triton's ``@jit`` library functions (see ``kernels/runtime.py``).
"""

from __future__ import annotations

import math

import torch

TRITON_DTYPE: dict[torch.dtype, str] = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

OP_TEMPLATES: dict[str, str] = {
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "truediv": "th.div({0}, {1})",
    "neg": "th.neg({0})",
    "abs": "tl.abs({0})",
    "int_truncdiv": "{0} // {1}",
    "int_truncmod": "{0} % {1}",
    "fmod": "{0} % {1}",
    "maximum": "th.maximum({0}, {1})",
    "minimum": "th.minimum({0}, {1})",
    "exp": "tl.exp({0})",
    "exp2": "tl.exp2({0})",
    "log": "tl.log({0})",
    "log2": "tl.log2({0})",
    "sqrt": "th.sqrt({0})",
    "rsqrt": "tl.rsqrt({0})",
    "sin": "tl.sin({0})",
    "cos": "tl.cos({0})",
    "tanh": "th.tanh({0})",
    "sigmoid": "th.sigmoid({0})",
    "erf": "tl.erf({0})",
    "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})",
    "log1p": "th.log1p({0})",
    "expm1": "th.expm1({0})",
    "isnan": "{0} != {0}",
    "isinf": "tl.abs({0}) == float('inf')",
    "eq": "{0} == {1}",
    "ne": "{0} != {1}",
    "lt": "{0} < {1}",
    "le": "{0} <= {1}",
    "gt": "{0} > {1}",
    "ge": "{0} >= {1}",
    "logical_and": "{0} & {1}",
    "logical_or": "{0} | {1}",
    "logical_xor": "{0} ^ {1}",
    "logical_not": "{0} == 0",
    "bitwise_and": "{0} & {1}",
    "bitwise_or": "{0} | {1}",
    "bitwise_xor": "{0} ^ {1}",
    "bitwise_not": "~{0}",
    "where": "tl.where({0}, {1}, {2})",
    "rand": "th.rand({0}, {1}, {2}, {3})",
    "randn": "th.randn({0}, {1}, {2})",
    "randint": "th.randint({0}, {1}, {2}, {3})",
    "atan": "th.atan({0})",
    "atan2": "th.atan2({0}, {1})",
    "sinh": "th.sinh({0})",
    "asinh": "th.asinh({0})",
    "acosh": "th.acosh({0})",
    "erfc": "th.erfc({0})",
    "erfcx": "th.erfcx({0})",
    "erfinv": "th.erfinv({0})",
    "ndtri": "th.ndtri({0})",
    "lgamma": "th.lgamma({0})",
    "digamma": "th.digamma({0})",
    "hypot": "th.hypot({0}, {1})",
    "copysign": "th.copysign({0}, {1})",
    "signbit": "th.signbit({0})",
    "trigamma": "th.trigamma({0})",
    "i0": "th.i0({0})",
    "i0e": "th.i0e({0})",
    "i1": "th.i1({0})",
    "i1e": "th.i1e({0})",
    "nextafter": "th.nextafter({0}, {1})",
    "ldexp": "th.ldexp({0}, {1})",
    "frexp_mantissa": "th.frexp_mantissa({0})",
    "frexp_exponent": "th.frexp_exponent({0})",
    "gcd": "th.gcd({0}, {1})",
    "lshift": "{0} << {1}",
    "rshift": "{0} >> {1}",
}


# Helpers that take some arguments as literals: the random ops' stream, span and significand
# bits (a constexpr), which must stay Python ints in the call.
LITERAL_ARGS = frozenset({"rand", "randn", "randint"})


def takes_tensors(name: str) -> bool:
    """Whether the op renders as a helper call, whose arguments must be tensors, never literals."""
    return OP_TEMPLATES.get(name, "").startswith("th.") and name not in LITERAL_ARGS


def render_op(name: str, args: list[str], dtype: torch.dtype, arg_dtypes: list[torch.dtype]) -> str:
    if name == "round_to":  # a half-precision value, kept in fp32, on its dtype's grid
        return f"th.round_bf16({args[0]})" if dtype == torch.bfloat16 else f"{args[0]}.to(tl.float16).to(tl.float32)"
    if name == "to":
        if dtype == torch.bool:
            return f"{args[0]} != 0"
        if dtype == torch.bfloat16:  # rounded by a helper: the interpreter's cast truncates
            x = args[0] if arg_dtypes[0] == torch.float32 else f"{args[0]}.to(tl.float32)"
            return f"th.to_bf16({x})"
        return f"{args[0]}.to({TRITON_DTYPE[dtype]})"
    return OP_TEMPLATES[name].format(*args)


def render_literal(value: bool | int | float, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))
