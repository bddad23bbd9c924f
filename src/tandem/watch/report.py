"""``tandem report``: tracked runs as figures over time and a summary table.

Runs are named by MLflow run id, by run name, by ``group:NAME`` (every run with that group
tag) or by the directory of a file-store run. Each group of collocated runs is one column
of panels on a time axis relative to the group's first start, so runs that ran together
line up; where a group has several runs a dashed line shows their total (the load the
server carried). One row per metric, the same scale across a row, so columns compare.
"""

from __future__ import annotations

import base64
import bisect
import html
import json
import math
import re
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from tandem.watch.sinks.csv_sink import read_points
from tandem.watch.sinks.store import default_store_uri
from tandem.watch.summary import summary_rows

GROUP_TAG = "group"
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class RunNotFound(LookupError):
    pass


@dataclass
class RunData:
    run_id: str
    name: str
    start_ms: int
    tags: dict[str, str] = field(default_factory=dict)
    status: str = ""
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # key -> [(ms, value)]
    summary: dict[str, float] = field(default_factory=dict)

    @property
    def group(self) -> str | None:
        return self.tags.get(GROUP_TAG)


@dataclass(frozen=True)
class Panel:
    title: str
    pattern: str  # regex over metric keys; every match is a line
    scale: float = 1.0
    additive: bool = True  # a group total means something (CPU, memory, power; not %)
    cumulative: bool = False  # a running total: a run that ended still counts its last value
    rate: bool = False  # each value is an average over the interval that ends at its time


DEFAULT_PANELS = [
    Panel("CPU (% of one core)", r"system/process_tree/cpu_percent", rate=True),
    Panel("memory, PSS (GiB)", r"system/process_tree/pss_bytes", 1 / 2**30),
    Panel("GPU utilisation (%)", r"system/gpu_\d+/utilization_percent", additive=False, rate=True),
    Panel("GPU memory of the run (GiB)", r"system/gpu_\d+/run_memory_bytes", 1 / 2**30),
    Panel("GPU power (W)", r"system/gpu_\d+/power_watts"),
    Panel("GPU energy, measured (kJ)", r"system/gpu_\d+/energy_measured_joules", 1e-3, cumulative=True),
    Panel(
        "CPU energy, measured (kJ)", r"system/energy/cpu_attributed_measured_joules", 1e-3, cumulative=True
    ),
    Panel("CPU energy, estimated (kJ)", r"system/energy/cpu_estimated_joules", 1e-3, cumulative=True),
    Panel("throughput (samples/s)", r"train/samples_per_s", rate=True),
    Panel("waiting for data (s)", r"system/share/.+/consumer_\d+/stall_seconds", cumulative=True),
]


# --- loading ------------------------------------------------------------------------------
def _client(uri: str | None):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    from tandem.watch.sinks.store import _quiet_mlflow

    client = MlflowClient(tracking_uri=uri or default_store_uri())
    _quiet_mlflow()
    return client


def _all_experiments(client) -> list[str]:  # type: ignore[no-untyped-def]
    return [e.experiment_id for e in client.search_experiments()]


def recent_runs(uri: str | None = None, limit: int = 10) -> list[tuple[str, str, str]]:
    """(run id, name, group) of the newest runs in the store, newest first."""
    client = _client(uri)
    runs = client.search_runs(
        _all_experiments(client), max_results=limit, order_by=["attributes.start_time DESC"]
    )
    return [(r.info.run_id, r.info.run_name or "", r.data.tags.get(GROUP_TAG, "")) for r in runs]


def _not_found(ref: str, uri: str | None) -> RunNotFound:
    try:
        recent = recent_runs(uri)
    except Exception:
        recent = []
    where = uri or default_store_uri()
    if not recent:
        return RunNotFound(f"no run {ref!r} in {where}, which has no runs yet (track one with `tandem run`)")
    lines = "\n".join(f"  {rid}  {name}" + (f"  (group {g})" if g else "") for rid, name, g in recent)
    return RunNotFound(f"no run {ref!r} in {where}. Recent runs:\n{lines}")


def _from_mlflow(client, mlrun, keys: Sequence[str] | None = None) -> RunData:  # type: ignore[no-untyped-def]
    info = mlrun.info
    data = RunData(
        info.run_id,
        info.run_name or info.run_id,
        int(info.start_time or 0),
        dict(mlrun.data.tags),
        info.status,
    )
    for key, value in mlrun.data.metrics.items():
        if key.startswith("summary/"):
            data.summary[key.removeprefix("summary/")] = float(value)
        elif keys is None or any(re.fullmatch(k, key) for k in keys):
            history = client.get_metric_history(info.run_id, key)
            data.series[key] = sorted((m.timestamp, m.value) for m in history)
    return data


def _from_dir(path: Path) -> RunData:
    meta = json.loads((path / "run.json").read_text())
    data = RunData(
        meta["run_id"],
        meta.get("name", path.name),
        int(meta.get("start_time_ms", 0)),
        dict(meta.get("tags", {})),
        meta.get("status", ""),
    )
    for p in read_points(path / "metrics.csv"):
        if p.key.startswith("summary/"):
            data.summary[p.key.removeprefix("summary/")] = p.value
        else:
            data.series.setdefault(p.key, []).append((p.timestamp_ms, p.value))
    return data


def _quote(value: str) -> str:
    return value.replace("'", "\\'")  # inside an MLflow filter string's quotes


def load_runs(
    refs: Sequence[str], uri: str | None = None, keys: Sequence[str] | None = None
) -> list[RunData]:
    """Resolve each reference to runs (see the module docstring); unknown ones raise RunNotFound."""
    out: list[RunData] = []
    client = None
    for ref in refs:
        path = Path(ref)
        if path.is_dir() and (path / "run.json").exists():
            out.append(_from_dir(path))
            continue
        if client is None:
            client = _client(uri)
        if ref.startswith("group:"):
            group = _quote(ref.removeprefix("group:"))
            found = client.search_runs(
                _all_experiments(client),
                filter_string=f"tags.{GROUP_TAG} = '{group}'",
                order_by=["attributes.start_time ASC"],
            )
        elif _RUN_ID.match(ref):
            try:
                found = [client.get_run(ref)]
            except Exception:
                found = []
        else:
            quoted = _quote(ref)
            found = client.search_runs(
                _all_experiments(client),
                filter_string=f"attributes.run_name = '{quoted}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
        if not found:
            raise _not_found(ref, uri)
        out.extend(_from_mlflow(client, r, keys) for r in found)
    seen: set[str] = set()
    return [r for r in out if not (r.run_id in seen or seen.add(r.run_id))]  # type: ignore[func-returns-value]


# --- figures ------------------------------------------------------------------------------
# Okabe-Ito: tells apart for colour-blind readers and in greyscale print.
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]


def _columns(runs: list[RunData]) -> list[tuple[str, list[RunData]]]:
    groups: dict[str, list[RunData]] = {}
    for r in runs:
        groups.setdefault(r.group or "", []).append(r)
    return [(g or "runs", rs) for g, rs in groups.items()]


def _lines(run: RunData, panel: Panel) -> list[tuple[str, list[tuple[int, float]]]]:
    return [(k, v) for k, v in sorted(run.series.items()) if re.fullmatch(panel.pattern, k)]


def _grid(curves: list[list[tuple[float, float]]]) -> list[float]:
    """Common times for a group total: the group's span in steps of its typical interval."""
    gaps = sorted(b[0] - a[0] for c in curves for a, b in zip(c, c[1:]) if b[0] > a[0])
    step = max(gaps[len(gaps) // 2] if gaps else 1.0, 0.1)
    lo, hi = min(c[0][0] for c in curves if c), max(c[-1][0] for c in curves if c)
    n = min(int((hi - lo) / step) + 1, 20_000)
    return [lo + i * (hi - lo) / max(n - 1, 1) for i in range(n)]


def _integral(curve: list[tuple[float, float]], cum: list[float], t: float) -> float:
    """The integral up to ``t`` of a rate curve whose value i covers (t[i-1], t[i]];
    ``cum[i]`` is the integral up to t[i]."""
    if t <= curve[0][0]:
        return 0.0
    i = bisect.bisect_left(curve, (t, -math.inf))
    if i >= len(curve):
        return cum[-1]
    return cum[i - 1] + curve[i][1] * (t - curve[i - 1][0])


def _total(curves: list[list[tuple[float, float]]], panel: Panel) -> tuple[list[float], list[float]]:
    """The group's total on a common grid. Rates are averaged over each grid interval, so
    runs sampled at different moments add up to what the server carried, not to spikes;
    levels are read at each grid time (0 outside a run, or its last value after it ends for
    running totals)."""
    curves = [c for c in curves if c]
    grid = _grid(curves)
    if panel.rate:
        area = [0.0] * len(grid)  # the group's integral up to each grid time
        for c in curves:
            cum = [0.0]
            for (t0, _), (t1, v1) in zip(c, c[1:]):
                cum.append(cum[-1] + v1 * (t1 - t0))
            for i, t in enumerate(grid):
                area[i] += _integral(c, cum, t)
        total = [0.0] + [(area[i + 1] - area[i]) / (grid[i + 1] - grid[i]) for i in range(len(grid) - 1)]
        return grid, total
    total = [
        sum(_at(c, t) for c in curves if c[0][0] <= t and (panel.cumulative or t <= c[-1][0])) for t in grid
    ]
    return grid, total


def _end(run: RunData) -> int:
    return max((points[-1][0] for points in run.series.values() if points), default=0)


def _start(run: RunData) -> int:
    first = [points[0][0] for points in run.series.values() if points]
    return min([run.start_ms, *first]) if run.start_ms else min(first, default=0)


def _at(curve: list[tuple[float, float]], t: float) -> float:
    """The value a step curve holds at ``t`` (its first value before it starts)."""
    i = bisect.bisect_right(curve, (t, math.inf)) - 1
    return curve[max(i, 0)][1]


def plot(runs: list[RunData], out: Path, panels: Sequence[Panel] = DEFAULT_PANELS) -> list[Panel]:
    """Write the figure (format from the suffix: .png, .pdf, .svg); return the panels drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [p for p in panels if any(_lines(r, p) for r in runs)]
    if not shown:
        raise ValueError("none of the chosen metrics was recorded in these runs")
    columns = _columns(runs)
    colour = {r.run_id: COLOURS[i % len(COLOURS)] for i, r in enumerate(runs)}
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
            sharex="col",
            sharey="row",
            squeeze=False,
        )
        row_top = [0.0] * len(shown)
        for c, (group, group_runs) in enumerate(columns):
            t0 = min(_start(r) for r in group_runs)
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
                            color=colour[r.run_id],
                            lw=1.2,
                            label=f"{r.name}{suffix}",
                            # a level holds until the next value; a rate covers the interval before it
                            drawstyle="steps-pre" if panel.rate else "steps-post",
                            marker="o" if len(xy) < 5 else None,  # a short series stays visible
                            markersize=2.5,
                        )
                if panel.additive and len(curves) > 1 and len(group_runs) > 1:
                    tx, ty = _total(curves, panel)
                    style = "steps-pre" if panel.rate else "steps-post"
                    ax.plot(tx, ty, color="0.2", lw=1.0, ls="--", label="total", drawstyle=style)
                    row_top[row] = max([row_top[row], *ty])
                ax.grid(True, color="0.9", lw=0.6)
                row_top[row] = max([row_top[row], *(y for xy in curves for _, y in xy)])
                if c == 0:
                    ax.set_ylabel(textwrap.fill(panel.title, 16))
                if row == 0:
                    ax.set_title(f"group {group}" if group != "runs" else "runs")
                if row == len(shown) - 1:
                    ax.set_xlabel("time since start (s)")
            handles, labels = axes[0][c].get_legend_handles_labels()  # legend: every line once
            for row in range(1, len(shown)):
                h, lab = axes[row][c].get_legend_handles_labels()
                for hh, ll in zip(h, lab):
                    if ll not in labels:
                        handles.append(hh)
                        labels.append(ll)
            axes[-1][c].legend(
                handles,
                labels,
                loc="upper center",
                bbox_to_anchor=(0.5, -0.42),
                ncol=2,
                frameon=False,
            )
        for row, top in enumerate(row_top):  # rows share a scale from 0: columns compare
            axes[row][0].set_ylim(0, top * 1.08 if top > 0 else 1.0)
        fig.align_ylabels(axes[:, 0])
        fig.tight_layout()
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


def write_html(runs: list[RunData], out: Path, panels: Sequence[Panel] = DEFAULT_PANELS) -> None:
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
<h2>Summary</h2>{table}</body></html>
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
