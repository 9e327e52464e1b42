"""Self-contained benchmark models: random init from a config, no downloads.

``MODELS`` maps a model name to a ``ModelSpec``: ``spec.make(config, device)`` returns
``(module, example_inputs)``, where ``example_inputs()`` draws a fresh tuple of inputs from torch's
global generator. ``spec.small`` is a config tiny enough for Triton's interpreter on a CPU;
``spec.gpu`` one sized for an H100/H200.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn as nn

from benchmarks.models import convnet, mlp, rmsnorm_mlp, transformer

InputFn = Callable[[], tuple[torch.Tensor, ...]]
MakeFn = Callable[[Any, "torch.device | str"], tuple[nn.Module, InputFn]]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    description: str
    make: MakeFn
    small: Any
    gpu: Any


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("Linear-GELU-Linear MLP", mlp.make, mlp.SMALL, mlp.GPU),
    "transformer": ModelSpec(
        "pre-norm transformer block (LayerNorm, matmul+softmax attention, GELU MLP)",
        transformer.make, transformer.SMALL, transformer.GPU,
    ),
    "rmsnorm_mlp": ModelSpec(
        "RMSNorm (fp32 math) + SiLU-gated MLP, llama-style", rmsnorm_mlp.make, rmsnorm_mlp.SMALL, rmsnorm_mlp.GPU,
    ),
    "convnet": ModelSpec(
        "conv + BatchNorm + ReLU blocks, channels_last on GPU", convnet.make, convnet.SMALL, convnet.GPU,
    ),
}

__all__ = ["MODELS", "ModelSpec", "InputFn"]
