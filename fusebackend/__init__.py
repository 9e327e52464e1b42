"""fusebackend: a torch.compile backend that fuses pointwise and reduction work into Triton kernels.

    torch.compile(model, backend="fuse")

works once the package is installed (it registers the backend through an entry point). Importing
it directly gives the inspection API: ``fusebackend.last_compiled()`` returns what the most recent
compilation produced (IR, schedule, kernels, wrapper) and ``fusebackend.metrics`` counts graphs,
kernels and ATen fallbacks. ``fusebackend.config`` holds every option.
"""

from fusebackend.config import config, use_interpreter
from fusebackend import metrics
from fusebackend.backend import fuse
from fusebackend import dump
from fusebackend.dump import CompiledArtifacts, history, last as last_compiled
from fusebackend.explain import Explanation, explain
from fusebackend.checking import CheckReport, check_kernels

__all__ = ["config", "use_interpreter", "metrics", "dump", "fuse", "explain", "Explanation", "last_compiled", "history", "CompiledArtifacts",
           "check_kernels", "CheckReport"]
__version__ = "0.1.0"
