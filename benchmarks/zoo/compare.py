"""Measuring a compiled model against eager: output errors and the training step's gradients.

Used by ``tests/test_zoo.py`` (CPU, tiny sizes) and ``benchmarks/zoo/run.py`` (GPU, real sizes).

- ``output_tensors(out)``: the tensors of a model's output (a transformers ``ModelOutput``, a
  tuple, a tensor), in order.
- ``output_error(actual, expected)``: the largest ``max|actual - expected| / max|expected|`` over
  the outputs: an error relative to the output's magnitude, so that elements near zero (most
  logits) are not judged by their own tiny size.
- ``training_step(model, built)``: the loss and every parameter gradient of one forward and
  backward pass.
- ``float64_copy(model)``: the copy of a model whose results judge the others' (below).
- ``gradient_checks(...)``: per parameter, the distance of the compiled gradient and of eager's
  from a float64 copy's, and whether the compiled one is within twice eager's distance plus a small
  absolute term relative to the largest gradient of the model.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn

from benchmarks.zoo.spec import Built


def output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of ``out`` in a fixed order; anything that is not a tensor is left out."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):  # transformers' ModelOutput is an ordered dict of its set fields
        return [t for v in out.values() for t in output_tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in output_tensors(v)]
    return []


def output_names(out: Any) -> list[str]:
    """Names of ``output_tensors(out)``, in the same order (for messages)."""
    if isinstance(out, torch.Tensor):
        return ["output"]
    if isinstance(out, Mapping):
        return [f"{k}" + (f"[{i}]" if len(output_tensors(v)) > 1 else "")
                for k, v in out.items() for i in range(len(output_tensors(v)))]
    return [f"output[{i}]" for i in range(len(output_tensors(out)))]


_CHUNK = 1 << 25  # elements compared at a time: 256 MiB a tensor in float64


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected| / max|expected|`` in float64; inf where NaN/inf positions differ.

    Compared a chunk at a time: XLM-RoBERTa's logits (b16 s512 over 250k tokens, 4 GiB in
    bf16) are 16 GiB in float64, three of them more than an 80 GiB GPU holds."""
    flat_a, flat_e = actual.detach().reshape(-1), expected.detach().reshape(-1)
    scale = diff = 0.0
    for start in range(0, flat_e.numel(), _CHUNK):
        a, e = flat_a[start:start + _CHUNK].double(), flat_e[start:start + _CHUNK].double()
        if not torch.equal(a.isnan(), e.isnan()) or not torch.equal(a.isinf(), e.isinf()):
            return float("inf")
        finite = e.isfinite()
        if a.isinf().any() and not torch.equal(a[~finite], e[~finite]):
            return float("inf")  # infinities of the other sign
        a, e = a[finite], e[finite]
        if e.numel():
            scale = max(scale, e.abs().max().item())
            diff = max(diff, (a - e).abs().max().item())
    return diff / scale if scale > 0 else diff


def output_error(actual: Any, expected: Any) -> float:
    """The largest ``relative_error`` over the outputs; raises if their structure or shapes differ."""
    got, want = output_tensors(actual), output_tensors(expected)
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} output tensors, eager has {len(want)}")
    for i, (a, e) in enumerate(zip(got, want)):
        if a.shape != e.shape or a.dtype != e.dtype:
            raise AssertionError(f"output {i}: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}")
    return max((relative_error(a, e) for a, e in zip(got, want)), default=0.0)


def float64_copy(model: nn.Module) -> nn.Module:
    """A float64 copy of ``model``, the same function on transformers' loop over experts where the
    model mixes experts: its default, grouped products (``torch._grouped_mm``), takes no float64
    (Mixtral). The model itself keeps its default."""
    exact = copy.deepcopy(model).double()
    for module in exact.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_experts_implementation"):
            config._experts_implementation = "eager"
    return exact


def cast_inputs(inputs: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating inputs cast to ``dtype`` (token ids and labels stay as they are)."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


@dataclasses.dataclass(frozen=True)
class StepResult:
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]  # parameter name -> gradient (parameters without one left out)
    buffers: dict[str, torch.Tensor]  # floating buffers after the step (batch norm's statistics)


def training_step(model: nn.Module, call: Callable[..., Any], built: Built, dtype: torch.dtype | None = None) -> StepResult:
    """Gradients cleared, ``loss = built.loss(call(**train_inputs))``, ``loss.backward()``.

    ``call`` is ``model`` itself or its compiled form; ``dtype``: cast the floating inputs (a
    float64 copy of the model)."""
    for p in model.parameters():
        p.grad = None
    inputs = built.train_inputs if dtype is None else cast_inputs(built.train_inputs, dtype)
    loss = built.loss(call(**inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if b.is_floating_point()}
    return StepResult(loss.detach(), grads, buffers)


@dataclasses.dataclass(frozen=True)
class Distance:
    """One tensor of the compiled run against eager's and a float64 copy's."""

    name: str
    compiled: float  # max |compiled - float64|
    eager: float  # max |eager - float64|
    allowed: float  # 2 * eager + atol * scale

    @property
    def ok(self) -> bool:
        return self.compiled <= self.allowed

    @property
    def ratio(self) -> float:
        """compiled distance over the allowed one: at most 1 passes."""
        return self.compiled / self.allowed if self.allowed > 0 else (0.0 if self.compiled == 0 else float("inf"))

    def __str__(self) -> str:
        return (f"{self.name}: {self.compiled:.3g} from float64, eager {self.eager:.3g}, allowed {self.allowed:.3g} "
                f"({self.ratio:.2f}x)")


def distance(name: str, compiled: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, atol: float,
             scale: float) -> Distance:
    c, e, x = compiled.detach().double(), eager.detach().double(), exact.detach().double()
    if c.shape != x.shape:
        return Distance(name + f" (shape {list(c.shape)}, float64 {list(x.shape)})", float("inf"), 0.0, 0.0)
    dc = (c - x).abs().max().item() if c.numel() else 0.0
    de = (e - x).abs().max().item() if e.numel() else 0.0
    dc = float("inf") if dc != dc else dc  # NaN: never within bounds
    return Distance(name, dc, de, 2 * de + atol * scale)


def gradient_distances(compiled: StepResult, eager: StepResult, exact: StepResult, atol: float) -> list[Distance]:
    """Every parameter gradient, and the loss, of the compiled step against eager's distance from
    float64. The absolute term is ``atol`` times the largest float64 gradient magnitude of the
    model (the loss's own magnitude for the loss). A parameter that has a gradient in float64 but
    not in the compiled step is reported at infinite distance."""
    scale = max((g.abs().max().item() for g in exact.grads.values() if g.numel()), default=0.0)
    out = [distance("loss", compiled.loss, eager.loss, exact.loss, atol, abs(exact.loss.item()))]
    for name, g_x in exact.grads.items():
        if name not in compiled.grads:
            out.append(Distance(f"{name} (no gradient)", float("inf"), 0.0, 0.0))
            continue
        out.append(distance(f"grad {name}", compiled.grads[name], eager.grads[name], g_x, atol, scale))
    return out


def buffer_distances(compiled: StepResult, eager: StepResult, exact: StepResult, atol: float) -> list[Distance]:
    """Floating buffers after the step (batch norm's running means and variances). The absolute
    term is relative to the model's largest buffer (the running variances, about 1), not to each
    buffer's own: a running mean of activations that cancel can be 1e-14 in float64 while its
    float32 inputs carry rounding of 1e-8."""
    scale = max((b.abs().max().item() for b in exact.buffers.values() if b.numel()), default=0.0)
    return [distance(f"buffer {name}", compiled.buffers[name], eager.buffers[name], b_x, atol, scale)
            for name, b_x in exact.buffers.items()]
