"""Reductions over rows too long for one block, on a GPU: how a looped kernel reads them.

A GPU reduction over rows longer than ``runtime.LONGEST_PERSISTENT_ROW`` loops over each row in
blocks of RBLOCK. Two choices are timed here, against each other and against Inductor:

- the row's last block: every block masked, or whole blocks unmasked and one masked block for
  the rest of the row (``runtime.TAIL_BLOCKS``: from how many whole blocks a row takes the
  tail). A row of 12544 (a GroupNorm of 16 channels of 28x28) takes three whole blocks of 4096
  and 256 elements more;
- the block: RBLOCK and warps for the main reduction (the others keep the heuristic's), a row
  of 12544 in one block of 16384 among them. A kernel that reads each row again takes
  ``runtime._rows_in_l2``'s blocks by default.

Cases, bf16, 2048 rows each: GroupNorm(32) and SiLU over contiguous (NCHW) activations (one
kernel: the statistics, then the normalized output in a later pass over the row), as in Stable
Diffusion's VAE and BiT's stages; a log-softmax over a GPT-2 vocabulary of 50257. Each variant
is compiled anew, checked against eager, and timed two ways: ``do_bench``'s median of the whole
call, and the generated kernels' GPU time from the profiler.

A variance by Welford's update in one pass (reading each row once, where the mean and then the
squared deviations read it twice) was also tried (H100, 2026-11-27, a lowering variant not
kept): slower in every case at its best blocks, e.g. rows of 12544 70.6 us against 69.0, of
50176 261.5 against 267.6 only at 1024 by 4 warps and 298.8 at the heuristic's blocks.

    PYTHONPATH=. python -m benchmarks.studies.long_rows [--cases a,b] [--out DIR]    # on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from typing import Any, Callable, Iterator

import torch

import fusebackend
from benchmarks.zoo import audit
from benchmarks.zoo.measure import profile_step
from fusebackend.kernels import runtime

# blocks for the main reduction: looped, and one block of 16384 (a row of 12544 in one block)
BLOCKS = [{"XBLOCK": 1, "RBLOCK": r, "num_warps": w} for r, w in ((1024, 4), (2048, 8), (4096, 8))]
WHOLE = [{"XBLOCK": 1, "RBLOCK": 16384, "num_warps": w} for w in (16, 32)]
LOOPED = {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}  # the blocks of every looped row before


def cases(device: torch.device) -> list[tuple[str, torch.nn.Module, tuple[torch.Tensor, ...], int]]:
    """(name, model, inputs, bytes a call must move at least)."""
    out = []
    for groups, shape in ((32, (64, 512, 28, 28)), (32, (64, 256, 56, 56)), (32, (2, 512, 64, 64)),
                          (32, (64, 128, 112, 112))):
        torch.manual_seed(0)
        x = torch.randn(shape, device=device, dtype=torch.bfloat16)
        norm = torch.nn.GroupNorm(groups, shape[1]).to(device, torch.bfloat16)
        with torch.no_grad():
            norm.weight.normal_()
            norm.bias.normal_()
        name = f"gn{groups}_b{shape[0]}_{shape[1]}x{shape[2]}x{shape[3]}"
        out.append((name, torch.nn.Sequential(norm, torch.nn.SiLU()).eval(), (x,), 2 * x.numel() * 2))
    logits = torch.randn(2048, 50257, device=device, dtype=torch.bfloat16)
    out.append(("log_softmax_2048x50257", torch.nn.LogSoftmax(-1), (logits,), 2 * logits.numel() * 2))
    return out


@contextlib.contextmanager
def variant(tail_blocks: int, blocks: dict[str, int] | None) -> Iterator[None]:
    saved = runtime.TAIL_BLOCKS, runtime.reduction_config
    original = runtime.reduction_config

    def fixed(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1, **kw: Any) -> dict[str, int]:
        if blocks is not None and row_contiguous and rnumel > runtime.LONGEST_PERSISTENT_ROW:
            return dict(blocks)
        return original(xnumel, rnumel, row_contiguous, passes, **kw)

    runtime.TAIL_BLOCKS, runtime.reduction_config = tail_blocks, fixed
    try:
        yield
    finally:
        runtime.TAIL_BLOCKS, runtime.reduction_config = saved


def measure(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], want: torch.Tensor) -> dict[str, Any]:
    from triton.testing import do_bench

    got = fn(*inputs)
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    ms = do_bench(lambda: fn(*inputs), warmup=25, rep=200, return_mode="median")
    profile = profile_step(lambda: fn(*inputs), inputs[0].device)
    return {"err": err, "ms": round(ms, 4), "kernels_ms": round(profile.generated_us() / 1e3, 4) if profile else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    bandwidth = audit.copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    never = 1 << 30
    variants: list[tuple[str, int, dict[str, int] | None]] = [
        ("heuristic", runtime.TAIL_BLOCKS, None), ("masked, 4096 by 16", never, LOOPED),
        ("tail, 4096 by 16", 1, LOOPED)]
    variants += [(f"tail, R{b['RBLOCK']} w{b['num_warps']}", 1, b) for b in BLOCKS + WHOLE]
    rows = []
    for name, model, inputs, floor_bytes in cases(device):
        if args.cases and name not in args.cases.split(","):
            continue
        floor_ms = floor_bytes / bandwidth * 1e3
        with torch.no_grad():
            want = model(*inputs)
            torch._dynamo.reset()
            results = {"inductor": measure(torch.compile(model), inputs, want)}
            for label, tail_blocks, blocks in variants:
                with variant(tail_blocks, blocks), fusebackend.config.patch(graph_cache=False):
                    torch._dynamo.reset()
                    try:
                        results[label] = measure(torch.compile(model, backend=fusebackend.fuse), inputs, want)
                    except Exception as exc:  # a variant that fails is reported, not fatal
                        results[label] = {"error": f"{type(exc).__name__}: {str(exc)[:80]}"}
        for label, r in results.items():
            if "error" in r:
                print(f"{name:26s} {label:34s} {r['error']}", flush=True)
                continue
            share = floor_ms / r["kernels_ms"] if r["kernels_ms"] else float("nan")
            print(f"{name:26s} {label:34s} {r['ms']:8.4f} ms  kernels {r['kernels_ms']} ms "
                  f"({100 * share:4.1f}% of floor)  err {r['err']:.1e}", flush=True)
        rows.append({"case": name, "floor_ms": round(floor_ms, 4), **results})
        del model, inputs, want
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "long_rows.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "bandwidth_gbs": round(bandwidth / 1e9, 1), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
