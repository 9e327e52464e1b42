"""Launch-config sweep on a GPU: time fuse's kernels for each case under several block configs.

For tuning the heuristics in ``fusebackend/kernels/runtime.py``. Each variant replaces the
config function, recompiles the case from scratch, checks the output against eager, and times
one call with ``triton.testing.do_bench`` (median, L2 flushed). The floor is the case's bytes
over the copy bandwidth measured in the same run.

    PYTHONPATH=. python -m benchmarks.studies.sweep [--cases name,name]
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import torch
import triton

import fusebackend
from benchmarks import memory_bound
from fusebackend.kernels import runtime
from fusebackend.lowering import builder

POINTWISE = [{"XBLOCK": b, "num_warps": w} for b in (1024, 2048, 4096) for w in (4, 8)]
# rows of 8192: persistent (RBLOCK 8192) or looped with the row re-read from L2 (RBLOCK < 8192)
ROWS_LONG = ([{"XBLOCK": 1, "RBLOCK": 8192, "num_warps": w} for w in (8, 16, 32)]
             + [{"XBLOCK": 2, "RBLOCK": 8192, "num_warps": 16}]
             + [{"XBLOCK": 1, "RBLOCK": r, "num_warps": w} for r in (2048, 4096) for w in (4, 8, 16)])
ROWS_SHORT = [{"XBLOCK": x, "RBLOCK": 1024, "num_warps": w} for x in (1, 2, 4, 8) for w in (2, 4, 8)]
# column sums: how many chunks each column is split into (phase 1), and the phase-1 block
COLUMNS = ([{"split": s, "XBLOCK": x, "RBLOCK": r, "num_warps": w} for s in (8, 16)
            for x, r, w in ((64, 8, 4), (64, 16, 4), (64, 32, 4), (64, 64, 4), (64, 32, 8), (64, 64, 8),
                            (128, 32, 8))]
           # one kernel (no split): fewer columns per program, more rows per step
           + [{"split": 1, "XBLOCK": x, "RBLOCK": r, "num_warps": w}
              for x, r, w in ((16, 256, 8), (32, 128, 8), (32, 256, 8))])

# transposes: tiles of XBLOCK (output's fastest dim) by YBLOCK (input's fastest dim)
TILES = [{"XBLOCK": x, "YBLOCK": y, "num_warps": w} for x, y in ((64, 64), (32, 32), (64, 32), (32, 64), (128, 32))
         for w in (2, 4, 8)]

SWEEPS: dict[str, tuple[str, list[dict[str, int]]]] = {
    "gelu_affine": ("pointwise", POINTWISE),
    "silu_mul_add": ("pointwise", POINTWISE),
    "batch_norm_relu": ("pointwise", POINTWISE),
    "rms_norm_fp32": ("reduction", ROWS_LONG),
    "softmax_fp32": ("reduction", ROWS_LONG),
    "add_layer_norm": ("reduction", ROWS_LONG),
    "scaled_masked_softmax": ("reduction", ROWS_SHORT),
    "sum_dim0": ("reduction", COLUMNS),
    "sum_dim1": ("reduction", ROWS_LONG),
    "transpose_copy": ("tile", TILES),
}


def copy_bandwidth() -> float:
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3)


def time_variant(fn: Callable[..., Any], inputs: list[Any], expected: Any, kind: str, cfg: dict[str, int] | None) -> tuple[float, int, str]:
    original_pw, original_red, original_tile = runtime.pointwise_config, runtime.reduction_config, runtime.tile_config
    original_split = builder.split_count
    if cfg is not None and "split" in cfg:
        cfg = dict(cfg)
        split = cfg.pop("split")
        builder.split_count = lambda xnumel, rnumel, column: split if xnumel * rnumel >= 1 << 20 else 1
    if cfg is not None and kind == "tile":
        runtime.tile_config = lambda ysize, inner: dict(cfg)  # type: ignore[assignment]
    elif cfg is not None and kind == "pointwise":
        runtime.pointwise_config = lambda numel, itemsize=2: dict(cfg)  # type: ignore[assignment]
    elif cfg is not None:
        def fixed(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1, **kw: Any) -> dict[str, int]:
            # only the case's main reduction takes the swept config; small phase-2 kernels keep theirs
            if xnumel * rnumel >= 1 << 20:
                return dict(cfg)
            return original_red(xnumel, rnumel, row_contiguous, passes, **kw)
        runtime.reduction_config = fixed  # type: ignore[assignment]
    try:
        torch._dynamo.reset()
        fusebackend.dump.clear()
        compiled = torch.compile(fn, backend=fusebackend.fuse)
        eager_before = fusebackend.metrics.eager_graphs
        with fusebackend.config.patch(graph_cache=False):  # compiled anew: not another config's graph from disk
            out = compiled(*inputs)
        if fusebackend.metrics.eager_graphs != eager_before:  # a compile failure: not this config's time
            return float("nan"), 0, "fell back to eager (see the warning)"
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
        ms = triton.testing.do_bench(lambda: compiled(*inputs), return_mode="median")
        return ms, sum(a.kernel_count for a in fusebackend.history()), "ok"
    except Exception as exc:  # a config that does not compile or is wrong is reported, not fatal
        return float("nan"), 0, f"{type(exc).__name__}: {str(exc)[:60]}"
    finally:
        runtime.pointwise_config, runtime.reduction_config = original_pw, original_red
        runtime.tile_config = original_tile
        builder.split_count = original_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", default=",".join(SWEEPS))
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s on {torch.cuda.get_device_name()}")
    cases = {c.name: c for c in memory_bound.cases(torch.device("cuda"), small=False)}
    rows = []
    for name in args.cases.split(","):
        case = cases[name]
        kind, configs = SWEEPS[name]
        work = case.setup()
        fn = work.build(lambda f: f)
        inputs = list(work.make_inputs())
        expected = fn(*inputs)
        assert case.floor_bytes is not None
        floor_ms = case.floor_bytes(tuple(inputs), expected) / bandwidth * 1e3
        for cfg in [None] + configs:
            ms, kernels, status = time_variant(fn, inputs, expected, kind, cfg)
            label = "heuristic" if cfg is None else " ".join(f"{k}={v}" for k, v in cfg.items())
            rows.append((name, label, ms, floor_ms / ms if ms == ms else float("nan"), kernels, status))
            print(f"{name:22s} {label:34s} {ms:8.4f} ms  {100 * floor_ms / ms:5.1f}% of floor  {kernels} kernels  {status}", flush=True)
        del inputs, expected
        torch.cuda.empty_cache()
    print("\nbest per case:")
    for name in args.cases.split(","):
        best = min((r for r in rows if r[0] == name and r[2] == r[2]), key=lambda r: r[2], default=None)
        heur = next(r for r in rows if r[0] == name and r[1] == "heuristic")
        if best:
            print(f"  {name:22s} best {best[1]:34s} {100 * best[3]:5.1f}%   heuristic {100 * heur[3]:5.1f}%")


if __name__ == "__main__":
    main()
