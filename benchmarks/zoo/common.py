"""Shared pieces of the zoo's builders: seeded construction, dropout off, seeded batches.

Weights and batches are drawn from fixed seeds, so two builds of the same model and size are
equal (on the same device). Batches are drawn on the CPU and moved, so they are the same on every
device.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

WEIGHT_SEED = 0
BATCH_SEED = 1


def drop_nothing(config: Any) -> Any:
    """Set every dropout-like probability of a transformers configuration (and its sub-configs)
    to 0: names holding "drop" (dropout, attention_dropout, resid_pdrop, drop_path_rate,
    drop_connect_rate, encoder_layerdrop...) with a float value. Returns the configuration."""
    from transformers import PretrainedConfig

    for name, value in list(vars(config).items()):
        if isinstance(value, PretrainedConfig):
            drop_nothing(value)
        elif "drop" in name.lower() and isinstance(value, float) and not isinstance(value, bool):
            setattr(config, name, 0.0)
    if hasattr(config, "use_cache"):
        config.use_cache = False  # no key/value cache objects among the outputs
    return config


# Stochastic depth (drop a residual branch per sample): torchvision's ``StochasticDepth`` keeps its
# probability in ``p``, timm's ``DropPath`` in ``drop_prob``.
_DROP_PATH = {"StochasticDepth": "p", "DropPath": "drop_prob"}


def zero_dropout_modules(model: nn.Module) -> nn.Module:
    """Probability 0 on every dropout and stochastic-depth module the configuration did not reach
    (torchvision, timm, hard-coded probabilities)."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        attribute = _DROP_PATH.get(type(module).__name__)
        if attribute is not None and hasattr(module, attribute):
            setattr(module, attribute, 0.0)
    return model


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def instantiate(factory: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype) -> nn.Module:
    """``factory()`` under a fixed seed, its parameters created on ``device`` (no host copy of a
    large model), then cast to ``dtype``; dropout off; train mode. Weight matrices and kernels
    the library made all zero (torchvision's ViT head, zero-initialized residual branches) are
    drawn at random, with variance 1/fan-in: an output that is all zero (the head's bias, 0) makes
    every compiled error 0 whatever the graph computes."""
    with seeded(WEIGHT_SEED, device), torch.device(device):
        model = factory()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2 and p.is_floating_point() and not p.any():
                    p.normal_(0.0, p[0].numel() ** -0.5)
    model = zero_dropout_modules(model.to(dtype=dtype))
    return model.train()


def generator(offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(BATCH_SEED + offset)


def tokens(batch: int, seq: int, vocab: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    """Random token ids in [2, vocab): ids 0 and 1 are often padding or special tokens."""
    return torch.randint(2, vocab, (batch, seq), generator=generator(offset)).to(device)


def floats(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    """Standard normal values (images are normalized, so their scale is about this)."""
    return torch.randn(shape, generator=generator(offset)).to(device=device, dtype=dtype)


def labels(batch: int, classes: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    return torch.randint(0, classes, (batch,), generator=generator(100 + offset)).to(device)


def model_loss(output: Any) -> torch.Tensor:
    """The loss a transformers model computed itself from the ``labels`` it was given."""
    return output.loss
