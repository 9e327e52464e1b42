"""The lines that open a generated kernel's module: imports and the ``triton.jit`` decorator,
with the size arguments Triton must not specialize (kernels over symbolic sizes)."""

from __future__ import annotations

from typing import Any, Mapping

import sympy

from fusebackend.indexing_symbolic import quotient

HEADER = [
    "import triton",
    "import triton.language as tl",
    "from fusebackend.kernels import triton_helpers as th",
    "",
    "",
    "@triton.jit",
]


def header(int_params: Mapping[str, Any]) -> list[str]:
    """``HEADER``, where a kernel takes extents that change from call to call (symbolic sizes,
    ``int_params``: name -> value): Triton would compile a binary per value class of each int
    (1, a multiple of 16, other), and a launch of the first binary for other values would read
    the wrong memory. An int whose class never changes stays specialized: a static one, or an
    expression in sizes proven a multiple of 16 (``64*s0``), whose divisibility Triton then
    knows (a mask ``xindex < xnumel`` constant over 16 lanes: vectorized loads and stores)."""
    varying = [name for name, value in int_params.items()
               if sizes_in(value) and quotient(sympy.sympify(value), sympy.Integer(16)) is None]
    if not varying:
        return HEADER
    return HEADER[:-1] + [f"@triton.jit(do_not_specialize={varying!r})"]


def sizes_in(expr: Any) -> set[sympy.Symbol]:
    """The size symbols (Dynamo's, positive) in an index or extent; loop variables are not."""
    if isinstance(expr, int):
        return set()
    return {s for s in sympy.sympify(expr).free_symbols if s.is_positive is True}
