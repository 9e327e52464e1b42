"""GPU: small pointwise kernels at batch 1, fuse's against Inductor's, and fuse's own kernel
launched with other blocks.

At batch 1 a batch norm + ReLU over a channels-last ResNet activation moves 100 KB to 1.6 MB: its
time is mostly the latency of one pass over too few programs, not bandwidth. For each shape this
times, inside CUDA graphs (``triton.testing.do_bench_cudagraph``, so that no launch cost on the
host is counted):

- ``inductor`` and ``fuse``: ``torch.compile`` of ``relu(batch_norm(x))`` in eval mode;
- fuse's generated kernel launched with other blocks and warps, and, where fuse keeps it flat, its
  tiled form (``runtime.SMALL_POINTWISE`` set to 0) likewise;
- a hand-written flat kernel (``x % C`` for the channel) with each block size, as a reference;

and likewise the conversion of a 3x3 convolution's weight to channels-last, which fuse and Inductor
both run on every call of a graph that takes the weight as an input (inference without freezing,
and training), and back (a channels-last gradient into the weight's own layout): fuse's kernel, the
flat kernel it generated before its transposing tiles merged the kernel's 3x3 positions into one
extent (``pointwise._merged_rows``), and its tiled kernel launched with other blocks and warps.

    PYTHONPATH=. python -m benchmarks.studies.tile_study [--weights-only]
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch
import triton
import triton.language as tl

import fusebackend
from benchmarks.zoo import audit

SHAPES = ((1, 256, 14, 14), (1, 64, 56, 56), (1, 512, 7, 7), (1, 64, 112, 112), (4, 256, 28, 28),
          (32, 256, 14, 14))
# ResNet's and Stable Diffusion's UNet's 3x3 convolutions (the UNet's largest: 2560 channels in)
WEIGHTS = ((512, 512, 3, 3), (256, 256, 3, 3), (64, 64, 3, 3), (1280, 2560, 3, 3), (1280, 1280, 3, 3),
           (320, 320, 3, 3))


@triton.jit
def _flat_bn_relu(x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, out_ptr, numel, C: tl.constexpr,
                  XBLOCK: tl.constexpr):
    offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offs < numel
    c = offs % C
    x = tl.load(x_ptr + offs, mask).to(tl.float32)
    mean = tl.load(mean_ptr + c, mask).to(tl.float32)
    var = tl.load(var_ptr + c, mask).to(tl.float32)
    w = tl.load(w_ptr + c, mask).to(tl.float32)
    b = tl.load(b_ptr + c, mask).to(tl.float32)
    y = (x - mean) * (1.0 / tl.sqrt(var + 1e-5)) * w + b
    tl.store(out_ptr + offs, tl.maximum(y, 0.0).to(tl.bfloat16), mask)


def _time(fn: Callable[[], Any]) -> float:
    """Microseconds per call, replayed in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=50)


def _fuse_kernel(fn: Callable[..., Any], args: tuple[Any, ...], small: int | None = None,
                 merge: bool = True) -> tuple[Any, str]:
    """fuse's compiled callable for ``fn`` and the source of its one generated kernel; ``small``
    replaces ``runtime.SMALL_POINTWISE`` while it compiles (0: tiles at every size); ``merge``
    False compiles it as before transposing tiles merged thin dims (``pointwise._merged_rows``)."""
    from fusebackend.codegen import pointwise
    from fusebackend.kernels import runtime

    torch._dynamo.reset()
    fusebackend.dump.clear()
    saved, merged_rows = runtime.SMALL_POINTWISE, pointwise._merged_rows
    runtime.SMALL_POINTWISE = saved if small is None else small
    if not merge:
        pointwise._merged_rows = lambda offset, dims, j, inner: dims[j]
    try:
        with fusebackend.config.patch(graph_cache=False):
            compiled = torch.compile(fn, backend=fusebackend.fuse)
            compiled(*args)
    finally:
        runtime.SMALL_POINTWISE, pointwise._merged_rows = saved, merged_rows
    (artifacts,) = fusebackend.history()
    (source,) = artifacts.kernels.values()
    return compiled, source


def _load(source: str) -> Any:
    """The @triton.jit function a kernel source defines (written to a file: Triton reads it)."""
    import importlib.util
    import tempfile

    path = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    path.write(source)
    path.close()
    spec = importlib.util.spec_from_file_location("fuse_kernel_study", path.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return next(v for k, v in vars(module).items() if k.startswith("fused_"))


def batch_norm_rows(shape: tuple[int, ...]) -> list[tuple[str, float]]:
    n, c, h, w = shape
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    mean, var = torch.randn(c, device="cuda", dtype=torch.bfloat16), torch.rand(c, device="cuda", dtype=torch.bfloat16) + 0.5
    weight, bias = torch.randn(c, device="cuda", dtype=torch.bfloat16), torch.randn(c, device="cuda", dtype=torch.bfloat16)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.nn.functional.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5))

    expected = f(x)
    rows = []
    torch._dynamo.reset()
    inductor = torch.compile(f)
    torch.testing.assert_close(inductor(x), expected, atol=0.05, rtol=0.02)
    rows.append(("inductor", _time(lambda: inductor(x))))
    fuse, source = _fuse_kernel(f, (x,))
    torch.testing.assert_close(fuse(x), expected, atol=0.05, rtol=0.02)
    rows.append(("fuse", _time(lambda: fuse(x))))
    out = torch.empty_like(x)
    numel = x.numel()
    sources = {"fuse's kernel": source}
    if "YBLOCK" not in source:
        sources["fuse's tiled kernel"] = _fuse_kernel(f, (x,), small=0)[1]
    for label, text in sources.items():
        kernel = _load(text)
        if "YBLOCK" in text:
            blocks = [(xb, yb) for xb in (c, min(c, 128), min(c, 64)) for yb in (1, 2, 4, 8, 16, 32, 64)
                      if (n * h * w) % yb == 0 and 128 <= xb * yb <= 8192]
        else:
            blocks = [(xb, None) for xb in (256, 512, 1024, 2048) if numel % xb == 0]  # may have no masks
        for xblock, yblock in blocks:
            for warps in (1, 2, 4, 8):
                if warps * 32 * 2 > xblock * (yblock or 1):
                    continue
                grid = (numel // (xblock * (yblock or 1)) if yblock else triton.cdiv(numel, xblock),)
                extra = {"YBLOCK": yblock} if yblock else {}
                launch = lambda: kernel[grid](x, mean, var, weight, bias, out, numel, XBLOCK=xblock,
                                              num_warps=warps, **extra)
                launch()
                torch.testing.assert_close(out, expected, atol=0.05, rtol=0.02)
                shape = f"{yblock}x{xblock}" if yblock else f"{xblock}"
                rows.append((f"{label} {shape}, {warps} warps, {grid[0]} programs", _time(launch)))
    for block in (256, 512, 1024, 2048):
        for warps in (1, 2, 4, 8):
            if warps * 32 * 2 > block:
                continue
            grid = (triton.cdiv(numel, block),)
            launch = lambda: _flat_bn_relu[grid](x, mean, var, weight, bias, out, numel, C=c, XBLOCK=block,
                                                 num_warps=warps)
            launch()
            torch.testing.assert_close(out, expected, atol=0.05, rtol=0.02)
            rows.append((f"flat {block}, {warps} warps, {grid[0]} programs", _time(launch)))
    return rows


def weight_rows(shape: tuple[int, ...], back: bool = False) -> list[tuple[str, float]]:
    """A weight to channels-last, or (``back``) a channels-last one to the contiguous layout."""
    w = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    layout = torch.contiguous_format if back else torch.channels_last
    if back:
        w = w.contiguous(memory_format=torch.channels_last)

    def f(w: torch.Tensor) -> torch.Tensor:
        return w.contiguous(memory_format=layout) * 1.0

    expected = f(w)
    rows = []
    torch._dynamo.reset()
    inductor = torch.compile(f)
    assert torch.equal(inductor(w), expected)
    rows.append(("inductor", _time(lambda: inductor(w))))
    fuse, source = _fuse_kernel(f, (w,))
    assert torch.equal(fuse(w), expected)
    rows.append(("fuse", _time(lambda: fuse(w))))
    flat, flat_source = _fuse_kernel(f, (w,), merge=False)
    if flat_source != source:
        assert torch.equal(flat(w), expected)
        rows.append(("fuse before (no merged rows)", _time(lambda: flat(w))))
    if "YBLOCK" in source:
        kernel, out = _load(source), torch.empty_like(expected)
        grid_of = re.search(r"(\d+) \(y\) by (\d+) \(x\) elements per (\d+) outer", source)
        ysize, inner, outer = (int(v) for v in grid_of.groups())
        from fusebackend.kernels.runtime import tile_config

        yblock = tile_config(ysize, inner)["YBLOCK"]
        for xblock in (32, 64, 128, 256):
            if inner % xblock:
                continue
            for warps in (2, 4, 8):
                grid = (outer * (inner // xblock) * -(-ysize // yblock),)
                launch = lambda: kernel[grid](w, out, w.numel(), XBLOCK=xblock, YBLOCK=yblock, num_warps=warps)
                launch()
                assert torch.equal(out, expected)
                rows.append((f"fuse's kernel {yblock}x{xblock}, {warps} warps", _time(launch)))
    return rows


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.tile_study")
    parser.add_argument("--weights-only", action="store_true", help="only the weights' conversions")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for shape in () if args.weights_only else SHAPES:
        rows = batch_norm_rows(shape)
        best = min(rows[2:], key=lambda r: r[1])
        print(f"\nbatch norm + relu, channels-last {shape}, {math.prod(shape)} elements")
        for name, us in rows[:2] + sorted(rows[2:], key=lambda r: r[1])[:12]:
            print(f"  {us:7.2f} us  {name}")
        print(f"  best: {best[0]}")
    bandwidth = audit.copy_bandwidth(torch.device("cuda"))
    for shape in WEIGHTS:
        for back in (False, True):
            floor = 2 * 2 * math.prod(shape) / bandwidth * 1e6
            print(f"\nweight {shape} " + ("from channels-last" if back else "to channels-last")
                  + f": floor {floor:.2f} us")
            for name, us in weight_rows(shape, back):
                print(f"  {us:7.2f} us  {floor / us:4.0%} of floor  {name}")


if __name__ == "__main__":
    main()
