"""The zoo runner's results as a terminal table, Markdown, JSON and a summary.

One line per model and mode (inference or training step): its batch, each variant's median time
(and speedup over eager), host time per step, cold compile seconds, peak memory and kernel
launches per step for eager, Inductor and fuse, the error of Inductor and of fuse against eager,
whether fuse's error is at most twice Inductor's, fuse's graphs that ran eagerly, its generated
kernels and its ATen calls by op. A column with nothing measured in any row (peak memory and
launches on a CPU, Inductor's with ``--variants eager,fuse``) is left out. The JSON holds every
number unrounded and every message; the Markdown adds the environment and the messages.

``load(paths)`` reads saved JSON files back (several merged into one set of rows), so that the
table, the summary and the chart (``chart.py``) can be made again without running anything.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
from typing import Any, Callable, Iterable, Sequence

import torch

import fusebackend
from benchmarks.zoo.measure import host_method
from benchmarks.zoo.rows import RunOptions, VariantStats, ZooRow

MODES = ("inference", "train")


def environment(options: RunOptions, modes: Sequence[str]) -> dict[str, Any]:
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
        "modes": list(modes),
        "size": options.size,
        "dtype": str(options.dtype).replace("torch.", ""),
        "variants": list(options.variants),
        "batch": "as built" if options.batch is None else options.batch,
        "seq": "as built" if options.seq is None else options.seq,
        "timing": options.timing.method(device) if options.timed else "not measured (--no-timing)",
        "host_timing": host_method(device, options.timing) if options.timed else "not measured (--no-timing)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers_version,
        "python": platform.python_version(),
        "fuse_interpreter": fusebackend.use_interpreter(),
    }


def stem(size: str, modes: Sequence[str]) -> str:
    """The files' name: ``zoo``, ``_tiny`` for the tiny size, ``_train`` or ``_inference`` when
    only that mode ran (both modes: neither)."""
    only = f"_{modes[0]}" if len(set(modes)) == 1 else ""
    return "zoo" + ("_tiny" if size == "tiny" else "") + only


def _time(v: VariantStats | None) -> str:
    """A variant's median ms, ``ERROR`` where it failed, ``-`` where it was not timed."""
    if v is None or (v.status != "error" and v.median_ms is None):
        return "-"
    return "ERROR" if v.status == "error" else f"{v.median_ms:.4g}"


def _ms(v: VariantStats | None) -> str:
    """``_time``, with the speedup over eager of a compiled variant."""
    speed = (f" ({speed_text(v.speedup)}x)" if v is not None and v.status != "error" and v.median_ms is not None
             and v.speedup is not None and v.variant != "eager" else "")
    return _time(v) + speed


def speed_text(x: float) -> str:
    """A speedup to two decimals, or two significant digits below 0.1 (0.0031, not 0.00)."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def _err(v: VariantStats | None) -> str:
    if v is None:
        return "-"
    if v.error is None:
        return "ERROR" if v.status == "error" else "-"
    return f"{v.error:.2e}"


def _fallbacks(v: VariantStats | None, limit: int = 6) -> str:
    if v is None or not v.fallbacks:
        return "-"
    items = list(v.fallbacks.items())
    text = ", ".join(f"{op} x{n}" for op, n in items[:limit])
    return text + (f", +{len(items) - limit} more" if len(items) > limit else "")


def _each(row: ZooRow, value: Callable[[VariantStats], float | int | None], fmt: str,
          variants: Sequence[str] = ("eager", "inductor", "fuse")) -> str:
    """One number per variant, ``a / b / c`` in the order of ``variants``; ``-`` where it is not
    measured, and ``-`` alone when none is."""
    parts = []
    for name in variants:
        v = row.get(name)
        x = None if v is None else value(v)
        parts.append("-" if x is None else format(x, fmt))
    return "-" if all(p == "-" for p in parts) else " / ".join(parts)


HEADER = ["model", "mode", "batch", "eager ms", "inductor ms", "fuse ms", "host ms e/i/f", "cold compile s i/f",
          "peak MiB e/i/f", "launches e/i/f", "inductor err", "fuse err", "fuse <= 2x ind", "eager graphs",
          "fuse kernels", "fuse ATen calls"]
_ALWAYS = 3  # model, mode and batch are shown even where empty


def cells(row: ZooRow) -> list[str]:
    if row.status != "ok":
        return [row.model, row.mode, row.shapes or "-", row.status, row.message[:120]] + [""] * (len(HEADER) - 5)
    f = row.fuse
    within = row.fuse_within_2x_inductor
    return [
        row.model, row.mode, row.shapes, _ms(row.eager), _ms(row.inductor), _ms(f),
        _each(row, lambda v: v.host_ms, ".4g"),
        _each(row, lambda v: v.first_call_s, ".1f", ("inductor", "fuse")),
        _each(row, lambda v: v.peak_mib, ".0f"),
        _each(row, lambda v: v.launches, "d"),
        _err(row.inductor), _err(f),
        "-" if within is None else ("yes" if within else "NO"),
        "-" if f is None or f.eager_graphs is None else str(f.eager_graphs),
        "-" if f is None or f.kernels is None else str(f.kernels),
        _fallbacks(f),
    ]


def _grid(rows: Sequence[ZooRow]) -> tuple[list[str], list[list[str]]]:
    """The header and the rows' cells, less the columns with nothing in any row."""
    body = [cells(r) for r in rows]
    keep = [i for i in range(len(HEADER))
            if i < _ALWAYS or any(line[i] not in ("", "-") for line in body)]
    return [HEADER[i] for i in keep], [[line[i] for i in keep] for line in body]


def messages(rows: Sequence[ZooRow]) -> list[str]:
    notes = [f"{r.model} ({r.mode}): {r.message}" for r in rows if r.status == "ok" and r.message]
    notes += [f"{r.model} ({r.mode}) {v.variant}: {v.message}" for r in rows for v in r.variants if v.message]
    return notes


def table(rows: Sequence[ZooRow]) -> str:
    """The rows as plain text, columns padded, then the messages."""
    header, body = _grid(rows)
    lines = [header] + body
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    notes = messages(rows)
    if notes:
        text += ["", "messages:"] + [f"  {n[:400]}" for n in notes]
    return "\n".join(text)


def print_table(rows: Sequence[ZooRow], title: str = "") -> None:
    """The rows as a rich table on stdout (plain text where rich does not import), then the
    messages. Off a terminal rich would wrap the table to 80 columns: it gets 240."""
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        print(table(rows))
        return
    header, body = _grid(rows)
    console = Console(width=None if sys.stdout.isatty() else 240)
    grid = Table(title=title or None, header_style="bold", show_lines=False)
    for name in header:
        grid.add_column(name, overflow="fold")
    for line in body:
        # Text, not str: rich reads "[...]" in a str as markup, and messages hold brackets
        grid.add_row(*(Text(c) for c in line))
    console.print(grid)
    notes = messages(rows)
    if notes:
        console.print(Text("messages:\n" + "\n".join(f"  {n[:400]}" for n in notes)))


def progress(row: ZooRow) -> str:
    """One line for a model as soon as it has run."""
    head = f"{row.model} ({row.mode})"
    if row.status != "ok":
        return f"{head} ({row.seconds:.1f} s): {row.status} {row.message}"
    parts = []
    for v in row.variants:
        part = f"{v.variant} {_ms(v)} ms"
        if v.variant != "eager":
            part += f" err {_err(v)}"
            if v.first_call_s is not None:
                part += f" cold {v.first_call_s:.1f} s"
        if v.variant == "fuse" and v.eager_graphs:
            part += f" ({v.eager_graphs} graph(s) ran eagerly)"
        if v.variant == "fuse" and v.layout_copies:
            part += f" ({v.layout_copies} ATen result(s) copied into another layout a step)"
        if v.variant == "fuse" and v.slow_launches:
            part += " (launches through Triton while timed: " + ", ".join(f"{k} x{n}" for k, n in v.slow_launches.items()) + ")"
        parts.append(part)
    warning = f" [{row.message}]" if row.message else ""
    return f"{head} {row.shapes} ({row.seconds:.1f} s): " + ", ".join(parts) + warning


def geomean(values: Iterable[float]) -> float | None:
    xs = [x for x in values if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def speedups(rows: Sequence[ZooRow], variant: str) -> list[float]:
    """``variant``'s speedups over eager, in the rows where it was timed."""
    out = []
    for r in rows:
        v = r.get(variant) if r.status == "ok" else None
        if v is not None and v.status == "ok" and v.speedup is not None:
            out.append(v.speedup)
    return out


def compiled_variants(rows: Sequence[ZooRow]) -> list[str]:
    """The compiled variants in ``rows``: fuse, Inductor, then those with a mode (``fuse@...``)."""
    names = dict.fromkeys(v.variant for r in rows for v in r.variants if v.variant != "eager")
    return [n for n in ("fuse", "inductor") if n in names] + [n for n in names if "@" in n]


def _label(variant: str) -> str:
    return variant.replace("inductor", "Inductor", 1)


def summary(rows: Sequence[ZooRow]) -> str:
    """Geometric-mean speedups of each compiled variant over eager (each mode, then all rows), and
    the rows where fuse is slower than Inductor in the same torch.compile mode."""
    lines = []
    groups = [(m, [r for r in rows if r.mode == m]) for m in MODES]
    groups = [(m, rs) for m, rs in groups if rs]
    if len(groups) > 1:
        groups.append(("all", list(rows)))
    variants = compiled_variants(rows)
    for name, group in groups:
        parts = []
        for variant in variants:
            xs = speedups(group, variant)
            g = geomean(xs)
            if g is not None:
                parts.append(f"{_label(variant)} {speed_text(g)}x over {len(xs)}")
        lines.append(f"geomean speedup over eager, {name}: " + (", ".join(parts) if parts else "nothing timed"))
    for fuse in (v for v in variants if v.startswith("fuse")):
        inductor = fuse.replace("fuse", "inductor", 1)
        if not any(speedups(rows, inductor)):
            continue
        slower = []
        for r in rows:
            f, i = r.get(fuse), r.get(inductor)
            if (r.status == "ok" and f is not None and i is not None and f.speedup is not None
                    and i.speedup is not None and f.status == i.status == "ok" and f.speedup < i.speedup):
                slower.append(f"{r.model} ({r.mode}) {speed_text(f.speedup)}x vs {speed_text(i.speedup)}x")
        lines.append(f"{fuse} slower than {_label(inductor)} in {len(slower)}: "
                     + (", ".join(slower) if slower else "none"))
    lines += _peak_lines(rows)
    return "\n".join(lines)


def _peak_lines(rows: Sequence[ZooRow]) -> list[str]:
    """The rows where fuse's peak memory is above Inductor's, and the training steps where it is
    above eager's (the peak-memory goals), where peaks were measured."""
    above_inductor, above_eager = [], []
    for r in rows:
        f, i, e = r.fuse, r.inductor, r.eager
        if r.status != "ok" or f is None or f.peak_mib is None:
            continue
        if i is not None and i.peak_mib is not None and f.peak_mib > i.peak_mib:
            above_inductor.append(f"{r.model} ({r.mode}) {f.peak_mib:.1f} vs {i.peak_mib:.1f} MiB")
        if r.mode == "train" and e is not None and e.peak_mib is not None and f.peak_mib > e.peak_mib:
            above_eager.append(f"{r.model} {f.peak_mib:.1f} vs {e.peak_mib:.1f} MiB")
    lines = []
    if any(r.inductor is not None and r.inductor.peak_mib is not None for r in rows):
        lines.append(f"fuse's peak memory above Inductor's in {len(above_inductor)}: "
                     + (", ".join(above_inductor) if above_inductor else "none"))
    if any(r.mode == "train" and r.eager is not None and r.eager.peak_mib is not None for r in rows):
        lines.append(f"fuse's peak memory above eager's in a training step in {len(above_eager)}: "
                     + (", ".join(above_eager) if above_eager else "none"))
    return lines


def mode_lines(rows: Sequence[ZooRow]) -> list[str]:
    """One line per row and variant with a torch.compile mode: its time, speedup, peak memory,
    error, and the graphs it did not record as CUDA graphs."""
    out = []
    for r in rows:
        for v in r.variants:
            if "@" not in v.variant:
                continue
            peak = "-" if v.peak_mib is None else f"{v.peak_mib:.0f}"
            text = f"{r.model} ({r.mode}, {r.shapes}) {v.variant}: {_ms(v)} ms, peak {peak} MiB, err {_err(v)}"
            if v.uncaptured:
                text += "; uncaptured: " + "; ".join(f"{g}: {why}" for g, why in v.uncaptured.items())
            tuned = getattr(v, "tuned", None)
            if tuned:
                text += (f"; tuned {tuned['kernels']:.0f} kernels, {tuned['changed']:.0f} kept a candidate "
                         f"(alone: {tuned['heuristic_us']:.1f} us by the heuristics, {tuned['chosen_us']:.1f} us chosen)")
            out.append(text)
    return out


def compile_stage_lines(rows: Sequence[ZooRow]) -> list[str]:
    """One line per row and compiled variant of its first call split by stage
    (``VariantStats.compile_stages``)."""
    out = []
    for r in rows:
        for v in (r.inductor, r.fuse):
            if v is None or not v.compile_stages:
                continue
            parts = ", ".join(f"{k} {s:.2f}" for k, s in v.compile_stages.items())
            graphs = "" if v.cache_hits is None else (
                f" ({v.cache_hits} graphs from the cache, {v.cache_misses} compiled; "
                f"{v.aot_cache_hits} AOTAutograd results from its cache)")
            out.append(f"{r.model} ({r.mode}), {v.variant}: {parts}{graphs}")
    return out


def audit_lines(rows: Sequence[ZooRow]) -> list[str]:
    """The kernel audit (``audit.py``), one line per row where it was measured: fuse's generated
    kernels' time against their floors and the library's time, beside Inductor's, and each
    kernel under half its floor that takes 2% of the step or more, with the time of Inductor's
    kernels for the same source nodes where some were found (``audit.beside_inductor``)."""
    out = []
    for r in rows:
        f, i = r.fuse, r.inductor
        if f is None or f.generated_us is None:
            continue
        text = f"{r.model} ({r.mode}): fuse's kernels {f.generated_us / 1e3:.2f} ms"
        if f.floor_us:
            text += f" (their floor {f.floor_us / 1e3:.2f} ms, {f.floor_us / f.generated_us:.0%} of it)"
        text += f", library {f.library_us / 1e3:.2f} ms"
        if i is not None and i.generated_us is not None:
            text += f"; Inductor's kernels {i.generated_us / 1e3:.2f} ms, library {i.library_us / 1e3:.2f} ms"
        if f.slow_kernels:
            text += "; under half their floor: " + ", ".join(map(_slow_kernel, f.slow_kernels))
        out.append(text)
    return out


def _slow_kernel(k: dict[str, Any]) -> str:
    """One flagged kernel (``audit.KernelAudit`` as saved), with Inductor's kernels for the same
    source nodes; where those compute other nodes too, or miss some, the share they have in
    common says so."""
    text = (f"{k['name']} {k['us']:.0f} us ({k['of_floor']:.0%} of floor, {k['share']:.0%} of the step"
            + (f", {k['kernels']} kernels" if k["kernels"] > 1 else ""))
    if k.get("inductor_us") is not None:  # absent from runs saved before the match was made
        text += f"; Inductor's kernels for the same nodes: {k['inductor_us']:.0f} us"
        if k["inductor_overlap"] < 1:
            text += (f" ({len(k['inductor_kernels'])} kernels; {k['inductor_overlap']:.0%} of the nodes either "
                     "computes are common)")
    return text + ")"


def loss_causes(row: ZooRow) -> str | None:
    """Where fuse's step loses to Inductor's, by cause: the GPU (generated kernels, library
    kernels), the host (a step longer than its GPU time), memory (a higher peak), graphs run
    eagerly. None where fuse is not slower or the figures are missing."""
    f, i = row.fuse, row.inductor
    if (f is None or i is None or f.median_ms is None or i.median_ms is None or f.median_ms <= i.median_ms
            or f.status != "ok" or i.status != "ok"):
        return None
    parts = [f"{f.median_ms - i.median_ms:+.2f} ms a step"]
    if f.generated_us is not None and i.generated_us is not None:
        parts.append(f"GPU kernels: generated {(f.generated_us - i.generated_us) / 1e3:+.2f} ms, "
                     f"library {(f.library_us - i.library_us) / 1e3:+.2f} ms")
    if f.gpu_ms is not None and f.host_ms is not None and i.gpu_ms is not None and i.host_ms is not None:
        fuse_host = max(f.host_ms - f.gpu_ms, 0.0)
        inductor_host = max(i.host_ms - i.gpu_ms, 0.0)
        if fuse_host > 0 or inductor_host > 0:
            parts.append(f"host beyond the GPU: fuse {fuse_host:.2f} ms, Inductor {inductor_host:.2f} ms")
    if f.peak_mib is not None and i.peak_mib is not None:
        parts.append(f"peak {f.peak_mib - i.peak_mib:+.0f} MiB")
    if f.eager_graphs:
        parts.append(f"{f.eager_graphs} graph(s) run eagerly")
    return f"{row.model} ({row.mode}): " + "; ".join(parts)


def markdown(rows: Sequence[ZooRow], env: dict[str, Any]) -> str:
    modes = ", ".join(env.get("modes") or sorted({r.mode for r in rows}))
    lines = [f"# Zoo: {modes}, {env['size']} size, {env['dtype']}", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "Times in ms (speedup over eager); host ms: the host's time per step; cold compile s: compile and "
              "one run (the run starts with empty cache folders unless --keep-caches or --cache-dir: see caches above); peak MiB: the most device memory allocated during one step, "
              "weights and inputs included; launches: GPU kernels per step (copies and fills left out). "
              "e/i/f: eager / Inductor / fuse. Errors are max |out - eager| / max |eager| over the outputs "
              "(training: the loss, and gradients over the largest eager gradient).", ""]
    header, body = _grid(rows)
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for line in body:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in line) + " |")
    text = summary(rows)
    if text:
        lines += [""] + [f"{t}  " for t in text.splitlines()]
    modes = mode_lines(rows)
    if modes:
        lines += ["", "## Variants with a torch.compile mode", "",
                  "ms (speedup over eager), peak MiB as above; uncaptured: fuse's graphs that reduce-overhead "
                  "ran without a CUDA graph, and why.", ""] + [f"- {t}" for t in modes]
    stages = compile_stage_lines(rows)
    if stages:
        lines += ["", "## The first call by stage (s)", "",
                  "dynamo: Dynamo's tracing; aot: AOTAutograd's; cache: the key and the lookup; store: the entry "
                  "written; triton: Triton's compile (or its cache's load) of the kernels; inductor: Inductor's "
                  "compile of its graphs (Dynamo's timers); backend (a training step under Inductor): AOTAutograd "
                  "and the forward's compile; other: the rest of the first call (the model's Python, the ATen "
                  "calls, the run).", ""] + [f"- {t}" for t in stages]
    audits = audit_lines(rows)
    if audits:
        lines += ["", "## Kernels against their floor", "",
                  "Device time of one profiled step in kernels a compiler generated (fuse's, Inductor's) and in "
                  "library kernels (cuBLAS, cuDNN, ATen); a kernel's floor: its bytes read and written over the "
                  f"copy bandwidth measured in the run ({env.get('copy_gbps', '?')} GB/s). Listed: fuse's kernels "
                  "under half their floor's speed that take 2% of the step or more, each with the time of "
                  "Inductor's kernels that compute any of the same nodes of the model (its source nodes), where "
                  "some were found.", ""] + [f"- {t}" for t in audits]
    causes = [c for c in (loss_causes(r) for r in rows) if c]
    if causes:
        lines += ["", "## Where fuse loses to Inductor, by cause", ""] + [f"- {c}" for c in causes]
    notes = messages(rows)
    notes += [f"{r.model} ({r.mode}) {r.status}: {r.message}" for r in rows if r.status != "ok" and r.message]
    if notes:
        lines += ["", "## Messages", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def to_json(rows: Sequence[ZooRow], env: dict[str, Any]) -> dict[str, Any]:
    out = []
    for r in rows:
        item = dataclasses.asdict(r)
        item["fuse_within_2x_inductor"] = r.fuse_within_2x_inductor
        out.append(item)
    return {"environment": env, "rows": out}


def write(rows: Sequence[ZooRow], env: dict[str, Any], folder: str, name: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    json_path = os.path.join(folder, name + ".json")
    md_path = os.path.join(folder, name + ".md")
    with open(json_path, "w") as f:
        json.dump(to_json(rows, env), f, indent=1, default=str)
    with open(md_path, "w") as f:
        f.write(markdown(rows, env))
    return [json_path, md_path]


def _known(cls: type, item: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` in ``item``: a file from an older runner lacks some, and the JSON
    adds derived ones (``fuse_within_2x_inductor``)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in item.items() if k in names}


def from_json(data: dict[str, Any]) -> tuple[list[ZooRow], dict[str, Any]]:
    rows = []
    for item in data.get("rows", []):
        fields = _known(ZooRow, item)
        fields["variants"] = [VariantStats(**_known(VariantStats, v)) for v in item.get("variants", [])]
        rows.append(ZooRow(**fields))
    env = dict(data.get("environment", {}))
    if "modes" not in env:  # written before both modes ran in one file: "mode" was the run's
        env["modes"] = [m for m in MODES if any(r.mode == m for r in rows)]
    return rows, env


def _merge_environments(envs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One environment for rows from several runs: a key whose values agree keeps its value, one
    whose values differ lists them apart with `` / ``; the modes are the union."""
    merged: dict[str, Any] = {}
    for key in dict.fromkeys(k for e in envs for k in e):
        values = [e[key] for e in envs if key in e]
        if key == "modes":
            merged[key] = [m for m in MODES if any(m in v for v in values)]
            continue
        distinct = list(dict.fromkeys(json.dumps(v, default=str) for v in values))
        merged[key] = values[0] if len(distinct) == 1 else " / ".join(str(json.loads(d)) for d in distinct)
    return merged


def load(paths: Sequence[str], log: Callable[[str], None] = print,
         sources: dict[tuple[str, str], str] | None = None) -> tuple[list[ZooRow], dict[str, Any]]:
    """Rows and environment from saved JSON files, in order. A model and mode in several files
    keeps the last file's row (a rerun replaces the first), said through ``log``; ``sources``,
    where given, gets each kept row's file by (model, mode)."""
    rows: dict[tuple[str, str], ZooRow] = {}
    where: dict[tuple[str, str], str] = {} if sources is None else sources
    envs = []
    for path in paths:
        with open(path) as f:
            file_rows, env = from_json(json.load(f))
        envs.append(env)
        for r in file_rows:
            key = (r.model, r.mode)
            if key in rows:
                if where[key] != path:
                    log(f"{r.model} ({r.mode}) is in {where[key]} and {path}: {path}'s row is kept")
                del rows[key]
            rows[key], where[key] = r, path
    env = _merge_environments(envs)
    if len(paths) > 1:
        env["sources"] = list(paths)
    return list(rows.values()), env


def sources_table(rows: Sequence[ZooRow], sources: dict[tuple[str, str], str], root: str) -> str:
    """A Markdown table of ``rows`` (ms per step, fuse / Inductor, peak MiB) with each row's file
    (relative to ``root``), whose name ends with the code it ran."""
    lines = ["| model | mode | batch | eager | Inductor | fuse | fuse / Inductor | peak MiB e / i / f | file |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        file = os.path.relpath(sources[(r.model, r.mode)], root)
        if r.status != "ok":
            lines.append(f"| {r.model} | {r.mode} | {r.shapes or '-'} | {r.status} | | | | | {file} |")
            continue
        i, f = r.inductor, r.fuse
        ratio = "-" if i is None or f is None or not i.median_ms or not f.median_ms else f"{i.median_ms / f.median_ms:.2f}x"
        times = " | ".join(_time(r.get(name)) for name in ("eager", "inductor", "fuse"))
        lines.append(f"| {r.model} | {r.mode} | {r.shapes} | {times} | {ratio} | "
                     f"{_each(r, lambda v: v.peak_mib, '.0f')} | {file} |")
    fuse, inductor = speedups(rows, "fuse"), speedups(rows, "inductor")
    both = [r for r in rows if r.status == "ok" and r.inductor and r.fuse and r.inductor.median_ms and r.fuse.median_ms]
    ratio = geomean(r.inductor.median_ms / r.fuse.median_ms for r in both)
    lines += ["", f"{len(rows)} rows; geometric mean over eager: fuse {geomean(fuse) or 0:.2f}x, Inductor "
              f"{geomean(inductor) or 0:.2f}x; fuse / Inductor {ratio or 0:.2f}x over the {len(both)} rows both timed."]
    return "\n".join(lines) + "\n"


def listed(path: str) -> list[str]:
    """The JSON files a ``.txt`` list names, one a line (``#`` starts a comment), relative to the
    list's folder: the zoo's current figures are such a list, oldest runs first."""
    folder = os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        names = [line.split("#", 1)[0].strip() for line in f]
    return [os.path.join(folder, n) for n in names if n]
