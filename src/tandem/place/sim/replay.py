"""Comparing placement policies on a trace: run the simulations, tabulate, write a report.

:func:`run_simulations` simulates one trace under several policies
(:func:`tandem.place.sim.simulate.simulate`). :func:`compare` and :func:`write_report` take,
per policy, either a :class:`~tandem.place.sim.simulate.SimResult` or a plain mapping with the
same aggregate keys (:data:`~tandem.place.sim.simulate.AGGREGATE_KEYS`), so that a live replay
through the daemon can be reported the same way. Missing keys show as ``-``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from tandem.place.policies import POLICIES, Limits
from tandem.place.sim.simulate import SimResult, SlowdownModel, simulate
from tandem.place.sim.trace import GiB, TraceJob

Result = SimResult | Mapping[str, Any]

# (key, heading, format) of the table's columns.
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("makespan_s", "makespan", "time"),
    ("jct_mean_s", "mean JCT", "time"),
    ("jct_p50_s", "p50 JCT", "time"),
    ("jct_p95_s", "p95 JCT", "time"),
    ("wait_mean_s", "mean wait", "time"),
    ("slowdown_mean", "mean slowdown", "x"),
    ("slowdown_max", "max slowdown", "x"),
    ("gpu_util", "GPU busy", "pct"),
    ("cpu_util", "CPU busy", "pct"),
    ("energy_kwh_estimated", "energy (est.)", "kwh"),
    ("oom_crashes", "OOM crashes", "int"),
    ("retries", "retries", "int"),
)
_PLOTTED = (("makespan_s", "makespan"), ("jct_mean_s", "mean JCT"), ("jct_p95_s", "p95 JCT"))


def run_simulations(
    trace: list[TraceJob],
    policies: Iterable[str] | None = None,
    gpus: int = 1,
    gpu_mem: int = 80 * GiB,
    cpus: float = 64,
    mem: int = 512 * GiB,
    limits: Limits | None = None,
    model: SlowdownModel | None = None,
) -> dict[str, SimResult]:
    """``trace`` simulated under each of ``policies`` (all of them by default), by name."""
    return {
        name: simulate(trace, name, gpus, gpu_mem=gpu_mem, cpus=cpus, mem=mem, limits=limits, model=model)
        for name in (policies or POLICIES)
    }


def aggregates(result: Result) -> Mapping[str, Any]:
    """A result's aggregate figures, whether a :class:`SimResult` or already a mapping."""
    return result.aggregates() if isinstance(result, SimResult) else result


def _format(value: Any, how: str) -> str:
    if value is None:
        return "-"
    if how == "time":
        return f"{value / 60:.1f} min" if value < 2 * 3600 else f"{value / 3600:.2f} h"
    if how == "x":
        return f"{value:.2f}x"
    if how == "pct":
        return f"{100 * value:.0f}%"
    if how == "kwh":
        return f"{value:.2f} kWh" if value >= 1 else f"{value * 1000:.1f} Wh"
    return str(int(value))


def compare(results: Mapping[str, Result], title: str | None = None) -> Table:
    """A table of the policies' aggregates, one row each."""
    table = Table(title=title)
    table.add_column("policy")
    for _key, heading, _how in _COLUMNS:
        table.add_column(heading, justify="right")
    for name, result in results.items():
        figures = aggregates(result)
        table.add_row(name, *(_format(figures.get(key), how) for key, _, how in _COLUMNS))
    return table


def write_report(results: Mapping[str, Result], out_dir: str | Path, stem: str) -> tuple[Path, Path]:
    """``out_dir/stem.json`` (every result in full: a :class:`SimResult`'s ``to_dict()``, a
    mapping as it is) and ``out_dir/stem.png`` (makespan, mean and p95 JCT per policy, as
    grouped bars). Returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / f"{stem}.json", out / f"{stem}.png"
    payload = {
        name: r.to_dict() if isinstance(r, SimResult) else {"aggregates": dict(r)}
        for name, r in results.items()
    }
    json_path.write_text(json.dumps(payload, indent=1) + "\n")
    _plot(results, png_path, stem)
    return json_path, png_path


def _plot(results: Mapping[str, Result], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed (nor wanted, on a server)
    import matplotlib.pyplot as plt

    names = list(results)
    width = 0.8 / len(_PLOTTED)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(names) + 2), 4.0))
    longest = (
        max((aggregates(results[n]).get(k) or 0.0) for n in names for k, _ in _PLOTTED) if names else 0.0
    )
    unit, scale = (
        ("hours", 3600.0)
        if longest >= 2 * 3600
        else ("minutes", 60.0)
        if longest >= 120
        else ("seconds", 1.0)
    )
    for i, (key, label) in enumerate(_PLOTTED):
        hours = [(aggregates(results[n]).get(key) or 0.0) / scale for n in names]
        xs = [x + (i - (len(_PLOTTED) - 1) / 2) * width for x in range(len(names))]
        bars = ax.bar(xs, hours, width, label=label)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
