"""Matrix products with their epilogue in the product's kernel, against cuBLAS and a kernel after it.

fuse calls cuBLAS for every matrix product; the pointwise work after one (a bias and GELU, the
GELU of a gate times its up projection) is a kernel of its own that reads the product's output
back from memory. A generated Triton GEMM can apply that work to its accumulators before it stores
them: the product's output is written once, smaller where the epilogue narrows it (GeGLU: half),
and never read again. Whether that wins depends on whether the generated GEMM keeps up with
cuBLAS's; this study times both at the shapes of the zoo's transformer MLPs, before products
become template nodes in fuse's IR.

Cases (bf16 on a GPU; each output checked against a float64 product of the same inputs):

- ``bias_gelu``: ``gelu_tanh(x @ w + b)``, GPT-2's MLP up projection at b16 s512
  (``x`` 8192 x 768, ``w`` 768 x 3072);
- ``geglu``: ``gelu_tanh(x @ w_gate) * (x @ w_up)``, a Gemma-style MLP at b8 s512 (``x`` 4096 x
  2048, each weight 2048 x 16384; Gemma 2B's sizes).

Variants:

- ``cublas+kernel``: ``torch.mm`` (``addmm`` with the bias; one product over both weights side by
  side for GeGLU), then one Triton pointwise kernel for the epilogue: what fuse runs today;
- ``cublaslt`` (``bias_gelu`` only): ``aten._addmm_activation(..., use_gelu=True)``, cuBLASLt's
  own bias + GELU epilogue;
- ``template``: one Triton GEMM (tiles of ``BLOCK_M`` x ``BLOCK_N`` over k steps of ``BLOCK_K``,
  programs grouped ``GROUP_M`` tiles high for L2 reuse) whose epilogue is computed on the fp32
  accumulators; GeGLU's keeps two accumulators, the gate's and the up projection's, over the same
  rows of ``x``. The best of ``CONFIGS`` is reported, with it.

    python -m benchmarks.studies.epilogue_gemm            # a GPU: times every variant
    python -m benchmarks.studies.epilogue_gemm --check    # checks them (CPU: Triton's interpreter,
                                                          # float32 at small sizes)
"""

from __future__ import annotations

import argparse
import ast
import functools
import math
import os

import torch

CASES = {  # name: (M, K, N) at real sizes
    "bias_gelu": (8192, 768, 3072),
    "geglu": (4096, 2048, 16384),
}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); GeGLU's N is each projection's
CONFIGS = ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (64, 128, 64, 4, 4),
           (128, 64, 64, 4, 4))
CHECK_CONFIGS = ((16, 16, 16, 4, 1), (32, 16, 16, 4, 1))
GROUP_M = 8
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@functools.cache
def _kernels():  # built once, on first use: the interpreter must be chosen before Triton decorates them
    # the helpers the kernels call are the module's names, where Triton looks them up
    global gelu_tanh, tile, load_tile, store_tile
    import triton
    import triton.language as tl

    @triton.jit
    def gelu_tanh(v):
        inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        return 0.5 * v * (2.0 / (1.0 + tl.exp(-2.0 * inner)))  # 1 + tanh(z) = 2 / (1 + e^-2z)

    @triton.jit
    def tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
        """This program's tile: programs go down a group of GROUP_M tiles, then across."""
        pid = tl.program_id(0)
        tiles_n = tl.cdiv(N, BLOCK_N)
        group = pid // (GROUP_M * tiles_n)
        first_m = group * GROUP_M
        height = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * tiles_n)) % height
        pid_n = (pid % (GROUP_M * tiles_n)) // height
        return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)

    @triton.jit
    def load_tile(ptr, rows, cols, R, C):
        """The [rows, cols] tile of a row-major R x C matrix, zero past its edges."""
        return tl.load(ptr + rows[:, None] * C + cols[None, :], mask=(rows[:, None] < R) & (cols[None, :] < C),
                       other=0.0)

    @triton.jit
    def store_tile(ptr, rows, cols, R, C, value):
        tl.store(ptr + rows[:, None] * C + cols[None, :], value.to(ptr.dtype.element_ty),
                 mask=(rows[:, None] < R) & (cols[None, :] < C))

    @triton.jit
    def bias_gelu_gemm(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        rows, cols = tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            acc += tl.dot(load_tile(x_ptr, rows, k + ks, M, K), load_tile(w_ptr, k + ks, cols, K, N))
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        store_tile(out_ptr, rows, cols, M, N, gelu_tanh(acc))

    @triton.jit
    def geglu_gemm(x_ptr, wg_ptr, wu_ptr, out_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        rows, cols = tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
        ks = tl.arange(0, BLOCK_K)
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = load_tile(x_ptr, rows, k + ks, M, K)
            gate += tl.dot(a, load_tile(wg_ptr, k + ks, cols, K, N))
            up += tl.dot(a, load_tile(wu_ptr, k + ks, cols, K, N))
        store_tile(out_ptr, rows, cols, M, N, gelu_tanh(gate) * up)

    @triton.jit
    def gelu_kernel(y_ptr, out_ptr, numel, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < numel
        y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, gelu_tanh(y).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def geglu_kernel(y_ptr, out_ptr, numel, N, BLOCK: tl.constexpr):
        # y: [M, 2N], the gate's columns then the up projection's; out: [M, N]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < numel
        row, col = offs // N, offs % N
        g = tl.load(y_ptr + row * 2 * N + col, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(y_ptr + row * 2 * N + N + col, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, (gelu_tanh(g) * u).to(out_ptr.dtype.element_ty), mask=mask)

    return bias_gelu_gemm, geglu_gemm, gelu_kernel, geglu_kernel


def _gelu_tanh(v: torch.Tensor) -> torch.Tensor:
    return 0.5 * v * (1.0 + torch.tanh(SQRT_2_OVER_PI * (v + 0.044715 * v ** 3)))


def reference(case: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The case in float64."""
    x = inputs["x"].double()
    if case == "bias_gelu":
        return _gelu_tanh(x @ inputs["w"].double() + inputs["b"].double())
    return _gelu_tanh(x @ inputs["w_gate"].double()) * (x @ inputs["w_up"].double())


def make_inputs(case: str, m: int, k: int, n: int, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    inputs = {"x": rand(m, k)}
    if case == "bias_gelu":
        inputs.update(w=rand(k, n, scale=k ** -0.5), b=rand(n, scale=0.1))
    else:
        inputs.update(w_gate=rand(k, n, scale=k ** -0.5), w_up=rand(k, n, scale=k ** -0.5))
        inputs["w_both"] = torch.cat([inputs["w_gate"], inputs["w_up"]], 1).contiguous()
    return inputs


def variants(case: str, device: torch.device) -> list[str]:
    names = ["cublas+kernel"] if device.type == "cuda" else ["torch+kernel"]
    if case == "bias_gelu" and device.type == "cuda":
        names.append("cublaslt")
    return names + [f"template {config}" for config in (CONFIGS if device.type == "cuda" else CHECK_CONFIGS)]


def run(case: str, variant: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The case's output by ``variant`` (a name of ``variants``)."""
    import triton

    bias_gelu_gemm, geglu_gemm, gelu_kernel, geglu_kernel = _kernels()
    x = inputs["x"]
    m, k = x.shape
    n = inputs["w"].shape[1] if case == "bias_gelu" else inputs["w_gate"].shape[1]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if variant == "cublaslt":
        return torch.ops.aten._addmm_activation(inputs["b"], x, inputs["w"], use_gelu=True)
    if variant.endswith("+kernel"):
        y = torch.addmm(inputs["b"], x, inputs["w"]) if case == "bias_gelu" else x @ inputs["w_both"]
        block = 1024
        grid = (triton.cdiv(m * n, block),)
        if case == "bias_gelu":
            gelu_kernel[grid](y, out, m * n, BLOCK=block)
        else:
            geglu_kernel[grid](y, out, m * n, n, BLOCK=block)
        return out
    block_m, block_n, block_k, warps, stages = ast.literal_eval(variant.split(" ", 1)[1])  # "template (...)"
    launch = {} if x.device.type == "cpu" else {"num_warps": warps, "num_stages": stages}
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    if case == "bias_gelu":
        bias_gelu_gemm[grid](x, inputs["w"], inputs["b"], out, m, n, k, BLOCK_M=block_m, BLOCK_N=block_n,
                             BLOCK_K=block_k, GROUP_M=GROUP_M, **launch)
    else:
        geglu_gemm[grid](x, inputs["w_gate"], inputs["w_up"], out, m, n, k, BLOCK_M=block_m, BLOCK_N=block_n,
                         BLOCK_K=block_k, GROUP_M=GROUP_M, **launch)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check every variant (CPU: Triton's interpreter)")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # the interpreter computes bf16 products wrongly: float32 there, at sizes with ragged tiles
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for case in args.cases.split(","):
        m, k, n = CASES[case] if device.type == "cuda" else (40, 48, 36)
        inputs = make_inputs(case, m, k, n, dtype, device)
        want = reference(case, inputs)
        flops = 2 * m * k * n * (2 if case == "geglu" else 1)
        best: dict[str, tuple[float, str]] = {}
        for variant in variants(case, device):
            try:
                got = run(case, variant, inputs).double()
            except Exception as exc:  # a tile too large for the card's shared memory
                if type(exc).__name__ != "OutOfResources":
                    raise
                print(f"{case:9s} {variant:28s} does not fit: {str(exc).splitlines()[0][:80]}", flush=True)
                continue
            error = float((got - want).abs().max() / want.abs().max())
            line = f"{case:9s} {variant:28s} error {error:.1e}"
            if device.type == "cuda" and not args.check:
                from triton.testing import do_bench

                us = do_bench(lambda: run(case, variant, inputs), warmup=25, rep=200) * 1e3
                line += f"  {us:8.1f} us  {flops / us / 1e6:6.1f} TFLOP/s"
                kind = "template" if variant.startswith("template") else variant
                if kind not in best or us < best[kind][0]:
                    best[kind] = (us, variant)
            print(line, flush=True)
        if best:
            base = best["cublas+kernel"][0]
            for kind, (us, variant) in best.items():
                print(f"{case:9s} best {kind:14s} {us:8.1f} us  {base / us:5.2f}x cuBLAS + kernel  ({variant})",
                      flush=True)


if __name__ == "__main__":
    main()
