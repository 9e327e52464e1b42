"""The zoo runner's results as a table, Markdown and JSON.

One line per model: its batch, each variant's median time (and speedup over eager), the error of
Inductor and of fuse against eager, whether fuse's error is at most twice Inductor's, fuse's graphs
that ran eagerly, and fuse's ATen fallbacks by op. The JSON holds every number unrounded and every
message; the Markdown adds the environment and the messages.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from typing import Any, TYPE_CHECKING

import torch

import fusebackend

if TYPE_CHECKING:
    from benchmarks.zoo.run import RunOptions, VariantStats, ZooRow


def environment(options: "RunOptions") -> dict[str, Any]:
    import triton

    try:
        import transformers

        transformers_version = transformers.__version__
    except Exception as exc:
        transformers_version = f"not importable ({type(exc).__name__})"
    device = options.device
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "mode": "training step" if options.train else "inference",
        "size": options.size,
        "dtype": str(options.dtype).replace("torch.", ""),
        "variants": list(options.variants),
        "timing": options.timing.method(device) if options.timed else "not measured (--no-timing)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers_version,
        "python": platform.python_version(),
        "fuse_interpreter": fusebackend.use_interpreter(),
    }


def _ms(v: "VariantStats | None") -> str:
    if v is None:
        return "-"
    if v.status == "error":
        return "ERROR"
    if v.median_ms is None:
        return "-"
    speed = f" ({v.speedup:.2f}x)" if v.speedup is not None and v.variant != "eager" else ""
    return f"{v.median_ms:.4g}{speed}"


def _err(v: "VariantStats | None") -> str:
    if v is None:
        return "-"
    if v.error is None:
        return "ERROR" if v.status == "error" else "-"
    return f"{v.error:.2e}"


def _fallbacks(v: "VariantStats | None", limit: int = 6) -> str:
    if v is None or not v.fallbacks:
        return "-"
    items = list(v.fallbacks.items())
    text = ", ".join(f"{op} x{n}" for op, n in items[:limit])
    return text + (f", +{len(items) - limit} more" if len(items) > limit else "")


HEADER = ["model", "batch", "eager ms", "inductor ms", "fuse ms", "inductor err", "fuse err", "fuse <= 2x ind",
          "eager graphs", "fuse kernels", "fuse ATen fallbacks"]


def cells(row: "ZooRow") -> list[str]:
    if row.status != "ok":
        return [row.model, row.shapes or "-", row.status, row.message[:120]] + [""] * (len(HEADER) - 4)
    f = row.fuse
    within = row.fuse_within_2x_inductor
    return [
        row.model, row.shapes, _ms(row.eager), _ms(row.inductor), _ms(f), _err(row.inductor), _err(f),
        "-" if within is None else ("yes" if within else "NO"),
        "-" if f is None or f.eager_graphs is None else str(f.eager_graphs),
        "-" if f is None or f.kernels is None else str(f.kernels),
        _fallbacks(f),
    ]


def table(rows: list["ZooRow"]) -> str:
    body = [HEADER] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in body) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    errors = [f"{r.model}: {r.message}" for r in rows if r.status == "ok" and r.message]
    errors += [f"{r.model} {v.variant}: {v.message}" for r in rows for v in r.variants if v.message]
    if errors:
        lines += ["", "messages:"] + [f"  {e[:400]}" for e in errors]
    return "\n".join(lines)


def progress(row: "ZooRow") -> str:
    if row.status != "ok":
        return f"{row.model} ({row.seconds:.1f} s): {row.status} {row.message}"
    parts = []
    for v in row.variants:
        part = f"{v.variant} {_ms(v)} ms"
        if v.variant != "eager":
            part += f" err {_err(v)}"
        if v.variant == "fuse" and v.eager_graphs:
            part += f" ({v.eager_graphs} graph(s) ran eagerly)"
        parts.append(part)
    warning = f" [{row.message}]" if row.message else ""
    return f"{row.model} {row.shapes} ({row.seconds:.1f} s): " + ", ".join(parts) + warning


def markdown(rows: list["ZooRow"], env: dict[str, Any]) -> str:
    lines = [f"# Zoo: {env['mode']}, {env['size']} size, {env['dtype']}", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "Times in ms (speedup over eager); errors are max |out - eager| / max |eager| over the outputs "
              "(training: the loss, and gradients over the largest eager gradient).", ""]
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("|" + "---|" * len(HEADER))
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |")
    notes = [(r.model, v.variant, v.message) for r in rows for v in r.variants if v.message]
    notes += [(r.model, r.status, r.message) for r in rows if r.message]
    if notes:
        lines += ["", "## Messages", ""] + [f"- {m} ({what}): {text}" for m, what, text in notes]
    return "\n".join(lines) + "\n"


def to_json(rows: list["ZooRow"], env: dict[str, Any]) -> dict[str, Any]:
    out = []
    for r in rows:
        item = dataclasses.asdict(r)
        item["fuse_within_2x_inductor"] = r.fuse_within_2x_inductor
        out.append(item)
    return {"environment": env, "rows": out}


def write(rows: list["ZooRow"], env: dict[str, Any], folder: str, stem: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    json_path = os.path.join(folder, stem + ".json")
    md_path = os.path.join(folder, stem + ".md")
    with open(json_path, "w") as f:
        json.dump(to_json(rows, env), f, indent=1, default=str)
    with open(md_path, "w") as f:
        f.write(markdown(rows, env))
    return [json_path, md_path]
