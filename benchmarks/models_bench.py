"""The models of ``benchmarks/models`` through the harness: inference and a training step.

For each model two cases:

- ``<model>.forward``: ``model(x)`` in eval mode under ``torch.no_grad()``; the model is what is
  compiled. Timed: one forward call.
- ``<model>.train``: in train mode, ``loss = model(x).float().square().mean()`` then
  ``loss.backward()``; the forward-and-loss function is what is compiled (its backward graph is
  compiled by the same backend through AOTAutograd). Timed: clearing the gradients, forward, loss
  and backward. The optimizer update is left out: it is the same ATen code under every variant.
  Checked: the loss and every parameter gradient against eager.

No case has a bandwidth floor: matrix products and convolutions make them partly compute-bound.

    python -m benchmarks.models_bench [--small] [--cases mlp.forward,convnet.train] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
from typing import Any, Callable, Sequence

import torch

from benchmarks import harness
from benchmarks.harness import Case, Compiler, Workload
from benchmarks.models import MODELS, ModelSpec


def _fp32(xs: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs)


def _reference_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model in fp32 with the same (upcast) parameters, for a half-precision model; else None."""
    if not any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters()):
        return None
    return copy.deepcopy(model).float()


def _forward_workload(spec: ModelSpec, config: Any, device: torch.device) -> Workload:
    model, make_inputs = spec.make(config, device)
    model.eval()
    reference_model = _reference_model(model)

    def build(compile_: Compiler) -> Callable[..., Any]:
        forward = compile_(lambda *xs: model(*xs))

        def step(*xs: torch.Tensor) -> Any:
            with torch.no_grad():
                return forward(*xs)

        return step

    def reference(*xs: torch.Tensor) -> Any:
        assert reference_model is not None
        with torch.no_grad():
            return reference_model(*_fp32(xs))

    return Workload(build, make_inputs, reference if reference_model is not None else None)


def _train_workload(spec: ModelSpec, config: Any, device: torch.device) -> Workload:
    model, make_inputs = spec.make(config, device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    reference_model = _reference_model(model)

    def forward_loss(*xs: torch.Tensor) -> torch.Tensor:
        return model(*xs).float().square().mean()

    def build(compile_: Compiler) -> Callable[..., Any]:
        loss_fn = compile_(forward_loss)

        def step(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            for p in params:
                p.grad = None
            loss = loss_fn(*xs)
            loss.backward()
            return (loss.detach(), *(p.grad for p in params))

        return step

    def reference(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        assert reference_model is not None
        ref_params = [p for p in reference_model.parameters() if p.requires_grad]
        for p in ref_params:
            p.grad = None
        loss = reference_model(*_fp32(xs)).float().square().mean()
        loss.backward()
        return (loss.detach(), *(p.grad for p in ref_params))

    return Workload(build, make_inputs, reference if reference_model is not None else None)


def _setup(make_workload: Callable[[ModelSpec, Any, torch.device], Workload], spec: ModelSpec,
           config: Any, device: torch.device) -> Callable[[], Workload]:
    return lambda: make_workload(spec, config, device)


def cases(device: torch.device, small: bool) -> list[Case]:
    """Forward and training-step cases of every registered model, in its small or GPU config."""
    out = []
    for name, spec in MODELS.items():
        config = spec.small if small else spec.gpu
        # outputs are checked at the model's dtype: a bf16 network's fp32 loss carries bf16 rounding
        precision = getattr(config, "dtype", None)
        out.append(Case(f"{name}.forward", f"{spec.description}; inference, {config}",
                        _setup(_forward_workload, spec, config, device), precision=precision))
        out.append(Case(f"{name}.train", f"{spec.description}; forward + loss + backward, {config}",
                        _setup(_train_workload, spec, config, device), precision=precision))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.models_bench", description=__doc__.split("\n\n")[0])
    harness.add_arguments(parser)
    harness.main_for(["models"], parser.parse_args(argv))


if __name__ == "__main__":
    main()
