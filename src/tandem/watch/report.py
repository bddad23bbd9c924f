"""``tandem report``: tracked runs as figures over time and a summary table.

Runs are named by MLflow run id, by run name, by ``group:NAME`` (every run with that group
tag) or by the directory of a file-store run. Each group of collocated runs is one column
of panels on a time axis relative to the group's first start, so runs that ran together
line up; where a group has several runs a dashed line shows their total (the sum over the
group's own runs, not the whole machine's load). One row per metric, the same scale across
a row, and one time axis for all columns, so columns compare. A run's colour follows its
name, so the same job has the same colour in every column. A tag ``tandem.mark.NAME``
holding a Unix time in ms draws a dotted line at that time in the run's column (the demo
marks where its clock starts).

Data stall ("waiting for data") is the cumulative time a job was blocked waiting for a
batch: tandem consumers' as their producer reports it, or a run's own
``train/stall_seconds`` (the demo logs it for its private DataLoaders).
"""

from __future__ import annotations

import base64
import html
import re
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from tandem.watch._runs import GROUP_TAG, ROLE_TAG, RunData, RunNotFound, load_runs, recent_runs
from tandem.watch._summary import energy_totals, summary_rows

# Finding and loading runs is tandem.watch._runs; callers import it from here.
__all__ = ["DEFAULT_PANELS", "GROUP_TAG", "Panel", "RunData", "RunNotFound", "load_runs", "panels_for"]
__all__ += ["energy_totals", "plot", "recent_runs", "summary_grid", "summary_rich", "write_html"]


@dataclass(frozen=True)
class Panel:
    title: str
    pattern: str  # regex over metric keys; every match is a line
    scale: float = 1.0
    additive: bool = True  # a group total means something (CPU, memory, power; not %)
    cumulative: bool = False  # a running total: a run that ended still counts its last value
    rate: bool = False  # each value is an average over the interval that ends at its time
    unit: str = ""  # an SI unit: ticks read "50 J", "1.2 kJ" (for values with a wide range)


DEFAULT_PANELS = [
    Panel("CPU (% of one core)", r"system/process_tree/cpu_percent", rate=True),
    Panel("memory, PSS (GiB)", r"system/process_tree/pss_bytes", 1 / 2**30),
    Panel("GPU utilisation (%)", r"system/gpu_\d+/utilization_percent", additive=False, rate=True),
    Panel("GPU memory of the run (GiB)", r"system/gpu_\d+/run_memory_bytes", 1 / 2**30),
    Panel("GPU power (W)", r"system/gpu_\d+/power_watts"),
    Panel("GPU energy, measured", r"system/gpu_\d+/energy_measured_joules", cumulative=True, unit="J"),
    Panel(
        "CPU energy, measured",
        r"system/energy/cpu_attributed_measured_joules",
        cumulative=True,
        unit="J",
    ),
    Panel("CPU energy, estimated", r"system/energy/cpu_estimated_joules", cumulative=True, unit="J"),
    Panel("throughput (samples/s)", r"train/samples_per_s", rate=True),
    Panel(
        "waiting for data (s)",
        r"system/share/.+/consumer_\d+/stall_seconds|train/stall_seconds",
        cumulative=True,
    ),
]


# --- figures ------------------------------------------------------------------------------
# Okabe-Ito: tells apart for colour-blind readers and in greyscale print.
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
JOB_COLOURS = COLOURS[:-1]  # black is the group total's
PRODUCER_COLOUR = "#7f7f7f"  # grey: no job's colour


def _is_producer(run: RunData) -> bool:
    return run.tags.get(ROLE_TAG) == "producer"


def _columns(runs: list[RunData]) -> list[tuple[str, list[RunData]]]:
    groups: dict[str, list[RunData]] = {}
    for r in runs:
        groups.setdefault(r.group or "", []).append(r)
    return [(g or "runs", rs) for g, rs in groups.items()]


def _lines(run: RunData, panel: Panel) -> list[tuple[str, list[tuple[int, float]]]]:
    return [(k, v) for k, v in sorted(run.series.items()) if re.fullmatch(panel.pattern, k)]


def _rate_grid(arrays: list[np.ndarray]) -> np.ndarray:
    """Common times for a total of rates: the group's span in steps of its typical interval."""
    gaps = np.sort(np.concatenate([np.diff(a[:, 0]) for a in arrays]))
    gaps = gaps[gaps > 0]
    step = max(float(gaps[len(gaps) // 2]) if len(gaps) else 1.0, 0.1)
    lo, hi = min(a[0, 0] for a in arrays), max(a[-1, 0] for a in arrays)
    return np.linspace(lo, hi, min(int((hi - lo) / step) + 1, 20_000))


def _total(curves: list[list[tuple[float, float]]], panel: Panel) -> tuple[np.ndarray, np.ndarray]:
    """The group's total of step curves.

    Rates (value i is the average over (t[i-1], t[i]], drawn ``steps-pre``) are averaged
    over each interval of a common grid, so runs sampled at different moments add up to
    what the server carried, not to spikes: a rate's integral is piecewise linear, so
    ``np.interp`` of its running integral is exact at any time (0 before the run, all of
    it after). Levels (a value holds until the next, drawn ``steps-post``) are summed at
    every time at which any run has a point, so the total steps exactly where its lines
    do: each run's latest value, 0 before it starts and after it ends, except running
    totals, which keep their last value."""
    arrays = [np.asarray(c, dtype=float) for c in curves if c]
    if panel.rate:
        grid = _rate_grid(arrays)
        if len(grid) < 2:
            return grid, np.zeros_like(grid)
        area = np.zeros_like(grid)
        for a in arrays:
            t, v = a[:, 0], a[:, 1]
            area += np.interp(grid, t, np.concatenate([[0.0], np.cumsum(v[1:] * np.diff(t))]))
        return grid, np.concatenate([[0.0], np.diff(area) / np.diff(grid)])
    grid = np.unique(np.concatenate([a[:, 0] for a in arrays]))
    total = np.zeros_like(grid)
    for a in arrays:
        t, v = a[:, 0], a[:, 1]
        running = grid >= t[0] if panel.cumulative else (grid >= t[0]) & (grid <= t[-1])
        total[running] += v[np.searchsorted(t, grid[running], side="right") - 1]
    return grid, total


def _end(run: RunData) -> int:
    return max((points[-1][0] for points in run.series.values() if points), default=0)


def _start(run: RunData) -> int:
    first = [points[0][0] for points in run.series.values() if points]
    return min([run.start_ms, *first]) if run.start_ms else min(first, default=0)


MARK_TAG = "tandem.mark."  # tandem.mark.NAME = Unix ms: a dotted line labelled NAME


def _marks(group_runs: list[RunData]) -> dict[str, float]:
    """A column's marks: {NAME: Unix ms}."""
    marks: dict[str, float] = {}
    for r in group_runs:
        for key, value in r.tags.items():
            if key.startswith(MARK_TAG):
                try:
                    marks[key.removeprefix(MARK_TAG)] = float(value)
                except ValueError:
                    continue  # not a time: not ours to draw
    return marks


def plot(
    runs: list[RunData],
    out: Path,
    panels: Sequence[Panel] = DEFAULT_PANELS,
    caption: str | None = None,
    zero: str | None = None,
) -> list[Panel]:
    """Write the figure (format from the suffix: .png, .pdf, .svg), with ``caption`` under
    it if given; return the panels drawn. ``zero``: the NAME of a mark (tag
    ``tandem.mark.NAME``) that is time 0 in the columns that have it, instead of the group's
    first start (what comes before it is drawn at negative times)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    shown = [p for p in panels if any(_lines(r, p) for r in runs)]
    if not shown:
        raise ValueError("none of the chosen metrics was recorded in these runs")
    columns = _columns(runs)
    # By name, not by run: the same job in two groups (private and shared, say) is one colour.
    # A share's producer is drawn apart from every job: grey, thick and dash-dotted.
    names = list(dict.fromkeys(r.name for r in runs if not _is_producer(r)))
    colour = {name: JOB_COLOURS[i % len(JOB_COLOURS)] for i, name in enumerate(names)}
    colour.update({r.name: PRODUCER_COLOUR for r in runs if _is_producer(r)})
    with plt.rc_context(
        {
            "font.size": 8,
            "axes.titlesize": 9,
            "axes.labelsize": 8,
            "legend.fontsize": 7,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "figure.dpi": 100,
        }
    ):
        fig, axes = plt.subplots(
            len(shown),
            len(columns),
            figsize=(3.6 * len(columns), 1.7 * len(shown) + 0.6),
            sharex=True,  # one time axis: a group that finished sooner is visibly shorter
            sharey="row",
            squeeze=False,
        )
        row_top = [0.0] * len(shown)
        legend: dict[str, Any] = {}  # label -> handle (a matplotlib Artist), over all columns
        for c, (group, group_runs) in enumerate(columns):
            marks = _marks(group_runs) if group != "runs" else {}
            aligned = zero in marks
            t0 = int(marks[zero]) if aligned and zero is not None else min(_start(r) for r in group_runs)
            for row, panel in enumerate(shown):
                ax = axes[row][c]
                curves = []
                devices: set[str] = set()
                for r in group_runs:
                    base = t0 if r.group else _start(r)
                    lines = _lines(r, panel)
                    for key, points in lines:
                        xy = [((t - base) / 1000.0, v * panel.scale) for t, v in points]
                        if not panel.rate and xy and xy[-1][0] < (end := (_end(r) - base) / 1000.0):
                            xy.append((end, xy[-1][1]))  # an unchanged value was not stored again
                        # Runs that share a GPU each report the whole device: count it once.
                        gpu = re.match(r"system/(gpu_\d+)/", key)
                        device = r.tags.get(f"tandem.{gpu.group(1)}") if gpu else None
                        if device is None or device not in devices:
                            curves.append(xy)
                            if device is not None:
                                devices.add(device)
                        suffix = ""
                        m = re.search(r"(gpu_\d+|consumer_\d+)", key)
                        if m and len(lines) > 1:
                            suffix = f" {m.group(1)}"
                        ax.plot(
                            [x for x, _ in xy],
                            [y for _, y in xy],
                            color=colour[r.name],
                            lw=2.2 if _is_producer(r) else 1.2,
                            ls="-." if _is_producer(r) else "-",
                            label=f"{r.name}{suffix}",
                            # a level holds until the next value; a rate covers the interval before it
                            drawstyle="steps-pre" if panel.rate else "steps-post",
                            marker="o" if len(xy) < 5 else None,  # a short series stays visible
                            markersize=2.5,
                        )
                if not curves:  # an empty panel must not read as zero
                    ax.text(0.5, 0.5, "not recorded", transform=ax.transAxes, ha="center", color="0.5")
                if panel.additive and len(curves) > 1 and len(group_runs) > 1:
                    tx, ty = _total(curves, panel)
                    style = "steps-pre" if panel.rate else "steps-post"
                    ax.plot(tx, ty, color="0.2", lw=1.0, ls="--", label="group total", drawstyle=style)
                    row_top[row] = max(row_top[row], float(ty.max()))
                for name, ms in marks.items():
                    x, label = (ms - t0) / 1000.0, name.replace("_", " ")
                    ax.axvline(x, color="0.4", lw=0.9, ls=":")
                    if row == 0:
                        ax.annotate(
                            label,
                            xy=(x, 1.0),
                            xycoords=("data", "axes fraction"),
                            xytext=(2, -1),
                            textcoords="offset points",
                            ha="left",
                            va="top",
                            fontsize=6.5,
                            color="0.3",
                        )
                ax.grid(True, color="0.9", lw=0.6)
                if panel.unit:
                    ax.yaxis.set_major_formatter(EngFormatter(unit=panel.unit, sep=" "))
                row_top[row] = max([row_top[row], *(y for xy in curves for _, y in xy)])
                if c == 0:
                    ax.set_ylabel(textwrap.fill(panel.title, 16))
                if row == 0:
                    ax.set_title(f"group {group}" if group != "runs" else "runs")
                if row == len(shown) - 1:
                    since = zero.replace("_", " ") if aligned and zero else "the group's first start"
                    ax.set_xlabel(f"time since {since} (s)")
                for handle, label in zip(*ax.get_legend_handles_labels()):
                    legend.setdefault(label, handle)
        for row, top in enumerate(row_top):  # rows share a scale from 0: columns compare
            axes[row][0].set_ylim(0, top * 1.08 if top > 0 else 1.0)
        if not any(zero in _marks(rs) for _, rs in columns):
            axes[0][0].set_xlim(left=0)
        fig.align_ylabels(axes[:, 0])
        fig.tight_layout()
        # One legend for the figure (a name has one colour in every column), the total last.
        labels = sorted(legend, key=lambda label: label == "group total")
        shown_legend = fig.legend(
            [legend[label] for label in labels],
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(4, len(labels)),
            frameon=False,
        )
        if caption:
            fig.canvas.draw()
            below = shown_legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
            width = int(fig.get_figwidth() * 17)  # characters per line at 7 pt
            fig.text(
                0.02,
                below - 0.005,
                "\n".join(textwrap.wrap(caption, width)),
                ha="left",
                va="top",
                fontsize=7,
                color="0.15",
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=200, bbox_inches="tight")
        plt.close(fig)
    return shown


# --- tables -------------------------------------------------------------------------------
def summary_grid(runs: list[RunData]) -> tuple[list[str], list[list[str]]]:
    """Rows of (what, value per run) over the union of the runs' summary lines."""
    per_run = [dict(summary_rows(r.summary)) if "duration_s" in r.summary else {} for r in runs]
    order: list[str] = []
    for rows in per_run:
        order.extend(k for k in rows if k not in order)
    header = ["", *[f"{r.name}" + (f" ({r.group})" if r.group else "") for r in runs]]
    return header, [[what, *[rows.get(what, "-") for rows in per_run]] for what in order]


def summary_rich(runs: list[RunData]) -> Table:
    header, rows = summary_grid(runs)
    table = Table(*header, title="summary", title_justify="left")
    for row in rows:
        table.add_row(*row)
    return table


def write_html(
    runs: list[RunData], out: Path, panels: Sequence[Panel] = DEFAULT_PANELS, after: str = ""
) -> None:
    """The figure, the runs and their summary on one page; ``after``: HTML that follows
    (``tandem report``'s sweep tables)."""
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "figure.png"
        plot(runs, png, panels)
        image = base64.b64encode(png.read_bytes()).decode()
    header, rows = summary_grid(runs)
    esc = html.escape
    table = "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
    table += (
        "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
    )
    meta = "".join(
        f"<li><b>{esc(r.name)}</b> <code>{esc(r.run_id)}</code> {esc(r.status)}"
        f"{' group ' + esc(r.group) if r.group else ''}"
        f"{_command_html(r)}</li>"
        for r in runs
    )
    out.write_text(
        f"""<!doctype html><html><head><meta charset="utf-8"><title>tandem report</title>
<style>{_CSS}</style></head><body><h1>tandem report</h1><ul>{meta}</ul>
<img alt="metrics over time" src="data:image/png;base64,{image}">
<h2>Summary</h2>{table}{after}</body></html>
"""
    )


_CSS = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto} img{max-width:100%} "
    "table{border-collapse:collapse} td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}"
)


def _command_html(r: RunData) -> str:
    cmd = r.tags.get("tandem.command")
    return f" &mdash; <code>{html.escape(cmd)}</code>" if cmd else ""


def panels_for(metrics: Sequence[str]) -> list[Panel]:
    """Panels for metric keys the user named (a full key, or a regex over keys)."""
    return [
        Panel(m, m if any(ch in m for ch in "\\*+[(") else re.escape(m), additive=not m.endswith("percent"))
        for m in metrics
    ]
