"""The zoo's chart: fuse's speedup over eager per model, Inductor's beside it, as a PNG.

One pair of horizontal bars per model and mode (inference rows first, then the training steps,
apart). Each bar starts at 1 (eager, a line) and ends at the speedup: to the right is faster than
eager, to the left slower, on a logarithmic axis so that 2x faster and 2x slower are as long.
Each bar is labelled with its value. The legend gives each compiler's geometric mean over the rows
it was timed in, and the title the device, dtype and size. A variant that failed shows ``error``
where its bar would be; one that was not run or not timed shows nothing.

matplotlib is used through its object API (``Figure`` drawn by the Agg canvas), not pyplot, so
that making a chart changes no global backend or state of the process that runs the zoo.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from benchmarks.zoo.report import geomean, speed_text, speedups
from benchmarks.zoo.rows import ZooRow

# (variant, label, colour): fuse first, on top of each pair
SERIES = (("fuse", "fuse", "#1f77b4"), ("inductor", "Inductor", "#ff7f0e"))
_BAR = 0.38  # each bar's height; a pair is two bars and a gap


def _label(row: ZooRow) -> str:
    return row.model if row.mode == "inference" else f"{row.model} (train)"


def render(rows: Sequence[ZooRow], env: dict[str, Any], path: str) -> str | None:
    """Write the chart of ``rows`` to ``path`` (PNG); None, and no file, when nothing was timed."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    shown = [r for r in rows if r.status == "ok" and r.get("eager") is not None]
    series = [(name, label, colour) for name, label, colour in SERIES if speedups(shown, name)]
    if not series:
        return None
    # inference rows, a gap, then training rows; y grows downwards (the axis is inverted below)
    ordered = [r for r in shown if r.mode == "inference"] + [r for r in shown if r.mode != "inference"]
    ys, gaps, y = [], [], 0.0
    for k, r in enumerate(ordered):
        if k and r.mode != ordered[k - 1].mode:
            gaps.append(y - 0.2)
            y += 0.6
        ys.append(y)
        y += 1.0
    values = [v.speedup for r in ordered for v in r.variants if v.speedup and v.variant != "eager"]
    low, high = min(values + [1.0]), max(values + [1.0])
    left, right = low / 1.8, high * 1.8  # room for the labels at the bars' ends

    fig = Figure(figsize=(9.0, 1.8 + 0.22 * len(ordered) * len(series)), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    offsets = [(k - (len(series) - 1) / 2) * _BAR for k in range(len(series))]
    for (name, label, colour), dy in zip(series, offsets):
        g = geomean(speedups(ordered, name))
        n = len(speedups(ordered, name))
        bar_ys, widths = [], []
        for r, y0 in zip(ordered, ys):
            v = r.get(name)
            if v is None:
                continue
            if v.status == "error":
                ax.text(1.03, y0 + dy, f"{label}: error", va="center", fontsize=7, color="#b00000")
            elif v.speedup is not None:
                bar_ys.append(y0 + dy)
                widths.append(v.speedup)
        ax.barh(bar_ys, [w - 1.0 for w in widths], left=1.0, height=_BAR, color=colour,
                label=f"{label} (geomean {speed_text(g)}x over {n})")
        for by, w in zip(bar_ys, widths):
            text = speed_text(w)
            if w >= 1.0:
                ax.text(w * 1.03, by, text, va="center", ha="left", fontsize=7)
            else:
                ax.text(w / 1.03, by, text, va="center", ha="right", fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    for gap in gaps:
        ax.axhline(gap, color="grey", linewidth=0.6, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlim(left, right)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    ax.set_yticks(ys, [_label(r) for r in ordered], fontsize=8)
    ax.set_ylim(max(ys) + 0.7, -0.7)
    ax.set_xlabel("speedup over eager (eager's median time over the compiled one; above 1 is faster)")
    ax.grid(axis="x", which="major", linewidth=0.4, alpha=0.5)
    # below the axis (matplotlib 3.7's "outside" places it with the constrained layout): no bar under it
    fig.legend(loc="outside lower center", ncol=len(series), fontsize=8, frameon=False)
    ax.set_title(_title(env), fontsize=10)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _title(env: dict[str, Any]) -> str:
    device = str(env.get("device", "?"))
    return (f"Speedup over eager\n{device}, {env.get('dtype', '?')}, "
            f"{env.get('size', '?')} size, torch {env.get('torch', '?')}")

