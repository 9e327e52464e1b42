"""How close can a column sum come to the copy floor, and what does the timing method charge it?

The study behind the column-sum notes in ``benchmarks/RESULTS.md`` and ``benchmarks/README.md``
(2026-11-23). ``sum(x, 0)`` of a bf16 8192x8192 tensor must read 128 MiB; hand-written Triton
kernels for it, fuse's and Inductor's compiled functions, and a kernel that only reads the same
bytes in contiguous chunks (the best any reduction of them can do), are each timed four ways:

- ``zeroed``: ``triton.testing.do_bench`` (its L2 flush writes 256 MiB of zeros, so the timed call
  starts with dirty lines in the cache and pays to write them back);
- ``zeroed-events``: the same flush, then CUDA events around one call (checks the first);
- ``clean``: the same flush, then a read of another 256 MiB, so the cache holds clean lines
  (the benchmarks' ``--l2 clean``);
- ``none``: calls back to back, no flush (the input is larger than the L2).

Each variant's output is compared with an fp32 sum of fresh random inputs before it is timed.
Measured on an H200 (torch 2.11, Triton 3.6, 2026-11-23; four runs of this script's kernels in
a scratch version of it), in % of the copy floor, zeroed / clean: the read-only kernel 79-82 /
94-96; the split column kernel fuse generates (8 chunks; 64 columns by 16 rows a step, 4 warps)
72-74 / 80-83 for both phases and 77-78 / 89 for its first phase alone; the same with PDL for
the second phase 76 / 85; one kernel whose last program per column block adds the chunks'
partial sums (deterministic) 74-77 / 83-87; Inductor 70-71 / 79-80. Wider column blocks (128 to
1024 columns), more chunks (16 to 64), a padded row stride and staggered row orders were
slower or at best level. This file itself has so far run only with ``--check``, on a CPU.

``--sweep`` times phase 1 alone under 72 tile shapes (a scratch version of it ran once, same
machine, 2026-11-23): 64 columns by 32 rows in 8 chunks reached 77.4 / 88.4,
2048 columns by 1 row in 128 chunks 77.1 / 91.7 (contiguous 4 KiB rows, like the read-only
kernel's 79.4 / 92.2); with a second phase over their partial sums, every shape tried landed at
80.9-81.6 clean, and one kernel adding its 8 chunks' sums at the end (64 x 32) at 85.7.

    PYTHONPATH=. python -m benchmarks.studies.column_sum_study            # on a GPU
    PYTHONPATH=. python -m benchmarks.studies.column_sum_study --check    # outputs only, any device
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Callable

import torch

if not torch.cuda.is_available():  # the hand-written kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import fusebackend  # noqa: E402
from benchmarks import timing  # noqa: E402


@triton.jit
def chunk_sums(x, c, s, N, M: tl.constexpr, R: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr,
               EVEN: tl.constexpr = True):
    """The sums of rows [s*R, (s+1)*R) of columns [c*XB, (c+1)*XB), RB rows a step; unless EVEN
    (the chunks tile the N rows), rows past N read as zeros."""
    cols = c * XB + tl.arange(0, XB)[None, :]
    acc = tl.zeros([RB, XB], tl.float32)
    for r0 in range(0, R, RB):
        rows = s * R + r0 + tl.arange(0, RB)[:, None]
        if EVEN:
            acc += tl.load(x + rows * M + cols, eviction_policy="evict_first").to(tl.float32)
        else:
            acc += tl.load(x + rows * M + cols, mask=rows < N, other=0.0, eviction_policy="evict_first").to(tl.float32)
    return tl.sum(acc, 0)


@triton.jit
def column_partial(x, part, N, M: tl.constexpr, R: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr,
                   EVEN: tl.constexpr = True):
    """Phase 1: program (c, s) sums rows [s*R, (s+1)*R) of columns [c*XB, (c+1)*XB) into part[s]."""
    c = tl.program_id(0)
    s = tl.program_id(1)
    tl.store(part + s * M + c * XB + tl.arange(0, XB), chunk_sums(x, c, s, N, M, R, XB, RB, EVEN))


@triton.jit
def column_finish(part, out, M: tl.constexpr, S: tl.constexpr, XB: tl.constexpr, WAIT: tl.constexpr):
    """Phase 2: out[cols] = sum of the S partial rows; WAIT when launched with PDL."""
    if WAIT:
        tl.extra.cuda.gdc_wait()
    c = tl.program_id(0)
    cols = c * XB + tl.arange(0, XB)
    partial = tl.load(part + tl.arange(0, S)[:, None] * M + cols[None, :])
    tl.store(out + cols, tl.sum(partial, 0).to(tl.bfloat16))


@triton.jit
def column_sum_one_kernel(x, part, count, out, M: tl.constexpr, R: tl.constexpr, S: tl.constexpr,
                          XB: tl.constexpr, RB: tl.constexpr):
    """Both phases in one launch: the last program to finish a column block adds the S partial
    rows in order (so the result does not depend on which program was last) and resets the
    block's counter for the next call."""
    c = tl.program_id(0)
    s = tl.program_id(1)
    cols1 = c * XB + tl.arange(0, XB)
    tl.store(part + s * M + cols1, chunk_sums(x, c, s, R * S, M, R, XB, RB))
    tl.debug_barrier()
    arrived = tl.atomic_add(count + c, 1, sem="acq_rel", scope="gpu")
    if arrived == S - 1:
        partial = tl.load(part + tl.arange(0, S)[:, None] * M + cols1[None, :], cache_modifier=".cg")
        tl.store(out + cols1, tl.sum(partial, 0).to(tl.bfloat16))
        tl.atomic_xchg(count + c, 0, sem="relaxed", scope="gpu")


@triton.jit
def read_only_sum(x, out, CH: tl.constexpr, B: tl.constexpr):
    """Program p sums the contiguous chunk [p*CH, (p+1)*CH): every byte read once, in order."""
    p = tl.program_id(0)
    acc = tl.zeros([B], tl.float32)
    for o in range(0, CH, B):
        acc += tl.load(x + p * CH + o + tl.arange(0, B), eviction_policy="evict_first").to(tl.float32)
    tl.store(out + p, tl.sum(acc, 0))


Variant = Callable[[torch.Tensor], Any]  # returns the column sums, or None for a partial pass


def two_kernels(n: int, m: int, xb: int, rb: int, split: int, warps: int, pdl: bool = False,
                finish: bool = True) -> Variant:
    part = torch.empty(split, m, dtype=torch.float32)
    extra = {"launch_pdl": True} if pdl else {}

    def run(x: torch.Tensor) -> torch.Tensor | None:
        column_partial[(m // xb, split)](x, part, n, m, n // split, xb, rb, num_warps=warps)
        if not finish:
            return None
        out = torch.empty(m, dtype=torch.bfloat16)
        column_finish[(m // 64,)](part, out, m, split, 64, pdl, num_warps=4, **extra)
        return out

    return run


def one_kernel(n: int, m: int, xb: int, rb: int, split: int, warps: int) -> Variant:
    part = torch.empty(split, m, dtype=torch.float32)
    count = torch.zeros(m // xb, dtype=torch.int32)

    def run(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(m, dtype=torch.bfloat16)
        column_sum_one_kernel[(m // xb, split)](x, part, count, out, m, n // split, split, xb, rb, num_warps=warps)
        return out

    return run


def read_only(n: int, m: int, chunk: int, block: int, warps: int) -> Variant:
    out = torch.empty(n * m // chunk, dtype=torch.float32)

    def run(x: torch.Tensor) -> None:
        read_only_sum[(n * m // chunk,)](x, out, chunk, block, num_warps=warps)

    return run


def variants(n: int, m: int, gpu: bool) -> dict[str, Variant]:
    chunk = min(32768, n * m // 4)
    found: dict[str, Variant] = {
        "fuse (compiled)": torch.compile(lambda t: t.sum(0), backend=fusebackend.fuse),
        "split 8, 64 cols x 16 rows, 4 warps": two_kernels(n, m, 64, 16, 8, 4),
        "split 16, 64 cols x 32 rows, 2 warps": two_kernels(n, m, 64, 32, 16, 2),
        "one kernel, split 8, 64 x 16, 4 warps": one_kernel(n, m, 64, 16, 8, 4),
        "one kernel, split 16, 64 x 32, 2 warps": one_kernel(n, m, 64, 32, 16, 2),
        "phase 1 alone, split 8, 64 x 16": two_kernels(n, m, 64, 16, 8, 4, finish=False),
        "read only, 64 KiB chunks, 8 warps": read_only(n, m, chunk, min(2048, chunk), 8),
    }
    if gpu:
        found["inductor (compiled)"] = torch.compile(lambda t: t.sum(0))
        found["split 8, 64 x 16, PDL phase 2"] = two_kernels(n, m, 64, 16, 8, 4, pdl=True)
        found["split 16, 64 x 32, PDL phase 2"] = two_kernels(n, m, 64, 32, 16, 2, pdl=True)
    return found


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sweep_phase1(n: int, m: int, floors: dict[str, float]) -> None:
    """Phase 1 alone under tile shapes from 64 x 16 to 4096 x 1 and 2 to 256 chunks, zeroed and
    clean (% of the floor). Each variant's partial sums are checked against torch first."""
    shapes = [(64, 16, 4), (64, 32, 4), (64, 32, 8), (128, 8, 4), (128, 16, 4), (128, 32, 8), (256, 4, 4),
              (256, 8, 4), (256, 16, 8), (512, 2, 4), (512, 4, 4), (512, 8, 8), (1024, 1, 4), (1024, 2, 4),
              (1024, 4, 8), (2048, 1, 8), (2048, 2, 8), (4096, 1, 8)]
    x = torch.randn(n, m, dtype=torch.bfloat16)
    for xb, rb, warps in [s for s in shapes if s[0] <= m]:
        for programs in (264, 528, 1056, 2112):  # 2 to 16 programs per multiprocessor of an H200
            chunks = max(1, round(programs / (m // xb)))
            rows = cdiv(cdiv(n, chunks), rb) * rb  # a whole number of steps per chunk
            chunks = cdiv(n, rows)
            part = torch.empty(chunks, m, dtype=torch.float32)
            even = rows * chunks == n

            def run(t: torch.Tensor, xb: int = xb, rb: int = rb, warps: int = warps, rows: int = rows,
                    part: torch.Tensor = part, even: bool = even) -> None:
                column_partial[(m // xb, part.shape[0])](t, part, n, m, rows, xb, rb, even, num_warps=warps)

            run(x)
            if even:
                expected = x.float().reshape(chunks, rows, m).sum(1)
                torch.testing.assert_close(part, expected, rtol=1e-3, atol=1e-2)
            got = {mode: 100 * floors[mode] / time_ms(lambda: run(x), mode) for mode in ("zeroed", "clean")}
            print(f"phase 1, {xb:4d} cols x {rb:2d} rows, {warps} warps, {chunks:3d} chunks: "
                  f"zeroed {got['zeroed']:5.1f}%, clean {got['clean']:5.1f}%", flush=True)


MODES = ("zeroed", "zeroed-events", "clean", "none")


def time_ms(fn: Callable[[], Any], mode: str, reps: int = 300) -> float:
    """``zeroed`` and ``clean`` are the benchmarks' own methods (``benchmarks/timing.py``)."""
    device = torch.device("cuda")
    if mode in ("zeroed", "clean"):
        return timing.median_ms(fn, device, timing.TimingConfig(l2=mode))
    zeroed = torch.empty(256 << 20, dtype=torch.int8)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for _ in range(10):
        fn()
    for start, end in events:
        if mode == "zeroed-events":
            zeroed.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="check outputs only (small shape; no timing)")
    parser.add_argument("--sweep", action="store_true", help="then time phase 1 alone under 72 tile shapes")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not fusebackend.use_interpreter()
    device = "cuda" if gpu else "cpu"
    torch.set_default_device(device)
    n, m = (8192, 8192) if gpu and not args.check else (512, 256)
    found = variants(n, m, gpu)
    for name, run in found.items():
        for seed in range(3):  # fresh inputs each time: the kernels must sum any data
            x = torch.randn(n, m, dtype=torch.bfloat16, generator=torch.Generator(device).manual_seed(seed))
            out = run(x)
            if out is not None:
                expected = x.float().sum(0)
                err = ((out.float() - expected).norm() / expected.norm()).item()
                assert err < 1e-2, f"{name}: relative error {err:.2e}"
        print(f"checked {name}")
    if args.check or not gpu:
        return
    src = torch.empty(1 << 28, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    floors = {}
    for mode in MODES:
        bandwidth = 2 * src.numel() * 4 / (time_ms(lambda: dst.copy_(src), mode, 100) * 1e-3)
        floors[mode] = (n * m * 2 + m * 2) / bandwidth * 1e3
        print(f"copy bandwidth, {mode}: {bandwidth / 1e9:.0f} GB/s; floor {floors[mode] * 1e3:.1f} us")
    del src, dst
    x = torch.randn(n, m, dtype=torch.bfloat16)
    rows = []
    for name, run in found.items():
        times = {mode: time_ms(lambda: run(x), mode) for mode in MODES}
        rows.append((name, times))
        print(name, " ".join(f"{mode} {t * 1e3:.1f} us" for mode, t in times.items()), flush=True)
    print(f"\n{'variant':40s} " + " ".join(f"{mode:>14s}" for mode in MODES) + "   (% of the floor)")
    for name, times in rows:
        print(f"{name:40s} " + " ".join(f"{100 * floors[mode] / times[mode]:13.1f}%" for mode in MODES))
    if args.sweep:
        sweep_phase1(n, m, floors)


if __name__ == "__main__":
    main()
