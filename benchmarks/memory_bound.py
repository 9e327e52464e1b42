"""Memory-bound cases: pointwise chains, normalizations, softmax, reductions.

Each case's time is measured against its bandwidth floor: the bytes it must move (each input read
once, each output written once, computed from the tensors by ``harness.io_bytes``) over the copy
bandwidth measured in the same run. The default shapes are full-size, for a GPU; ``--small``
swaps in tiny shapes so the suite runs on a CPU through Triton's interpreter.

    python -m benchmarks.memory_bound [--small] [--cases name,name] [--out DIR]

What each case's timed step is: one call of the function below on its inputs, nothing else.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from benchmarks import harness
from benchmarks.harness import Case, function_case, io_bytes

bf16 = torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Shapes:
    rows: int  # the 2-D cases are rows x cols
    cols: int
    flat: int  # elements of the 1-D fp32 case
    attn: tuple[int, int, int, int]  # batch, heads, queries, keys of the masked softmax
    nchw: tuple[int, int, int, int]  # the batch-norm input


GPU = Shapes(rows=8192, cols=8192, flat=64 << 20, attn=(32, 16, 1024, 1024), nchw=(256, 1024, 56, 56))
# Small: non-powers of two, so masked tails are exercised; the interpreter runs reductions slowly.
SMALL = Shapes(rows=8, cols=48, flat=3000, attn=(2, 2, 8, 24), nchw=(2, 8, 5, 7))


# The functions timed. Module level, so each has one code object for Dynamo and the harness
# can make fresh function objects of it.

def gelu_affine(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x * w + b)


def add_layer_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x + r, (x.shape[-1],), w, b, eps=1e-5)


def rms_norm_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)


def softmax_fp32(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def sum_dim0(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=0)


def sum_dim1(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=1)


def transpose_copy(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous()


def silu_mul_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b + 1


def scaled_masked_softmax(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(s * 0.125 + mask, dim=-1)


def batch_norm_relu(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                    w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.relu(F.batch_norm(x, mean, var, w, b, training=False, eps=1e-5))


def cases(device: torch.device, small: bool) -> list[Case]:
    """The suite, with inputs on ``device``; tiny shapes with ``small``."""
    s = SMALL if small else GPU
    rows, cols = s.rows, s.cols

    def randn(*shape: int, dtype: torch.dtype = bf16) -> torch.Tensor:
        return torch.randn(shape, device=device, dtype=dtype)

    def matrix_and_vectors(vectors: int) -> Callable[[], tuple[torch.Tensor, ...]]:
        return lambda: (randn(rows, cols),) + tuple(randn(cols) for _ in range(vectors))

    def attention_inputs() -> tuple[torch.Tensor, ...]:
        b, h, q, k = s.attn
        causal = torch.full((q, k), float("-inf"), device=device).triu(k - q + 1)
        mask = (0.5 * torch.randn(b, 1, q, k, device=device) + causal).to(bf16)
        return randn(b, h, q, k), mask

    def batch_norm_inputs() -> tuple[torch.Tensor, ...]:
        n, c, h, w = s.nchw
        x = randn(n, h, w, c).permute(0, 3, 1, 2)  # channels-last strides, no copy
        mean = 0.1 * randn(c)
        var = (0.5 + torch.rand(c, device=device)).to(bf16)
        return x, mean, var, 1 + 0.1 * randn(c), 0.1 * randn(c)

    m = f"bf16 {rows}x{cols}"
    return [
        # floor: read x, w, b; write out
        function_case("gelu_affine", f"gelu(x * w + b), {m}, w and b vectors", gelu_affine,
                      matrix_and_vectors(2), io_bytes),
        # floor: read x, r, weight, bias; write out
        function_case("add_layer_norm", f"layer_norm(x + r) over the last dim with weight and bias, {m}",
                      add_layer_norm, lambda: (randn(rows, cols), randn(rows, cols), randn(cols), randn(cols)), io_bytes),
        # floor: read x, w; write out (bf16)
        function_case("rms_norm_fp32", f"RMS norm, fp32 math, cast back, {m}", rms_norm_fp32,
                      matrix_and_vectors(1), io_bytes),
        # floor: read x; write out (bf16)
        function_case("softmax_fp32", f"softmax over the last dim in fp32, {m} in and out", softmax_fp32,
                      lambda: (randn(rows, cols),), io_bytes),
        # floor: read x; write the row of sums
        function_case("sum_dim0", f"sum over dim 0, {m} -> {cols}", sum_dim0,
                      lambda: (randn(rows, cols),), io_bytes),
        # floor: read x; write the column of sums. Row sums read the same bytes as sum_dim0 with
        # each program streaming whole rows: a reference for what a read-only pass reaches
        function_case("sum_dim1", f"reference: sum over dim 1, {m} -> {rows} (read-only, rows contiguous)", sum_dim1,
                      lambda: (randn(rows, cols),), io_bytes),
        # floor: read x; write its transpose. A tiled copy (reads along the input's rows, writes
        # along the output's): a reference for the transposes of attention heads
        function_case("transpose_copy", f"reference: x.t().contiguous(), {m}", transpose_copy,
                      lambda: (randn(rows, cols),), io_bytes),
        # floor: read a, b; write out (fp32)
        function_case("silu_mul_add", f"silu(a) * b + 1, fp32, {s.flat} elements", silu_mul_add,
                      lambda: (randn(s.flat, dtype=torch.float32), randn(s.flat, dtype=torch.float32)), io_bytes),
        # floor: read s, mask (broadcast over heads, read once); write out
        function_case("scaled_masked_softmax",
                      f"softmax(s * 0.125 + mask), bf16 {'x'.join(map(str, s.attn))}, causal+random mask "
                      f"broadcast over heads", scaled_masked_softmax, attention_inputs, io_bytes),
        # floor: read x and the four channel vectors; write out
        function_case("batch_norm_relu",
                      f"batch_norm (eval, running stats) + relu, bf16 channels-last {'x'.join(map(str, s.nchw))}",
                      batch_norm_relu, batch_norm_inputs, io_bytes),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_bound", description=__doc__.split("\n\n")[0])
    harness.add_arguments(parser)
    harness.main_for(["memory_bound"], parser.parse_args(argv))


if __name__ == "__main__":
    main()
