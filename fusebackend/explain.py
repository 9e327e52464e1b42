"""``fusebackend.explain(fn, *args)``: what the backend does with a function, as a report.

It compiles ``fn`` with ``backend="fuse"``, runs it once on ``args`` (so Dynamo hands over its
graphs) and returns an ``Explanation``: for every graph compiled during that call, the kernels with
the nodes in each, the bytes each reads and writes, the graph's bytes against its floor, every
fusion taken with the bytes it saved and every fusion refused with its reason. ``str()`` of it is
the readable report; ``.graphs`` holds the full artifacts (IR, kernel sources, wrapper).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from fusebackend import dump


@dataclasses.dataclass
class Explanation:
    graphs: list[dump.CompiledArtifacts]
    result: Any

    @property
    def kernel_count(self) -> int:
        return sum(g.kernel_count for g in self.graphs)

    def __str__(self) -> str:
        if not self.graphs:
            return "no graph was compiled (was the function already compiled, or did Dynamo skip it?)"
        return "\n\n".join(g.schedule for g in self.graphs)


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Explanation:
    """Compile ``fn`` with the fuse backend, call it once, and report what was generated."""
    from fusebackend.backend import fuse

    before = len(dump.history())
    compiled = torch.compile(fn, backend=fuse)
    result = compiled(*args, **kwargs)
    return Explanation(dump.history()[before:], result)
