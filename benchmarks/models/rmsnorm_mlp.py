"""Llama-style RMSNorm (fp32 math, cast back) and SiLU-gated MLP with a residual."""

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
    eps: float = 1e-6
    dtype: torch.dtype = torch.float32


SMALL = Config()
GPU = Config(tokens=8192, dim=2048, hidden=5632, dtype=torch.bfloat16)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class RMSNormMLP(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.norm = RMSNorm(config.dim, config.eps)
        self.gate = nn.Linear(config.dim, config.hidden, bias=False)
        self.up = nn.Linear(config.dim, config.hidden, bias=False)
        self.down = nn.Linear(config.hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def make(config: Config, device: torch.device | str = "cpu") -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, ...]]]:
    """The block (seeded random init) and a factory of fresh inputs ``(x,)`` of shape tokens x dim."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = RMSNormMLP(config)
        nn.init.normal_(model.norm.weight, 1.0, 0.1)
    model = model.to(device=device, dtype=config.dtype)

    def inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(config.tokens, config.dim, device=device, dtype=config.dtype),)

    return model, inputs
