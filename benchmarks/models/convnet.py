"""A small ConvNet: a stem conv, then blocks of 3x3 conv + BatchNorm + ReLU, mean-pool and a linear head.

With ``channels_last`` the parameters and inputs are in NHWC memory order, the layout cuDNN and
fused pointwise kernels prefer for bf16.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int = 2
    in_channels: int = 3
    width: int = 8
    blocks: int = 2
    size: int = 8
    classes: int = 10
    channels_last: bool = False
    dtype: torch.dtype = torch.float32


SMALL = Config()
GPU = Config(batch=64, width=128, blocks=4, size=56, channels_last=True, dtype=torch.bfloat16)


def conv_bn_relu(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class ConvNet(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.stem = conv_bn_relu(config.in_channels, config.width)
        self.blocks = nn.Sequential(*[conv_bn_relu(config.width, config.width) for _ in range(config.blocks)])
        self.head = nn.Linear(config.width, config.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def make(config: Config, device: torch.device | str = "cpu") -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, ...]]]:
    """The network (seeded random init, random BatchNorm statistics) and a factory of fresh
    inputs ``(images,)`` of shape batch x in_channels x size x size."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ConvNet(config)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):  # eval mode should not be the identity
                nn.init.normal_(m.weight, 1.0, 0.1)
                nn.init.normal_(m.bias, 0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    fmt = torch.channels_last if config.channels_last else torch.contiguous_format
    model = model.to(device=device, dtype=config.dtype, memory_format=fmt)

    def inputs() -> tuple[torch.Tensor, ...]:
        shape = (config.batch, config.in_channels, config.size, config.size)
        return (torch.randn(shape, device=device, dtype=config.dtype).contiguous(memory_format=fmt),)

    return model, inputs
