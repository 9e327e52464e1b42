"""GPU: fuse's generated matrix products (``FUSE_PRODUCT_TEMPLATES=always``) against its library calls.

Each case is a small function, a product and what reads it, compiled whole. Per variant, in a
process of its own (the variant's settings are read at import):

- ``library``: ``FUSE_PRODUCT_TEMPLATES=never``, cuBLAS and a kernel for the epilogue (fuse's
  default on a GPU);
- ``template``: ``always``, one generated ``tl.dot`` kernel with the epilogue on its tile;
- ``template-tuned``: ``always`` under ``mode="max-autotune-no-cudagraphs"`` (each kernel's
  candidate blocks and warps timed on its first call);
- ``inductor``: Inductor's default mode, for reference.

Every output is checked against a float64 evaluation of the same function on the same inputs,
within twice eager's own distance from it (plus a dtype floor); the table gives GPU ms (Triton's
``do_bench``, median), the variant's kernels, and whether a ``fused_mm`` kernel was generated.

    PYTHONPATH=. python -m benchmarks.studies.product_templates_study --out DIR   # all variants
    PYTHONPATH=. python -m benchmarks.studies.product_templates_study --from DIR  # the table
    PYTHONPATH=. python -m benchmarks.studies.product_templates_study --check --variants library,template \\
        --dtypes fp32                                    # a CPU: small sizes, checked, untimed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

VARIANTS = {  # name: (environment, backend, mode)
    "library": ({"FUSE_PRODUCT_TEMPLATES": "never"}, "fuse", "default"),
    "template": ({"FUSE_PRODUCT_TEMPLATES": "always"}, "fuse", "default"),
    "template-tuned": ({"FUSE_PRODUCT_TEMPLATES": "always"}, "fuse", "max-autotune-no-cudagraphs"),
    "inductor": ({}, "inductor", "default"),
}


def _bias_gelu(x, w, b):  # GPT-2's MLP up projection
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def _swiglu(x, wg, wu):  # Llama's MLP gate and up projections
    return F.silu(x @ wg) * (x @ wu)


def _residual(x, w, r):  # a down projection and the residual
    return r + x @ w


def _scores(q, k, mask):  # attention scores, scaled and masked, by hand
    return torch.bmm(q, k.transpose(1, 2)) * 0.125 + mask


def _odd_relu(x, w, b):  # sizes of no power of two
    return torch.relu(torch.addmm(b, x, w))


CASES = {  # name: (function, [(shape, scale) of each input]) at real sizes
    "gpt2_bias_gelu 8192x768x3072": (_bias_gelu, [((8192, 768), 1), ((3072, 768), 0.03), ((3072,), 1)]),
    "llama_swiglu 4096x2048x5632": (_swiglu, [((4096, 2048), 1), ((2048, 5632), 0.02), ((2048, 5632), 0.02)]),
    "residual 8192x3072x768": (_residual, [((8192, 3072), 1), ((3072, 768), 0.02), ((8192, 768), 1)]),
    "scores 96x(512x64x512)": (_scores, [((96, 512, 64), 1), ((96, 512, 64), 1), ((1, 512, 512), 1)]),
    "odd_relu 1000x80x336": (_odd_relu, [((1000, 80), 1), ((80, 336), 0.1), ((336,), 1)]),
    "small_bias_gelu 64x256x256": (_bias_gelu, [((64, 256), 1), ((256, 256), 0.06), ((256,), 1)]),
}


def _inputs(shapes: list[tuple[tuple[int, ...], float]], dtype: torch.dtype, dev: str, shrink: int) -> list[torch.Tensor]:
    """The case's inputs; ``shrink`` divides each dim of at least 64 (``--check``: small sizes
    for Triton's interpreter, K still a multiple of 16)."""
    def size(d: int) -> int:
        return max(16, d // shrink // 16 * 16) if d >= 64 else d
    return [(torch.randn(*map(size, shape), device=dev) * scale).to(dtype) for shape, scale in shapes]


def run_variant(variant: str, dtypes: list[str], check: bool = False) -> list[dict[str, Any]]:
    """One variant's rows; ``check``: on a CPU (Triton's interpreter) at small sizes, untimed."""
    import triton.testing

    import fusebackend

    dev, shrink = ("cpu", 16) if check else ("cuda", 1)

    _, backend, mode = VARIANTS[variant]
    rows = []
    for dname in dtypes:
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dname]
        for case, (fn, shapes) in CASES.items():
            torch.manual_seed(0)
            args = _inputs(shapes, dtype, dev, shrink)
            torch._dynamo.reset()
            before = len(fusebackend.history())
            compiled = torch.compile(fn, backend=backend if backend == "inductor" else fusebackend.fuse,
                                     mode=None if mode == "default" else mode)
            row: dict[str, Any] = {"variant": variant, "case": case, "dtype": dname}
            try:
                out = compiled(*args)
                ref = fn(*(a.double() for a in args))
                eager = fn(*args)
                eager_err = (eager.double() - ref).abs().max().item()
                err = (out.double() - ref).abs().max().item()
                floor = 1e-4 if dtype == torch.float32 else 1e-2
                row |= {"err": err, "eager_err": eager_err, "ok": err <= 2 * eager_err + floor * ref.abs().max().item()}
                if not check:
                    row["ms"] = triton.testing.do_bench(lambda: compiled(*args), warmup=50, rep=200)
                if backend == "fuse":
                    arts = fusebackend.history()[before:]
                    row["kernels"] = sum(a.kernel_count for a in arts)
                    row["fused_mm"] = sum(1 for a in arts for name in a.kernels if name.startswith("fused_mm"))
            except Exception as exc:  # noqa: BLE001 - a study reports a failure and goes on
                row |= {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    order = list(VARIANTS)
    by = {(r["case"], r["dtype"], r["variant"]): r for r in rows}
    keys = sorted({(r["case"], r["dtype"]) for r in rows}, key=lambda k: (k[1], k[0]))
    lines = ["| case | dtype | " + " | ".join(f"{v} ms" for v in order) + " | template / library | kernels (library, template) |",
             "|---|---|" + "---|" * (len(order) + 2)]
    for case, dname in keys:
        cells = []
        for v in order:
            r = by.get((case, dname, v))
            if r is None:
                cells.append("")
            elif not r.get("ok"):
                cells.append("**wrong**" if "error" not in r else f"error: {r['error'][:60]}")
            else:
                cells.append(f"{r['ms']:.4f}" if "ms" in r else "ok")
        lib, tpl = by.get((case, dname, "library")), by.get((case, dname, "template"))
        ratio = f"{tpl['ms'] / lib['ms']:.2f}" if lib and tpl and lib.get("ms") and tpl.get("ms") else ""
        kern = f"{lib.get('kernels', '?') if lib else '?'}, {tpl.get('kernels', '?') if tpl else '?'} ({tpl.get('fused_mm', 0) if tpl else 0} fused_mm)"
        lines.append(f"| {case} | {dname} | " + " | ".join(cells) + f" | {ratio} | {kern} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--check", action="store_true", help="CPU: small sizes in Triton's interpreter, untimed")
    p.add_argument("--variant", help=argparse.SUPPRESS)  # a child: one variant
    p.add_argument("--from", dest="from_dir", help="print the table of a saved run")
    a = p.parse_args()
    if a.variant:
        rows = run_variant(a.variant, a.dtypes.split(","), a.check)
        with open(os.path.join(a.out, f"product_{a.variant}.json"), "w") as f:
            json.dump(rows, f)
        return
    if a.from_dir is None:
        os.makedirs(a.out, exist_ok=True)
        for v in a.variants.split(","):
            env = {**os.environ, **VARIANTS[v][0], "FUSE_GRAPH_CACHE": "0"}
            if a.check:
                env["TRITON_INTERPRET"] = "1"
            subprocess.run([sys.executable, "-m", "benchmarks.studies.product_templates_study", "--variant", v,
                            "--dtypes", a.dtypes, "--out", a.out] + ["--check"] * a.check, env=env, check=False)
    folder = a.from_dir or a.out
    rows = []
    for v in VARIANTS:
        path = os.path.join(folder, f"product_{v}.json")
        if os.path.exists(path):
            with open(path) as f:
                rows += json.load(f)
    print(f"torch {torch.__version__}, " + (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"))
    print(table(rows))


if __name__ == "__main__":
    main()
