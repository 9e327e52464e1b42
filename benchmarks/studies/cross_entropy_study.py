"""A language model's cross-entropy over its vocabulary, forward and backward: fuse's kernels
against variants of them and Inductor's.

The zoo's audit lists the backward's kernel under half its floor in every causal LM's training
step (H200, 2026-11-28: GPT-2 453 us, 43%; OPT 614 us, 47%, where Inductor's kernel over some
of the same nodes took 359 us). fuse generates it as a looped reduction of one row a program
(4096 positions a step, 16 warps): a first loop adds up the row of ``nll_loss``'s backward (a
one-hot: zeros but the target's position), reading nothing; a second reads the logits and
writes their gradient. Compiled for sm_90 the kernel takes 59 registers a thread, two programs
an SM, 16 KiB of loads in flight an SM.

Variants, each for the same compiled function (the loss's forward and backward from bf16
logits, as transformers computes it: ``F.cross_entropy(logits.float(), labels,
ignore_index=-100)``):

- ``fuse``: as generated today;
- ``one-hot folded``: a sum over a one-hot taken as its one value (``one_hot_sum`` below, a
  patch of the lowering while the study compiles): the backward becomes one pointwise pass;
- ``rows of 8192``: the looped kernels take 8192 positions a step with 16 warps (16 elements a
  thread in flight, not 8);
- ``inductor``; ``eager``.

Each is checked against eager's float32 loss and gradient, then timed as forward + backward
(``do_bench``, L2 flushed) against the floor: the logits read by the forward and by the
backward, the gradient written.

    PYTHONPATH=. python -m benchmarks.studies.cross_entropy_study            # on a GPU
    PYTHONPATH=. python -m benchmarks.studies.cross_entropy_study --check    # outputs only, any device
    PYTHONPATH=. python -m benchmarks.studies.cross_entropy_study --check --models gpt2 --rows 2  # (the tests')
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import sympy
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusebackend  # noqa: E402
from fusebackend import indexing, ir  # noqa: E402
from fusebackend.inlining import producer_index  # noqa: E402
from fusebackend.kernels import runtime  # noqa: E402
from fusebackend.lowering.builder import IRBuilder  # noqa: E402
from benchmarks.timing import study_parser, study_setup  # noqa: E402

VOCABS = {"gpt2": 50257, "opt": 50272, "llama": 32000}


# ------------------------------------------------------------------------- the one-hot fold

def one_hot_sum(value: ir.Expr, rvar: sympy.Symbol, size: int, inline: Callable[[ir.Load], ir.Expr | None]
                ) -> ir.Expr | None:
    """The sum over ``rvar`` in [0, size) of ``value`` where it is ``where(P == rvar, B, 0)``
    with P and B the same at every ``rvar`` (through casts, negation, products with and
    division by values the same along the row, and ``where``s on conditions the same along it
    with 0 on the other side): B where 0 <= P < size, else 0. None where it is not that form."""
    found = _match(value, rvar, inline, 8)
    if found is None:
        return None
    position, picked = found
    inside = ir.op("logical_and", ir.op("ge", position, ir.Constant(0, position.dtype), dtype=torch.bool),
                   ir.op("lt", position, ir.Constant(size, position.dtype), dtype=torch.bool), dtype=torch.bool)
    return ir.op("where", inside, picked, ir.Constant(ir._convert_scalar(0, picked.dtype), picked.dtype))


def _resolve(e: ir.Expr, inline: Callable[[ir.Load], ir.Expr | None], depth: int) -> ir.Expr:
    while isinstance(e, ir.Load) and depth > 0:
        body = inline(e)
        if body is None:
            break
        e, depth = body, depth - 1
    return e


def _depends(e: ir.Expr, rvar: sympy.Symbol) -> bool:
    for sub in ir.walk(e):
        if isinstance(sub, (ir.Load, ir.IndirectLoad)):
            if any(rvar in sympy.sympify(i).free_symbols for i in sub.index):
                return True
        elif isinstance(sub, ir.IndexValue) and rvar in sympy.sympify(sub.index).free_symbols:
            return True
    return False


def _is_zero(e: ir.Expr, inline: Callable[[ir.Load], ir.Expr | None], depth: int) -> bool:
    e = _resolve(e, inline, depth)
    return isinstance(e, ir.Constant) and e.value == 0 and not isinstance(e.value, bool)


def _compared(cond: ir.Expr, rvar: sympy.Symbol, inline: Callable[[ir.Load], ir.Expr | None],
              depth: int) -> ir.Expr | None:
    cond = _resolve(cond, inline, depth)
    if not (isinstance(cond, ir.Op) and cond.name == "eq"):
        return None
    for here, other in (cond.args, cond.args[::-1]):
        if (isinstance(here, ir.IndexValue) and sympy.sympify(here.index) == rvar and not _depends(other, rvar)
                and not other.dtype.is_floating_point and other.dtype != torch.bool):
            return other
    return None


def _match(e: ir.Expr, rvar: sympy.Symbol, inline: Callable[[ir.Load], ir.Expr | None],
           depth: int) -> tuple[ir.Expr, ir.Expr] | None:
    e = _resolve(e, inline, depth)
    if not isinstance(e, ir.Op) or depth < 0:
        return None
    args = e.args
    if e.name == "where":
        cond, yes, no = args
        position = _compared(cond, rvar, inline, depth)
        if position is not None and _is_zero(no, inline, depth) and not _depends(yes, rvar):
            return position, yes
        if _depends(cond, rvar):
            return None
        for keep, zero in ((1, 2), (2, 1)):
            if _is_zero(args[zero], inline, depth):
                inner = _match(args[keep], rvar, inline, depth - 1)
                if inner is None:
                    return None
                parts = list(args)
                parts[keep] = inner[1]
                return inner[0], ir.op("where", *parts)
        return None
    if e.name in ("to", "neg"):
        inner = _match(args[0], rvar, inline, depth - 1)
        if inner is None:
            return None
        return inner[0], ir.cast(inner[1], e.dtype) if e.name == "to" else ir.op("neg", inner[1])
    if e.name == "mul":
        for k in (0, 1):
            if not _depends(args[1 - k], rvar):
                inner = _match(args[k], rvar, inline, depth - 1)
                if inner is not None:
                    return inner[0], ir.op("mul", *((inner[1], args[1]) if k == 0 else (args[0], inner[1])))
        return None
    if e.name == "truediv" and not _depends(args[1], rvar):
        inner = _match(args[0], rvar, inline, depth - 1)
        return None if inner is None else (inner[0], ir.op("truediv", inner[1], args[1]))
    return None


@contextlib.contextmanager
def folded_one_hots() -> Iterator[None]:
    """While it is open, a sum over one dim that ``one_hot_sum`` takes is lowered as its value."""
    original = IRBuilder.reduce

    def reduce(self: IRBuilder, src: Any, dims: Any, keepdim: bool, reduction_type: str, out_dtype: torch.dtype,
               body: Any, strides: Any = None) -> Any:
        if reduction_type == "sum":
            parts = self._reduction_parts(src, dims, keepdim, body)
            if len(parts.rranges) == 1 and all(isinstance(n, int) for n in (*parts.rranges, *parts.out_sizes)):
                rvar = indexing.loop_vars("r", 1)[0]
                ranges = dict(zip(indexing.loop_vars("i", len(parts.out_sizes)), parts.out_sizes))
                ranges[rvar] = parts.rranges[0]
                producers = self._pointwise_producers()

                def inline(load: ir.Load) -> ir.Expr | None:
                    producer = producers.get(load.view.buffer.name)
                    if producer is None:
                        return None
                    where = producer_index(producer, load.view, [sympy.sympify(i) for i in load.index], ranges)
                    pvars = indexing.loop_vars("i", len(producer.buffer.sizes))
                    return ir.substitute_index(producer.body, dict(zip(pvars, where)))

                picked = one_hot_sum(parts.value, rvar, parts.rranges[0], inline)
                if picked is not None:
                    return self._add_pointwise(tuple(parts.out_sizes), out_dtype, ir.cast(picked, out_dtype),
                                               None if strides is None else tuple(strides),
                                               self.origin + " (a sum over a one-hot: its one value)")
        return original(self, src, dims, keepdim, reduction_type, out_dtype, body, strides)

    IRBuilder.reduce = reduce  # type: ignore[method-assign]
    try:
        yield
    finally:
        IRBuilder.reduce = original  # type: ignore[method-assign]


@contextlib.contextmanager
def rows_of_8192() -> Iterator[None]:
    original = runtime.reduction_config

    def config(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1, **kw: Any) -> dict[str, int]:
        chosen = original(xnumel, rnumel, row_contiguous, passes, **kw)
        if row_contiguous and chosen.get("RBLOCK") == 4096 and rnumel > 8192:
            return {"XBLOCK": 1, "RBLOCK": 8192, "num_warps": 16}
        return chosen

    runtime.reduction_config = config
    try:
        yield
    finally:
        runtime.reduction_config = original


# ------------------------------------------------------------------------------ the study

def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, ignore_index=-100)


def step_of(fn: Callable[..., torch.Tensor], logits: torch.Tensor, labels: torch.Tensor
            ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    leaf = logits.detach().requires_grad_()

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        leaf.grad = None
        loss = fn(leaf, labels)
        loss.backward()
        return loss.detach(), leaf.grad

    return step


def main() -> None:
    parser = study_parser(__doc__)
    parser.add_argument("--rows", type=int, default=None, help="rows of logits (default 4096 on a GPU, 8 elsewhere)")
    parser.add_argument("--models", default=",".join(VOCABS), help="whose vocabularies: " + ", ".join(VOCABS))
    args, device, bandwidth = study_setup(parser)
    gpu, timed = device.type == "cuda", bandwidth > 0
    rows = args.rows or (4096 if gpu else 8)
    variants: dict[str, tuple[Any, Callable[[], Any]]] = {
        "eager": (None, contextlib.nullcontext),
        "fuse": (fusebackend.fuse, contextlib.nullcontext),
        "one-hot folded": (fusebackend.fuse, folded_one_hots),
        "rows of 8192": (fusebackend.fuse, rows_of_8192),
        "inductor": ("inductor", contextlib.nullcontext),
    }
    if not gpu:
        del variants["inductor"]  # (its CPU kernels are C++, not what the study compares)
    print(f"{'model':8s} {'rows x vocab':>14s}" + "".join(f"  {v + ' us (floor)':>24s}" for v in variants))
    for model in args.models.split(","):
        vocab = VOCABS[model]
        torch.manual_seed(0)
        logits = (3 * torch.randn(rows, vocab, device=device)).to(torch.bfloat16)
        labels = torch.randint(0, vocab, (rows,), device=device)
        labels[::7] = -100  # padding, as a causal LM's shifted labels have
        want_loss, want_grad = step_of(loss_fn, logits, labels)()
        floor_us = 3 * logits.numel() * logits.element_size() / bandwidth * 1e6 if bandwidth else 0.0
        cells: list[str] = []
        shapes: list[str] = []
        for backend, context in variants.values():
            torch._dynamo.reset()
            fn = loss_fn if backend is None else torch.compile(loss_fn, backend=backend)
            step = step_of(fn, logits, labels)
            with context(), fusebackend.config.patch(graph_cache=False):
                loss, grad = step()  # compiled here, under the variant
            if backend is fusebackend.fuse:
                kernels = [k for g in fusebackend.history()[-2:] for k in g.kernels]
                shapes.append(f"{len(kernels)} kernels: " + ", ".join(kernels))
            torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(grad.float(), want_grad.float(), rtol=1e-2, atol=1e-6)
            if timed:
                from triton.testing import do_bench

                us = do_bench(step, warmup=25, rep=200, return_mode="median") * 1e3
                cells.append(f"{us:10.1f} ({floor_us / us:4.0%})")
            else:
                cells.append(f"{'ok':>24s}")
        print(f"{model:8s} {f'{rows} x {vocab}':>14s}" + "".join(f"  {c:>24s}" for c in cells), flush=True)
        for name, shape in zip([v for v, (b, _) in variants.items() if b is fusebackend.fuse], shapes):
            print(f"    {name}: {shape}")


if __name__ == "__main__":
    main()
