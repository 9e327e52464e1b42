"""Lowering: ATen FX graph -> IRGraph (see ``graph.py``); the op tables register on import."""

from fusebackend.lowering import pointwise as _pointwise  # noqa: F401  (registers lowerings)
from fusebackend.lowering import reductions as _reductions  # noqa: F401
from fusebackend.lowering import random_ops as _random_ops  # noqa: F401
from fusebackend.lowering import scans as _scans  # noqa: F401
from fusebackend.lowering import scatters as _scatters  # noqa: F401
from fusebackend.lowering import math_ops as _math_ops  # noqa: F401
from fusebackend.lowering import pooling as _pooling  # noqa: F401
from fusebackend.lowering import upsampling as _upsampling  # noqa: F401
from fusebackend.lowering import gathers as _gathers  # noqa: F401
from fusebackend.lowering import views as _views  # noqa: F401
from fusebackend.lowering import matmuls as _matmuls  # noqa: F401
from fusebackend.lowering import convolutions as _convolutions  # noqa: F401
from fusebackend.lowering.graph import lower
from fusebackend.lowering.registry import COMPOSITE, POINTWISE, Unsupported

__all__ = ["lower", "POINTWISE", "COMPOSITE", "Unsupported"]
