"""``torch.compile``'s ``mode=`` and ``options=``, as fuse reads them.

``torch.compile(model, backend="fuse", mode=..., options={...})`` hands the backend ``mode`` and
``options`` as keyword arguments (only where they are given). fuse reads them into a ``Mode``,
which goes with every graph of that compile: it is part of both caches' keys, and a graph loaded
from AOTAutograd's cache carries its own.

- ``mode="default"`` (or none): today's launch heuristics, each graph called from Python.
- ``mode="reduce-overhead"``: each graph's calls replay a CUDA graph (``cudagraphs.py``), through
  PyTorch's CUDA graph trees as Inductor's reduce-overhead mode does.
- ``mode="max-autotune-no-cudagraphs"``: each generated kernel times a few launch configurations
  on its first call and keeps the fastest (``kernels/autotune.py``).
- ``mode="max-autotune"``: both, as Inductor's mode of that name does.

``options`` sets the same two switches by name, and wins over the mode: ``{"cudagraphs": True}``
(Inductor's spelling ``"triton.cudagraphs"`` too) and ``{"max_autotune": True}``. An unknown mode or
option raises, naming the ones there are: a misspelt switch is never silently ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

MODES = {
    "default": (False, False),
    "reduce-overhead": (True, False),
    "max-autotune-no-cudagraphs": (False, True),
    "max-autotune": (True, True),
}
OPTIONS = {"cudagraphs": "cudagraphs", "triton.cudagraphs": "cudagraphs", "max_autotune": "autotune"}


@dataclasses.dataclass(frozen=True)
class Mode:
    cudagraphs: bool = False  # each graph's calls replay a CUDA graph
    autotune: bool = False  # each kernel keeps the fastest of a few launch configurations

    @classmethod
    def parse(cls, mode: str | None = None, options: Mapping[str, Any] | None = None) -> Mode:
        """The ``Mode`` for ``torch.compile``'s ``mode`` and ``options``; raises ``ValueError``
        for a mode or an option fuse does not have."""
        if mode is None:
            mode = "default"
        if mode not in MODES:
            raise ValueError(f"fusebackend: unknown mode {mode!r}; the modes are {', '.join(MODES)}")
        cudagraphs, autotune = MODES[mode]
        switches = {"cudagraphs": cudagraphs, "autotune": autotune}
        for name, value in (options or {}).items():
            if name not in OPTIONS:
                raise ValueError(f"fusebackend: unknown option {name!r}; the options are {', '.join(OPTIONS)}")
            if not isinstance(value, bool):
                raise ValueError(f"fusebackend: option {name!r} takes True or False, not {value!r}")
            switches[OPTIONS[name]] = value
        return cls(**switches)

    def tag(self) -> str:
        """What the caches' keys add for this mode ("" for the default)."""
        on = [f.name for f in dataclasses.fields(self) if getattr(self, f.name)]
        return " ".join(on)
