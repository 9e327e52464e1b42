"""Linear -> GELU -> Linear over a batch of token vectors."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Config:
    tokens: int = 16
    dim: int = 24
    hidden: int = 40
    dtype: torch.dtype = torch.float32


SMALL = Config()
GPU = Config(tokens=8192, dim=2048, hidden=8192, dtype=torch.bfloat16)


class MLP(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.dim, config.hidden)
        self.fc2 = nn.Linear(config.hidden, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def make(config: Config, device: torch.device | str = "cpu") -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, ...]]]:
    """The model (seeded random init) and a factory of fresh inputs ``(x,)`` of shape tokens x dim."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MLP(config)
    model = model.to(device=device, dtype=config.dtype)

    def inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(config.tokens, config.dim, device=device, dtype=config.dtype),)

    return model, inputs
