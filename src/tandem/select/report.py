"""When a selection pays: its cost against what the jobs that trained on it saved.

A job that trained on a selection of a fraction ``r`` of the data would have cost about
``startup + (cost - startup) / r`` on all of it, had it run as long per item (an estimate,
labelled so): its start-up (until its data first flowed: imports, the model, MLflow, as
tandem.watch measured it) does not grow with the data. Unless a full-data run of the same
job was measured: then that run is the baseline. The saving per
job is the baseline less the job's own cost; the selection pays for itself after
``selection cost / saving per job`` jobs, in time and in energy, each computed from what
was measured (energy measured and estimated are never added together).

The jobs that trained on a selection have one definition, :func:`jobs_of` (the job
manager's jobs of every share that serves it, and the runs noted among its uses), and
every view asks :func:`report_for`: ``tandem select report``, ``tandem select show`` and
the dashboard's group page count the same jobs and give the same break-even.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem.dirs import mlflow_store_uri
from tandem.select.store import Selection, uses
from tandem.watch.stores.mlflow_store import sqlite_path

if TYPE_CHECKING:  # select may read place's state; place never imports select
    from tandem.place import Job, StateReads

SUMMARY = {
    "wall_s": "summary/duration_s",
    "cpu_s": "summary/cpu_seconds",
    "energy_measured_joules": "summary/energy_measured_joules",
    "energy_estimated_joules": "summary/energy_estimated_joules",
}
# What a run spent before its data first flowed (tandem.watch's summary): it does not scale
# with the data, so the full-data estimate leaves it out of what it scales.
STARTUP = {
    "wall_s": "summary/startup_seconds",
    "cpu_s": "summary/startup_cpu_seconds",
    "energy_measured_joules": "summary/startup_energy_measured_joules",
    "energy_estimated_joules": "summary/startup_energy_estimated_joules",
}


def run_costs(run_ids: list[str], stores: list[str] | None = None) -> dict[str, dict[str, float]]:
    """``run id -> {wall_s, cpu_s, energy_*}`` from the runs' summaries in the SQLite stores
    ``stores`` (URIs; default: tandem's own, :func:`tandem.dirs.mlflow_store_uri`). A run is
    in one store: its id is a UUID, so the answers of several are merged."""
    paths = list(dict.fromkeys(p for p in map(sqlite_path, stores or [mlflow_store_uri()]) if p is not None))
    out: dict[str, dict[str, float]] = {}
    for path in paths if run_ids else ():
        for run, costs in _costs_in(path, run_ids).items():
            out.setdefault(run, {}).update(costs)
    return out


def _costs_in(path: Path, run_ids: list[str]) -> dict[str, dict[str, float]]:
    if not path.exists():  # no run was ever stored there
        return {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return {}
    out: dict[str, dict[str, float]] = {}
    names = {v: k for k, v in SUMMARY.items()} | {v: f"startup_{k}" for k, v in STARTUP.items()}
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


# --- the jobs that trained on a selection: one definition for every view ---------------------


def serving(state: StateReads | None, sel_id: str) -> list[str]:
    """The defined shares that serve the selection (given with ``--selection`` or made by
    their ``--select`` job: the state keeps which), by name."""
    return [] if state is None else sorted(s.name for s in state.shares() if s.selection == sel_id)


def manager_jobs(state: StateReads | None, sel_id: str) -> list[Job]:
    """Every job of the job manager's that reads the selection (of a share that serves it),
    in any state, by id: its training jobs, not the share's producer rows, which serve it."""
    from tandem.place import JOB_ROLE

    shares = serving(state, sel_id)
    found = [] if state is None or not shares else state.jobs(shares=tuple(shares))
    return [j for j in found if j.role == JOB_ROLE]


def jobs_of(sel_id: str, state: StateReads | None) -> list[dict[str, Any]]:
    """The jobs that trained on the selection: the manager's jobs of the shares that serve
    it that started (or have an MLflow run: the run is made as a job starts), then the
    runs noted among its uses that are none of those. Each is ``{job, state, share, group,
    mlflow_run_id}`` (a noted run: what its use says; ``job`` None where it names none).
    A job still waiting, or cancelled before it ran, trained on nothing: not counted."""
    out: list[dict[str, Any]] = []
    for j in manager_jobs(state, sel_id):
        if j.started is None and not j.mlflow_run_id:
            continue
        out.append(
            {
                "job": j.id,
                "state": j.state,
                "share": j.share,
                "group": j.group,
                "mlflow_run_id": j.mlflow_run_id,
            }
        )
    runs = {j["mlflow_run_id"] for j in out if j["mlflow_run_id"]}
    job_ids = {j["job"] for j in out}
    for u in uses(sel_id):
        run = u.get("mlflow_run_id")
        job = u.get("job")
        job = int(job) if isinstance(job, int) or (isinstance(job, str) and job.isdigit()) else None
        if not isinstance(run, str) or not run or run in runs or (job is not None and job in job_ids):
            continue  # not a run, or one of the manager's jobs above: counted once
        runs.add(run)
        out.append({"job": job, "state": None, "share": u.get("share"), "group": None, "mlflow_run_id": run})
    return out


def report_for(sel: Selection, state: StateReads | None, baseline_run: str | None = None) -> dict[str, Any]:
    """The report of ``sel`` (:func:`report`) over the jobs that trained on it
    (:func:`jobs_of`) in the job manager's ``state`` (None: it has none), their costs read
    from the store the manager's runs are in and from tandem's own: what ``tandem select
    report``, ``select show`` and the dashboard all show."""
    stores = [mlflow_store_uri()]
    if state is not None:
        from tandem.place import manager_store  # lazily: the CLI starts fast

        stores.insert(0, manager_store(state.dir))
    out = report(sel, jobs_of(sel.id, state), baseline_run, stores)
    out["shares"] = serving(state, sel.id)
    return out


def report(
    sel: Selection,
    jobs: list[dict[str, Any]],
    baseline_run: str | None = None,
    stores: list[str] | None = None,
) -> dict[str, Any]:
    """The selection's cost, the measured costs of the jobs that trained on it (``jobs``, as
    :func:`jobs_of` gives them: ask :func:`report_for`), the saving per job and the
    break-even count of jobs (in wall time, CPU time and energy)."""
    runs = [j["mlflow_run_id"] for j in jobs if j.get("mlflow_run_id")]
    costs = run_costs(runs + ([baseline_run] if baseline_run else []), stores)
    jobs = [{**j, "cost": costs.get(j["mlflow_run_id"], {}) if j.get("mlflow_run_id") else {}} for j in jobs]
    measured = [j["cost"] for j in jobs if j["cost"]]
    ratio = sel.meta["size"] / sel.meta["dataset"]["length"]
    out: dict[str, Any] = {
        "id": sel.id,
        "method": sel.meta["method"],
        "size": sel.meta["size"],
        "ratio": ratio,
        "selection_cost": sel.meta["cost"],
        "jobs": jobs,
        "measured_jobs": len(measured),  # those whose run has a summary (ended and measured)
    }
    base = costs.get(baseline_run or "", {})
    out["baseline"] = (
        "measured"
        if base
        else "estimated: a job's start-up, plus the rest of its cost / the selected fraction"
    )
    rows = {}
    for what in ("wall_s", "cpu_s", "energy_measured_joules", "energy_estimated_joules"):
        values = [c[what] for c in measured if what in c]
        job_cost = sum(values) / len(values) if values else None
        # Start-up (imports, the model, MLflow) is not read data: a run on all of it would
        # spend it once too. A run with no start-up figure (no share read) counts none.
        startups = [min(c.get(f"startup_{what}", 0.0), c[what]) for c in measured if what in c]
        startup = sum(startups) / len(startups) if startups else 0.0
        full = (
            base.get(what) if base else (None if job_cost is None else startup + (job_cost - startup) / ratio)
        )
        saving = None if job_cost is None or full is None else full - job_cost
        spent = sel.meta["cost"].get(what)
        rows[what] = {
            "selection": spent,
            "job_mean": job_cost,
            "job_startup_mean": startup if values else None,
            "full_data": full,
            "saving_per_job": saving,
            "break_even_jobs": _break_even(spent, saving),
        }
    out["break_even"] = rows
    return out
