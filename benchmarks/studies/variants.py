"""What the layer studies share: a module's batch norms given statistics away from 0 and 1, its
float32 answer with the bf16 module and input that are timed, and one variant's table cell
(compiled, checked against that answer, timed as a CUDA graph's replay)."""

from __future__ import annotations

from typing import Any, Callable, ContextManager

import torch
import torch.nn as nn

import fusebackend
from benchmarks.timing import graph_replay_us


def spread_batch_norms(*norms: nn.BatchNorm2d) -> None:
    """Running statistics, weights and biases away from 0 and 1, so that no term of the norm is
    an identity a wrong kernel could pass with."""
    with torch.no_grad():
        for bn in norms:
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)


def bf16_with_float32_answer(module: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, torch.Tensor, int]:
    """The module and input in bf16, the float32 module's output on the input, and the bytes a
    call must move (the input read and the output written once)."""
    with torch.no_grad():
        want = module(x)
        module = module.to(torch.bfloat16)
        x = x.to(torch.bfloat16)
        out = module(x)
    return module, x, want, (x.numel() + out.numel()) * x.element_size()


def variant_cell(variant: str, backend: Any, context: Callable[[], ContextManager[Any]], module: nn.Module,
                 x: torch.Tensor, want: torch.Tensor, floor_us: float, timed: bool, where: str) -> tuple[str, int | None]:
    """One variant's cell: us a call and % of the floor (or its error, untimed), and for fuse the
    kernels it generated. ``backend`` None is eager. Raises where fuse left an ATen call or the
    output is off the float32 answer by more than 2%."""
    torch._dynamo.reset()
    fn = module if backend is None else torch.compile(module, backend=backend)
    kernels = None
    with torch.no_grad(), context(), fusebackend.config.patch(graph_cache=False):
        fusebackend.metrics.reset()
        got = fn(x)  # compiled here, under the variant
        if backend is fusebackend.fuse:
            if fusebackend.metrics.fallbacks:
                raise AssertionError(f"{variant}: ATen calls {dict(fusebackend.metrics.fallbacks)}")
            kernels = fusebackend.metrics.kernels_generated
        err = ((got.float() - want).abs().max() / want.abs().max()).item()
        if err > 2e-2:
            raise AssertionError(f"{variant} at {where}: error {err:.2e} against float32")
        if not timed:
            return f"{f'ok, error {err:.1e}':>20s}", kernels
        us = graph_replay_us(lambda: fn(x))
    return f"{us:8.1f} ({floor_us / us:4.0%})", kernels
