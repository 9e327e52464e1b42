"""Results of a harness run as a compact text table, a Markdown file and a JSON file.

Columns (one row per case and variant):

- ``check``: ``ref`` (eager, the reference), ``ok``, ``FAIL`` (outputs differ from eager: not
  timed), ``error`` (the variant raised), ``n/a`` (the backend cannot run here).
- ``err``: largest normwise relative difference from eager, ``||out - eager|| / ||eager||``.
- ``time ms``: median time of one call. ``vs eager``: eager time over this time.
- ``floor %``: the bandwidth floor (floor bytes over the measured copy bandwidth) over this time.
- ``cold s`` / ``warm s``: the first call after ``torch.compile`` with empty / populated caches.
- ``kernels``: generated kernels, per compiled graph (``fwd+bwd`` for a training step).
- ``notes``: ATen fallbacks of fuse, graphs it ran eagerly, errors, layout differences.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from benchmarks.results import CaseResult, RunResult, VariantResult

COLUMNS = ("case", "variant", "check", "err", "time ms", "vs eager", "floor %", "cold s", "warm s", "kernels", "notes")


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 1000 else f"{x:.3g}"


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _fraction(x: float | None) -> str:
    if x is None:
        return "-"
    pct = 100 * x
    return f"{pct:.0f}%" if pct >= 10 else f"{pct:.2g}%"


def _mib(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def notes(case: CaseResult, v: VariantResult) -> list[str]:
    """What the notes column says for one variant."""
    out = []
    if v.variant == "eager" and case.floor_bytes is not None:
        floor = f"floor {_mib(case.floor_bytes)}"
        if case.floor_ms is not None:
            floor += f" = {_ms(case.floor_ms)} ms"
        out.append(floor)
    if v.fallbacks:
        out.append("aten: " + ", ".join(f"{op} x{n}" for op, n in sorted(v.fallbacks.items(), key=lambda kv: -kv[1])))
    if v.eager_graphs:
        out.append(f"{v.eager_graphs} graph(s) ran eagerly")
    out.extend(v.notes)
    return out


def rows(result: RunResult, note_width: int | None = None) -> list[tuple[str, ...]]:
    out = []
    for case in result.cases:
        if case.error is not None:
            out.append((case.name, "-", "ERROR", "-", "-", "-", "-", "-", "-", "-", _clip(case.error, note_width)))
            continue
        for k, v in enumerate(case.variants):
            kernels = "+".join(str(n) for n in v.graph_kernels.values()) if len(v.graph_kernels) > 1 else (
                "-" if v.kernels is None else str(v.kernels))
            out.append((
                case.name if k == 0 else "",
                v.variant,
                v.status,
                "-" if v.error is None else (f"{v.error:.1e}" if v.error else "0"),
                _ms(v.median_ms),
                "-" if v.speedup is None else f"{v.speedup:.2f}x",
                _fraction(v.floor_fraction),
                _seconds(v.compile_cold_s),
                _seconds(v.compile_warm_s),
                kernels,
                _clip("; ".join(notes(case, v)), note_width),
            ))
    return out


def _clip(text: str, width: int | None) -> str:
    if width is None or len(text) <= width:
        return text
    return text[: width - 3] + "..."


def header(result: RunResult) -> list[str]:
    env = result.environment
    where = "fuse kernels in Triton's interpreter" if env.get("fuse_interpreter") else "fuse kernels compiled"
    lines = [f"{result.suite} on {env['device']} | torch {env['torch']}, triton {env['triton']} | {where}"]
    if result.copy is not None:
        lines.append(f"copy bandwidth {result.copy.bytes_per_s / 1e9:.1f} GB/s "
                     f"({result.copy.nbytes / 2**20:.0f} MiB copied, read + write)")
    else:
        lines.append("copy bandwidth not measured: no floor %")
    if "timing" in env:
        lines.append(f"timing: {env['timing']}; caches: {env.get('caches', '?')}")
    left_out = [v for v in ("inductor", "fuse") if v not in env.get("variants", ("inductor", "fuse"))]
    if left_out:
        lines.append(f"left out: {', '.join(left_out)} (--variants adds them)")
    if result.startup_s:
        lines.append("start-up compile (not in any case): " + ", ".join(
            f"{k} {v:.1f} s" if isinstance(v, float) else f"{k} {v}" for k, v in result.startup_s.items()))
    return lines


def table(result: RunResult, note_width: int = 90) -> str:
    """The compact text table printed at the end of a run."""
    body = rows(result, note_width)
    widths = [max(len(COLUMNS[i]), *(len(r[i]) for r in body)) if body else len(COLUMNS[i]) for i in range(len(COLUMNS))]
    widths[-1] = 0  # the notes column is last: no padding

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = header(result) + ["", line(COLUMNS), line(tuple("-" * w for w in widths[:-1]) + ("-----",))]
    out += [line(r) for r in body]
    return "\n".join(out)


def markdown(result: RunResult) -> str:
    """The same table in Markdown, with each case's description, inputs and floor."""
    out = [f"# {result.suite}", ""] + [f"- {line}" for line in header(result)] + [""]
    out.append("| " + " | ".join(COLUMNS) + " |")
    out.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    for r in rows(result):
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    out += ["", "## Cases", ""]
    for case in result.cases:
        floor = f"; floor {case.floor_bytes} bytes ({_mib(case.floor_bytes)})" if case.floor_bytes is not None else ""
        out.append(f"- **{case.name}**: {case.description}. Inputs: {', '.join(case.inputs) or '?'}{floor}.")
        for v in case.variants:
            if v.warnings:
                out.append(f"  - {v.variant} warnings: " + "; ".join(w[:300] for w in v.warnings[:5]))
    return "\n".join(out) + "\n"


def to_json(result: RunResult) -> dict[str, Any]:
    data = dataclasses.asdict(result)
    if result.copy is not None:
        data["copy"]["bytes_per_s"] = result.copy.bytes_per_s
    return data


_COLOURS = {"fuse": "#1f77b4", "inductor": "#ff7f0e", "eager": "#7f7f7f"}  # the zoo chart's, and eager grey
_OTHER_COLOURS = ("#2ca02c", "#9467bd", "#8c564b", "#17becf")  # other series (fuse-rows0 ...), none of the above


def bars(labels: list[str], series: dict[str, list[float | None]], path: str, title: str, xlabel: str,
         reference: float | None = None, log: bool = False, fmt: str = "{:.2f}") -> str | None:
    """A PNG of horizontal bars: a group per label, a bar per series (a series named after a
    backend takes its colour; None draws no bar), each labelled with its value; ``reference``: a
    line across (100% of a floor, 1.0 of a ratio). None, and no file, where matplotlib is not
    installed (the ``zoo`` extra) or nothing has a value. matplotlib's object API, not pyplot: no
    global state of the process changes. Every chart of the benchmarks but the zoo's (which draws
    bars from 1 on a log axis, ``zoo/chart.py``) goes through here."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    if not labels or not any(v is not None for values in series.values() for v in values):
        return None
    figure = Figure(figsize=(9, 0.9 + 0.4 * len(labels) * len(series)))
    axes = figure.add_subplot()
    height = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        kept = [(i, v) for i, v in enumerate(values) if v is not None]
        drawn = axes.barh([i + k * height for i, _ in kept], [v for _, v in kept], height, label=name,
                          color=_COLOURS.get(name.split(" ")[0].lower(), _OTHER_COLOURS[k % len(_OTHER_COLOURS)]))
        axes.bar_label(drawn, labels=[fmt.format(v) for _, v in kept], padding=2, fontsize=8)
    axes.set_yticks([i + height * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    axes.invert_yaxis()
    if log:
        axes.set_xscale("log")
    if reference is not None:
        axes.axvline(reference, color="black", linewidth=0.8)
    top = max(v for values in series.values() for v in values if v is not None)
    axes.set_xlim(right=top * (3 if log else 1.2))
    axes.set_xlabel(xlabel)
    axes.set_title(title, fontsize=10)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path


def chart(data: dict[str, Any], path: str) -> str | None:
    """The chart of a harness run (``data``: its JSON, ``to_json``'s, so a saved run draws the same
    chart): per case with a floor, the share of the floor each compiled variant reached, fuse first."""
    cases = [c for c in data.get("cases", []) if c.get("floor_ms")]
    names = [v["variant"] for c in cases for v in c["variants"] if v["variant"] != "eager"]
    variants = sorted(dict.fromkeys(names), key=lambda n: (n != "fuse", n))
    shares = {n: [next((100 * v["floor_fraction"] for v in c["variants"]
                        if v["variant"] == n and v.get("floor_fraction")), None) for c in cases] for n in variants}
    env = data.get("environment", {})
    return bars([c["name"] for c in cases], shares, path,
                f"{data.get('suite', '')}: {env.get('device', '?')}, torch {env.get('torch', '?')}",
                "% of the floor: the bytes a case moves over the copy bandwidth measured in the run",
                reference=100, fmt="{:.0f}%")


def write(result: RunResult, folder: str, stem: str) -> list[str]:
    """Write ``<folder>/<stem>.json``, ``<folder>/<stem>.md`` and, where ``chart`` draws one,
    ``<folder>/<stem>.png``; return their paths."""
    os.makedirs(folder, exist_ok=True)
    json_path = os.path.join(folder, f"{stem}.json")
    md_path = os.path.join(folder, f"{stem}.md")
    data = json.loads(json.dumps(to_json(result), default=str))
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1)
    with open(md_path, "w") as f:
        f.write(markdown(result))
    png = chart(data, os.path.join(folder, f"{stem}.png"))
    return [json_path, md_path] + ([png] if png else [])


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.report RUN.json [OUT.png]``: the chart of a saved harness run."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=main.__doc__)
    parser.add_argument("run", help="a harness run's JSON (benchmarks.memory_bound --out writes one)")
    parser.add_argument("png", nargs="?", help="where the chart goes (default: beside the JSON)")
    args = parser.parse_args(argv)
    with open(args.run) as f:
        data = json.load(f)
    path = chart(data, args.png or os.path.splitext(args.run)[0] + ".png")
    print(path or "no chart: no case has a floor, or matplotlib is not installed")


if __name__ == "__main__":
    main()
