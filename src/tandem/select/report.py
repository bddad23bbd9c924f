"""When a selection pays: its cost against what the jobs that trained on it saved.

A job that trained on a selection of a fraction ``r`` of the data would have cost about
``cost / r`` on all of it, had it run as long per item (an estimate, labelled so), unless a
full-data run of the same job was measured: then that run is the baseline. The saving per
job is the baseline less the job's own cost; the selection pays for itself after
``selection cost / saving per job`` jobs, in time and in energy, each computed from what
was measured (energy measured and estimated are never added together).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from tandem.dirs import mlflow_store_uri
from tandem.select.store import Selection, uses
from tandem.watch.stores.mlflow_store import sqlite_path

SUMMARY = {
    "wall_s": "summary/duration_s",
    "cpu_s": "summary/cpu_seconds",
    "energy_measured_joules": "summary/energy_measured_joules",
    "energy_estimated_joules": "summary/energy_estimated_joules",
}


def run_costs(run_ids: list[str]) -> dict[str, dict[str, float]]:
    """``run id -> {wall_s, cpu_s, energy_*}`` from the runs' summaries in the SQLite store."""
    path = sqlite_path(mlflow_store_uri())
    if not run_ids or path is None:
        return {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return {}
    out: dict[str, dict[str, float]] = {}
    names = {v: k for k, v in SUMMARY.items()}
    marks = ", ".join("?" for _ in run_ids)
    try:
        rows = db.execute(
            f"SELECT run_uuid, key, value FROM latest_metrics WHERE run_uuid IN ({marks}) "
            f"AND key IN ({', '.join('?' for _ in names)})",
            (*run_ids, *names),
        ).fetchall()
    except sqlite3.Error:
        rows = []
    finally:
        db.close()
    for run, key, value in rows:
        out.setdefault(run, {})[names[key]] = value
    return out


def _break_even(cost: float | None, saving: float | None) -> float | str | None:
    """Jobs until the selection has paid for itself; ``"never"`` where a job saves nothing
    (JSON has no infinity); None where it is not known."""
    if cost is None or saving is None:
        return None
    return "never" if saving <= 0 else cost / saving


def report(
    sel: Selection, job_runs: list[str] | tuple[str, ...] = (), baseline_run: str | None = None
) -> dict[str, Any]:
    """The selection's cost, the measured costs of the jobs that trained on it (their MLflow
    runs: ``job_runs`` and those noted among its uses), the saving per job and the
    break-even count of jobs (in wall time, CPU time and energy)."""
    noted = [u["mlflow_run_id"] for u in uses(sel.id) if u.get("mlflow_run_id")]
    runs = list(dict.fromkeys([*job_runs, *noted]))
    costs = run_costs(runs + ([baseline_run] if baseline_run else []))
    jobs = [{"mlflow_run_id": r, "cost": costs.get(r, {})} for r in runs]
    measured = [j["cost"] for j in jobs if j["cost"]]
    ratio = sel.meta["size"] / sel.meta["dataset"]["length"]
    out: dict[str, Any] = {
        "id": sel.id,
        "method": sel.meta["method"],
        "size": sel.meta["size"],
        "ratio": ratio,
        "selection_cost": sel.meta["cost"],
        "jobs": jobs,
    }
    base = costs.get(baseline_run or "", {})
    out["baseline"] = "measured" if base else "estimated: a job's cost / the selected fraction"
    rows = {}
    for what in ("wall_s", "cpu_s", "energy_measured_joules", "energy_estimated_joules"):
        values = [c[what] for c in measured if what in c]
        job_cost = sum(values) / len(values) if values else None
        full = base.get(what) if base else (None if job_cost is None else job_cost / ratio)
        saving = None if job_cost is None or full is None else full - job_cost
        spent = sel.meta["cost"].get(what)
        rows[what] = {
            "selection": spent,
            "job_mean": job_cost,
            "full_data": full,
            "saving_per_job": saving,
            "break_even_jobs": _break_even(spent, saving),
        }
    out["break_even"] = rows
    return out
