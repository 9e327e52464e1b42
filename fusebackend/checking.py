"""Find the first wrong kernel: compiled graphs compared with eager, kernel by kernel.

With ``config.check_kernels`` (``FUSE_CHECK_KERNELS=1``, or ``check_kernels(fn, *args)`` below)
every graph is compiled with a wrapper that, on each call, hands its inputs and then, after each
kernel and ATen call, the buffers it stored to an ``Observer``. The observer runs the graph's
ATen ops eagerly on copies of the same inputs, once in their own dtypes and once in float64,
and compares each stored buffer that holds an ATen node's value (``IRGraph.fx_values``) with
that node's value:

- a floating buffer is wrong when its distance from the float64 value is more than twice
  eager's distance plus a few units in the last place of its dtype (relative to the largest
  magnitude of the value): rounding differs, but not by more than eager's own;
- any other buffer is wrong when it differs from eager's value at all.

Inside ``check_kernels`` every comparison is recorded, in the order the steps ran (elsewhere the
first wrong buffer of each graph is a warning); ``CheckReport.first_wrong`` is the kernel to read
first: the buffers before it matched, so its inputs were right. With fusion on,
only stored buffers can be compared (a fused intermediate never reaches memory);
``FUSE_FUSION=0`` compares every node's result.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

import torch
import torch.fx
from torch.utils import _pytree as pytree

from fusebackend.config import config


@dataclasses.dataclass(frozen=True)
class BufferCheck:
    graph: str
    step: int
    label: str  # the kernel's name, or "extern <op>"
    buffer: str
    fx_node: str
    fuse_error: float  # max |fuse - float64|, relative to the largest |float64| (exact: 0 or 1)
    eager_error: float  # the same for eager
    ok: bool

    def __str__(self) -> str:
        verdict = "ok   " if self.ok else "WRONG"
        return (f"{verdict} {self.graph} step {self.step} {self.label}: {self.buffer} = {self.fx_node}"
                f"  fuse {self.fuse_error:.2e}, eager {self.eager_error:.2e}")


@dataclasses.dataclass
class CheckReport:
    checks: list[BufferCheck] = dataclasses.field(default_factory=list)

    @property
    def first_wrong(self) -> BufferCheck | None:
        return next((c for c in self.checks if not c.ok), None)

    def __str__(self) -> str:
        wrong = self.first_wrong
        head = (f"{len(self.checks)} buffers compared with eager; "
                + ("all within eager's rounding" if wrong is None else f"first wrong: {wrong.label} ({wrong.buffer})"))
        return "\n".join([head] + [str(c) for c in self.checks])


_report: CheckReport | None = None  # where observers record, inside check_kernels


def check_kernels(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CheckReport:
    """Compile ``fn`` with ``backend="fuse"``, call it once on ``args`` with every buffer checked,
    and return the comparisons. ``fn`` may call ``backward()``: backward graphs are checked too."""
    global _report
    torch._dynamo.reset()  # graphs compiled before were compiled without the checks
    report = _report = CheckReport()
    try:
        with config.patch(check_kernels=True):
            torch.compile(fn, backend="fuse")(*args, **kwargs)
    finally:
        _report = None
        torch._dynamo.reset()  # and those compiled here carry them
    return report


class Observer:
    """Bound into a checking wrapper as ``observe``: computes the reference values of one call
    (``start``) and compares what each step stored (``__call__``)."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, fx_values: dict[str, str]) -> None:
        self.gm = gm
        self.name = name
        self.fx_values = fx_values
        self.eager: dict[str, Any] = {}
        self.exact: dict[str, Any] = {}
        self.warned = False

    def start(self, args: list[Any]) -> None:
        self.eager = _node_values(self.gm, [_clone(a) for a in args], widen=False)
        self.exact = _node_values(self.gm, [_clone(a, torch.float64) for a in args], widen=True)

    def __call__(self, step: int, label: str, buffers: dict[str, torch.Tensor]) -> None:
        for name, value in buffers.items():
            fx_node = self.fx_values[name]
            check = _compare(value, self.eager.get(fx_node), self.exact.get(fx_node))
            if check is None:
                continue
            fuse_error, eager_error, ok = check
            result = BufferCheck(self.name, step, label, name, fx_node, fuse_error, eager_error, ok)
            if _report is not None:
                _report.checks.append(result)
            elif not ok and not self.warned:  # FUSE_CHECK_KERNELS=1 on a whole program
                warnings.warn(f"fusebackend: first wrong buffer of graph {self.name}: {result}", stacklevel=2)
                self.warned = True


def _clone(value: Any, float_dtype: torch.dtype | None = None) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    out = value.detach().clone()
    if float_dtype is not None and out.is_floating_point():
        out = out.to(float_dtype)
    return out


def _node_values(gm: torch.fx.GraphModule, args: list[Any], widen: bool) -> dict[str, Any]:
    """Every node's value when the graph runs eagerly; with ``widen``, every floating dtype the
    graph asks for (casts, factories) becomes float64."""
    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if n.op == "call_function":
                if isinstance(result, (list, tuple)):
                    for k, v in enumerate(result):
                        values[f"{n.name}[{k}]"] = v
                values[n.name] = result
            return result

        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            if widen:
                args, kwargs = pytree.tree_map(_wide_dtype, (args, kwargs))
            return super().call_function(target, args, kwargs)

    with torch.no_grad():
        Recorder(gm).run(*args)
    return values


def _wide_dtype(value: Any) -> Any:
    return torch.float64 if isinstance(value, torch.dtype) and value.is_floating_point else value


def _compare(value: torch.Tensor, eager: Any, exact: Any) -> tuple[float, float, bool] | None:
    if not (isinstance(eager, torch.Tensor) and isinstance(exact, torch.Tensor)):
        return None
    if value.shape != eager.shape:
        return 1.0, 0.0, False
    if not value.is_floating_point():
        same = torch.equal(value.cpu(), eager.cpu())
        return (0.0 if same else 1.0), 0.0, same
    ref = exact.detach().to("cpu", torch.float64)
    scale = max(float(ref.abs().nan_to_num(0.0, 0.0, 0.0).max()) if ref.numel() else 0.0, 1e-30)

    def distance(t: torch.Tensor) -> float:
        d = (t.detach().to("cpu", torch.float64) - ref).abs()
        d = torch.where(torch.isnan(d) & torch.isnan(ref), torch.zeros_like(d), d)  # NaN where eager's is
        return float(d.nan_to_num(float("inf")).max()) / scale if d.numel() else 0.0

    fuse_error, eager_error = distance(value), distance(eager)
    ulp = torch.finfo(value.dtype).eps
    return fuse_error, eager_error, fuse_error <= 2 * eager_error + 4 * ulp
