"""Checking a compiled variant's outputs against eager's.

``compare(actual, expected)`` walks both output structures, requires the same tensor count,
shapes and dtypes, equal integer outputs, NaN and infinity in the same places, and for floating
outputs a normwise relative difference within the dtype's tolerance plus a gross elementwise
bound. It returns the largest normwise difference, which the report shows as ``err``.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch


def tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors in a nested structure of tuples, lists and dicts, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in tensors(item)]
    return []


# Per dtype: (normwise, elementwise). Normwise: ||out - eager|| / ||eager|| must not exceed it.
# Half types are computed in fp32 by the backends and rounded once while eager rounds after every
# op, so they differ by a few units in the last place; fp32 reductions (a training step's
# gradients) sum in a different order, which costs up to a few 1e-5. Elementwise is a gross check
# that catches a few wrong or unwritten elements a norm hides: |out - eager| <= tol * (|eager| + rms).
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-4, 1e-3),
    torch.float16: (5e-3, 5e-2),
    torch.bfloat16: (2e-2, 1e-1),
}
_CHUNK = 1 << 24  # elements compared at a time, to bound the temporaries of the large cases


class Mismatch(Exception):
    """A compiled output differs from eager beyond tolerance (or in structure, shape or dtype)."""


def compare(actual: Any, expected: Any, precision: torch.dtype | None = None) -> tuple[float, list[str]]:
    """Check ``actual`` against eager's ``expected``; return the largest normwise relative error
    over all floating-point outputs, and notes (such as a different memory layout).

    ``precision``: the dtype the outputs were computed in, when that is coarser than their own
    (a bf16 model's fp32 loss carries bf16 rounding): its tolerance applies where it is looser.

    Raises ``Mismatch`` with the reason when they differ.
    """
    got, want = tensors(actual), tensors(expected)
    if len(got) != len(want):
        raise Mismatch(f"{len(got)} output tensors, eager has {len(want)}")
    worst, notes = 0.0, []
    for i, (a, e) in enumerate(zip(got, want)):
        if a.shape != e.shape or a.dtype != e.dtype:
            raise Mismatch(f"output {i}: {describe(a)}, eager {describe(e)}")
        if a.stride() != e.stride() and a.numel() > 1:
            notes.append(f"output {i} strides {a.stride()} (eager {e.stride()})")
        if not e.dtype.is_floating_point:
            if not torch.equal(a, e):
                raise Mismatch(f"output {i} ({describe(e)}) differs")
            continue
        worst = max(worst, _compare_float(i, a.detach(), e.detach(), precision))
    return worst, notes


def _is_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill a contiguous stretch of memory, in some dimension order."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda ss: ss[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _flatten(a: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both as 1-D, element for element: views in memory order when they share one dense layout
    (no copy of a large tensor), else copies in logical order."""
    if a.stride() == e.stride() and _is_dense(e):
        return a.as_strided((a.numel(),), (1,)), e.as_strided((e.numel(),), (1,))
    return a.reshape(-1), e.reshape(-1)


def _tolerances(dtype: torch.dtype, precision: torch.dtype | None) -> tuple[float, float]:
    """(normwise, elementwise) for an output of ``dtype`` computed in ``precision``."""
    norm_tol, elem_tol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    if precision is not None:
        coarse = TOLERANCE.get(precision, TOLERANCE[torch.float32])
        norm_tol, elem_tol = max(norm_tol, coarse[0]), max(elem_tol, coarse[1])
    return norm_tol, elem_tol


def _chunks(fa: torch.Tensor, fb: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Matching float64 pieces of two flat tensors, ``_CHUNK`` elements at a time."""
    for start in range(0, fb.numel(), _CHUNK):
        yield fa[start:start + _CHUNK].double(), fb[start:start + _CHUNK].double()


def _compare_float(i: int, a: torch.Tensor, e: torch.Tensor, precision: torch.dtype | None) -> float:
    norm_tol, elem_tol = _tolerances(e.dtype, precision)
    fa, fe = _flatten(a, e)
    n = fe.numel()
    diff_sq = ref_sq = 0.0
    for ca, ce in _chunks(fa, fe):
        if not torch.equal(ca.isnan(), ce.isnan()):
            raise Mismatch(f"output {i}: NaN where eager has none, or the reverse")
        inf = ce.isinf() | ca.isinf()
        if not torch.equal(ca[inf], ce[inf]):
            raise Mismatch(f"output {i}: infinities differ from eager")
        finite = ce.isfinite()
        ce, ca = ce[finite], ca[finite]
        diff_sq += float((ca - ce).square().sum())
        ref_sq += float(ce.square().sum())
    rel = math.sqrt(diff_sq) / max(math.sqrt(ref_sq), 1e-30) if diff_sq else 0.0
    if rel > norm_tol:
        raise Mismatch(f"output {i} ({describe(e)}): ||out - eager|| / ||eager|| = {rel:.2e} > {norm_tol:.0e}")
    rms = math.sqrt(ref_sq / max(n, 1))
    for ca, ce in _chunks(fa, fe):
        finite = ce.isfinite()
        excess = (ca - ce).abs() - elem_tol * (ce.abs() + rms)
        bad = int((excess[finite] > 0).sum())
        if bad:
            raise Mismatch(f"output {i} ({describe(e)}): {bad} elements off by more than "
                           f"{elem_tol:g} x (|eager| + rms) though the norm agrees")
    return rel


# A half-precision output that misses eager's tolerance still passes when, measured against the
# same computation in fp32, its error is at most this many times eager's own error: eager's
# half-precision rounding is then the larger part of the difference (a training step's bf16
# gradients, rounded after every op in eager and once in a fused kernel, say).
REFERENCE_MULTIPLIER = 2.0


def against_reference(actual: Any, expected: Any, reference: Any,
                      precision: torch.dtype | None = None) -> tuple[float, str]:
    """Check half-precision outputs against an fp32 ``reference`` of the same computation.

    Every floating output must be within its normwise tolerance of eager's (``compare``'s, with
    ``precision``), or have a
    normwise error against ``reference`` at most ``REFERENCE_MULTIPLIER`` times eager's. Returns
    the largest normwise difference from eager and a note naming the outputs that needed the
    reference; raises ``Mismatch`` otherwise.
    """
    got, want, ref = tensors(actual), tensors(expected), tensors(reference)
    if not len(got) == len(want) == len(ref):
        raise Mismatch(f"{len(got)} output tensors, eager has {len(want)}, the reference {len(ref)}")
    notes, worst = [], 0.0
    for i, (a, e, r) in enumerate(zip(got, want, ref)):
        if not e.dtype.is_floating_point:
            if not torch.equal(a, e):
                raise Mismatch(f"output {i} ({describe(e)}) differs")
            continue
        to_eager = _normwise(a, e)
        worst = max(worst, to_eager)
        if to_eager <= _tolerances(e.dtype, precision)[0]:
            continue
        mine, eagers = _normwise(a, r), _normwise(e, r)
        if not mine <= REFERENCE_MULTIPLIER * eagers:
            raise Mismatch(f"output {i} ({describe(e)}): ||out - eager|| / ||eager|| = {to_eager:.2e}, and "
                           f"against fp32 {mine:.2e} where eager's is {eagers:.2e}")
        notes.append(f"output {i} ({describe(e)}) is {to_eager:.1e} from eager; against fp32 {mine:.1e}, "
                     f"eager {eagers:.1e}")
    return worst, "checked against fp32: " + "; ".join(notes) if notes else ""


def _normwise(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 where b is finite (inf where a is not there)."""
    diff_sq = ref_sq = 0.0
    for ca, cb in _chunks(*_flatten(a.detach(), b.detach())):
        finite = cb.isfinite()
        if not bool(ca[finite].isfinite().all()):
            return math.inf
        diff_sq += float((ca[finite] - cb[finite]).square().sum())
        ref_sq += float(cb[finite].square().sum())
    return math.sqrt(diff_sq) / max(math.sqrt(ref_sq), 1e-30) if diff_sq else 0.0


def describe(t: torch.Tensor) -> str:
    """``bf16[8192, 8192]`` style, with ``cl`` for channels-last 4-D tensors."""
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}.get(
        t.dtype, str(t.dtype).replace("torch.", ""))
    layout = " cl" if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last) else ""
    return f"{dtype}[{', '.join(map(str, t.shape))}]{layout}"
