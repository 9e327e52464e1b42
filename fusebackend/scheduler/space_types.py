"""The types of an iteration space (``space.py``): the loop indices ``X`` and ``R``, ``KernelSpace``
and ``SpaceError``.

``space.py`` plans pointwise and reduction kernels and hands scans and scatters to
``scan_scatter_space.py``; both planners build these, so they live here, below both
(``space`` re-exports them: ``space.KernelSpace`` and so on).
"""

from __future__ import annotations

import dataclasses

import sympy

from fusebackend import indexing, ir

X = indexing.var("xindex")
R = indexing.var("rindex")


@dataclasses.dataclass(frozen=True)
class KernelSpace:
    xnumel: int
    rnumel: int  # 1 for a pointwise kernel
    anchor: ir.Reduction | ir.Scan | None  # a scan's kernel has rows and positions too
    # node name -> its loop variables in terms of xindex / rindex (stored nodes and row values)
    mapping: dict[str, dict[sympy.Symbol, sympy.Expr]]
    # node name -> where (a bool expression in xindex / rindex) its full-size store is made
    guards: dict[str, ir.Expr] = dataclasses.field(default_factory=dict)

    @property
    def ranges(self) -> dict[sympy.Symbol, int]:
        out = {X: max(self.xnumel, 1)}
        if self.anchor is not None:
            out[R] = max(self.rnumel, 1)
        return out


class SpaceError(Exception):
    """These nodes cannot share one kernel; the message is the reason."""
