"""A costly activation read by two kernels: ConvNeXt V2's GELU then GRN, computed again in
each reader against stored once.

ConvNeXt V2's block expands its channels 4x by a product, applies the exact (erf) GELU, then
GRN: the sum of squares of each sample's channel over its positions (a column reduction,
channels last), and a pointwise pass that scales each element by it. Until 2026-12-01 the
scheduler recomputed the GELU in both readers (``scheduler/recompute.py``: its inputs cost no
more bytes than its result, so recomputing never moves more memory), so both kernels evaluated
``erf`` for every element. The zoo's audit (H200, b64, 2026-11-28) gave the GRN sum's kernels
910 us of a 5.5 ms inference step at 29% of their floor, where the same sums without the GELU
(``column_configs_study.py``) run at 64-84% of theirs: the sum's kernel was bound by its
instructions, not its bytes. Since then recomputing weighs the instructions it adds against the
bytes it saves (``scheduler/instructions.py``), and at these sizes the GELU is stored by the
sum's kernel.

Variants:

- ``default``: as fuse generates it;
- ``recomputed``: the rule before, every such chain recomputed (``recompute.too_costly`` None);
- ``stored``: nothing recomputed (``recompute.MAX_OPS`` = 0 while it compiles);
- ``8 warps``: the default's kernels, the column reduction with 8 warps a program where the
  default has 4;
- ``inductor``; ``eager``.

Each is checked against eager, then timed as 20 calls replayed in one CUDA graph (the kernels
alone), us a call and % of the floor: the input read once and the output written once over the
copy bandwidth measured in the same run.

    PYTHONPATH=. python -m benchmarks.studies.costly_recompute_study            # on a GPU
    PYTHONPATH=. python -m benchmarks.studies.costly_recompute_study --check    # outputs only, any device
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusebackend  # noqa: E402
from benchmarks.timing import graph_replay_us, study_parser, study_setup  # noqa: E402
from fusebackend.kernels import runtime  # noqa: E402
from fusebackend.scheduler import recompute  # noqa: E402


def gelu_grn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """transformers' ConvNextV2 GELU and GRN over channels-last ``x`` [N, H, W, C]."""
    h = F.gelu(x)
    g = torch.linalg.vector_norm(h, ord=2, dim=(1, 2), keepdim=True)
    n = g / (g.mean(dim=-1, keepdim=True) + 1e-6)
    return weight * (h * n) + bias + h


@contextlib.contextmanager
def stored() -> Iterator[None]:
    saved = recompute.MAX_OPS
    recompute.MAX_OPS = 0
    try:
        yield
    finally:
        recompute.MAX_OPS = saved


@contextlib.contextmanager
def recomputed() -> Iterator[None]:
    saved = recompute.too_costly
    recompute.too_costly = lambda expanded, readers: None
    try:
        yield
    finally:
        recompute.too_costly = saved


@contextlib.contextmanager
def eight_warps() -> Iterator[None]:
    today = runtime.reduction_config

    def config(xnumel: int, rnumel: int, row_contiguous: bool, *args: Any, **kw: Any) -> dict[str, int]:
        blocks = today(xnumel, rnumel, row_contiguous, *args, **kw)
        return blocks if row_contiguous or "num_warps" not in blocks else {**blocks, "num_warps": 8}

    runtime.reduction_config = config
    try:
        yield
    finally:
        runtime.reduction_config = today


def _kernel(name: str, source: str) -> str:
    """A kernel's name, whether it evaluates ``erf``, and its bytes."""
    moved = re.search(r"# (reads \d+ B, writes \d+ B)", source)
    return f"{name}{' (erf)' if 'erf' in source else ''}{f' {moved.group(1)}' if moved else ''}"


STAGES = ((56, 384), (28, 768), (14, 1536), (7, 3072))  # ConvNeXt V2-T's GRN: positions, 4x channels


def main() -> None:
    args, device, bandwidth = study_setup(study_parser(__doc__))
    gpu, timed = device.type == "cuda", bandwidth > 0
    variants: dict[str, tuple[Any, Callable[[], Any]]] = {
        "eager": (None, contextlib.nullcontext),
        "default": (fusebackend.fuse, contextlib.nullcontext),
        "recomputed": (fusebackend.fuse, recomputed),
        "stored": (fusebackend.fuse, stored),
        "8 warps": (fusebackend.fuse, eight_warps),
        "inductor": ("inductor", contextlib.nullcontext),
    }
    if not gpu:
        del variants["inductor"]  # (its CPU kernels are C++, not what the study compares)
    print(f"{'case':28s}" + "".join(f"  {v + ' us (floor)':>22s}" for v in variants))
    for h, c in STAGES:
        n = 64 if gpu else 2
        if not gpu:
            h, c = max(h // 14, 2), c // 16
        torch.manual_seed(0)
        x = torch.randn(n, h, h, c, device=device).to(torch.bfloat16)
        weight, bias = (0.1 * torch.randn(c, device=device)).to(torch.bfloat16), \
            (0.1 * torch.randn(c, device=device)).to(torch.bfloat16)
        want = gelu_grn(x.double(), weight.double(), bias.double())
        floor_us = 2 * x.numel() * x.element_size() / bandwidth * 1e6 if bandwidth else 0.0
        cells: list[str] = []
        shapes: list[str] = []
        for variant, (backend, context) in variants.items():
            torch._dynamo.reset()
            fn = gelu_grn if backend is None else torch.compile(gelu_grn, backend=backend)
            with context(), fusebackend.config.patch(graph_cache=False):
                got = fn(x, weight, bias)  # compiled here, under the variant
            if backend is fusebackend.fuse:
                kernels = fusebackend.history()[-1].kernels
                shapes.append(f"{variant}: " + ", ".join(_kernel(name, src) for name, src in kernels.items()))
            err = ((got.double() - want).abs().max() / want.abs().max()).item()
            if err > 2e-2:
                raise AssertionError(f"{variant} at {n}x{h}x{h}x{c}: error {err:.2e} against float64")
            if timed:
                us = graph_replay_us(lambda: fn(x, weight, bias))
                cells.append(f"{us:10.2f} ({floor_us / us:4.0%})")
            else:
                cells.append(f"{f'ok, error {err:.1e}':>22s}")
        print(f"{f'GELU, GRN b{n} {h}x{h}x{c}':28s}" + "".join(f"  {cell:>22s}" for cell in cells), flush=True)
        for shape in shapes:
            print(f"    {shape}")


if __name__ == "__main__":
    main()
