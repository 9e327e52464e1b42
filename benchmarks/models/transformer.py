"""A pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x)).

Attention is written out as matmul, scale, causal mask and softmax (not SDPA), so the softmax and
its neighbours are ordinary ops a fusing backend can see.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int = 1
    seq: int = 12
    dim: int = 24
    heads: int = 2
    mlp_ratio: int = 2
    causal: bool = True
    dtype: torch.dtype = torch.float32


SMALL = Config()
GPU = Config(batch=8, seq=1024, dim=1024, heads=16, mlp_ratio=4, dtype=torch.bfloat16)


class Block(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        if config.dim % config.heads:
            raise ValueError(f"dim {config.dim} is not a multiple of heads {config.heads}")
        self.heads = config.heads
        self.head_dim = config.dim // config.heads
        self.ln1 = nn.LayerNorm(config.dim)
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)
        self.ln2 = nn.LayerNorm(config.dim)
        self.fc1 = nn.Linear(config.dim, config.mlp_ratio * config.dim)
        self.fc2 = nn.Linear(config.mlp_ratio * config.dim, config.dim)
        mask = torch.ones(config.seq, config.seq, dtype=torch.bool).triu(1) if config.causal else None
        self.register_buffer("mask", mask, persistent=False)

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        b, s, c = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5
        if self.mask is not None:
            scores = scores.masked_fill(self.mask[:s, :s], float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make(config: Config, device: torch.device | str = "cpu") -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, ...]]]:
    """The block (seeded random init) and a factory of fresh inputs ``(x,)`` of shape batch x seq x dim."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Block(config)
        for ln in (model.ln1, model.ln2):  # not the identity init, so the affine part is exercised
            nn.init.normal_(ln.weight, 1.0, 0.1)
            nn.init.normal_(ln.bias, 0.0, 0.1)
    model = model.to(device=device, dtype=config.dtype)

    def inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(config.batch, config.seq, config.dim, device=device, dtype=config.dtype),)

    return model, inputs
