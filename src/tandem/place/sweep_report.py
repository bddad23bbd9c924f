"""A sweep's report: what ``tandem report group:G`` (its table and ``--json``) and the
dashboard's group page show, computed here once for both.

- One row per job of the group: its parameters, state, run time, CPU-seconds, energy
  (measured and estimated kept apart, never added) and the last value of each metric the
  training logged into its run (``metrics``: exact keys or regular expressions; default:
  every key outside ``system/`` and ``summary/``).
- The best job by one metric (``best="val_loss:min"``).
- The producers that fed the group (the MLflow runs of its shares' producers, tagged
  ``tandem.role=producer``), each charged to the group for the share of the jobs it fed
  that are the group's, and the group's totals with them.
- What sharing saved against each job loading for itself: *measured* where a job of the
  same job key ran without a share and succeeded (its cost is the job's cost had it loaded
  privately), otherwise *estimated*: each job would have repeated the producer's loading
  for the samples it read (its consumer's ``samples`` against the producer's), labelled so.

CPU-seconds come from the manager's own count of each attempt's process tree where the
attempt has ended, else from the run's latest process-tree metrics. Metrics are read from
the manager's MLflow store, read-only, through its SQLite tables (one query per kind of
row): no MLflow import, so the dashboard answers in milliseconds.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tandem.place.model import FINAL_STATES, PRODUCER_ROLE, PRUNED, params_text
from tandem.place.records import Job
from tandem.place.views import run_seconds
from tandem.watch.report import energy_totals
from tandem.watch.samplers.share import metric_name

ENERGY_KINDS = ("measured", "estimated")
_HIDDEN = re.compile(r"^(system|summary)/")  # hardware and summaries: not the training's own
_SAMPLES = re.compile(r"^system/share/.+/consumer_\d+/samples$")
PRODUCED = "system/share/{share}/producer/published_batches"


class ReportError(ValueError):
    """A report asked for with something that cannot be (a malformed --best)."""


def parse_best(text: str | None) -> tuple[str, str] | None:
    """``"val_loss:min"`` -> ``("val_loss", "min")``; a key alone means ``min``."""
    if not text:
        return None
    key, sep, goal = text.rpartition(":")
    if not sep:
        key, goal = text, "min"
    if not key or goal not in ("min", "max"):
        raise ReportError(f"--best {text!r}: give KEY:min or KEY:max, e.g. --best val_loss:min")
    return key, goal


@contextmanager
def _runs_db(path: Path | None) -> Iterator[sqlite3.Connection | None]:
    if path is None or not path.is_file():
        yield None
        return
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        yield db
    finally:
        db.close()


def _in(values: Sequence[str]) -> str:
    return ", ".join("?" for _ in values)


def _latest(db: sqlite3.Connection | None, run_ids: list[str]) -> dict[str, dict[str, float]]:
    """``run id -> {key: latest value}``."""
    out: dict[str, dict[str, float]] = {r: {} for r in run_ids}
    if db is None or not run_ids:
        return out
    for i in range(0, len(run_ids), 500):
        chunk = run_ids[i : i + 500]
        # A NaN (a diverged loss) is no value: MLflow keeps it as 0 with is_nan set, and a 0
        # would be the best of a sweep minimising its loss.
        sql = (
            f"SELECT run_uuid, key, value FROM latest_metrics WHERE run_uuid IN ({_in(chunk)}) AND NOT is_nan"
        )
        try:
            for run, key, value in db.execute(sql, chunk):
                out[run][key] = value
        except sqlite3.Error:  # not (yet) an MLflow store
            return out
    return out


def _producer_runs(
    db: sqlite3.Connection | None, shares: list[str]
) -> list[tuple[str, str, float, float | None]]:
    """``(run id, share, start s, end s or None)`` of every producer run of these shares."""
    if db is None or not shares:
        return []
    sql = (
        "SELECT r.run_uuid, s.value, r.start_time, r.end_time FROM runs r "
        "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'tandem.role' AND t.value = 'producer' "
        f"JOIN tags s ON s.run_uuid = r.run_uuid AND s.key = 'tandem.share' AND s.value IN ({_in(shares)}) "
        "WHERE r.lifecycle_stage = 'active' ORDER BY r.start_time"
    )
    try:
        rows = db.execute(sql, shares).fetchall()
    except sqlite3.Error:
        return []
    return [(run, share, start / 1000.0, end / 1000.0 if end else None) for run, share, start, end in rows]


def _tree_cpu(last: dict[str, float]) -> float | None:
    """CPU-seconds of a run's process tree as its latest metrics say, if they say."""
    tree = "system/process_tree/"
    if tree + "cpu_user_seconds" not in last:
        return None
    return last[tree + "cpu_user_seconds"] + last.get(tree + "cpu_system_seconds", 0.0)


def energy_by_kind(last: dict[str, float]) -> dict[str, float]:
    """A run's energy in joules by kind (``measured``, ``estimated``; never added), from its
    latest metrics, as watch sums it for a run's summary."""
    totals = energy_totals(last)
    return {k: totals[f"energy_{k}_joules"] for k in ENERGY_KINDS if f"energy_{k}_joules" in totals}


def _cost(job: Job, latest: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """A job's CPU-seconds and energy over its attempts."""
    cpu: float | None = None
    energy: dict[str, float] = {}
    for a in job.attempts:
        last = latest.get(a.mlflow_run_id or "", {})
        used = a.cpu_seconds if a.cpu_seconds is not None else _tree_cpu(last)
        if used is not None:
            cpu = (cpu or 0.0) + used
        for kind, value in energy_by_kind(last).items():
            energy[kind] = energy.get(kind, 0.0) + value
    return {"cpu_s": cpu, **{f"energy_{k}_joules": energy.get(k) for k in ENERGY_KINDS}}


def _picked(keys: set[str], metrics: Sequence[str]) -> list[str]:
    if not metrics:
        return own_metrics(keys)
    out: list[str] = []
    for m in metrics:
        found = [m] if m in keys else sorted(k for k in keys if re.fullmatch(m, k))
        out += [k for k in found if k not in out]
    return out


def _add(into: dict[str, float | None], key: str, value: float | None) -> None:
    if value is not None:
        into[key] = (into.get(key) or 0.0) + value


def group_report(
    state: Any, group: str, runs_db: Path | None, metrics: Sequence[str] = (), best: str | None = None
) -> dict[str, Any] | None:
    """The report of the manager's group ``group`` (None where it has no job): see the module
    docstring. ``state``: a :class:`tandem.place.state.State`; ``runs_db``: the manager's
    MLflow store's SQLite file (None: no metrics, CPU-seconds from the manager alone)."""
    # A share's producer (a job row of its own) is counted as what fed the group, not a point.
    rows_of_group: list[Job] = state.jobs(group=group, attempts=True)
    jobs = [j for j in rows_of_group if j.role != PRODUCER_ROLE]
    if not jobs:
        return None
    # Best by what was asked, else by the metric its --prune rule judged by.
    goal = parse_best(best) or parse_best(next((j.metric for j in jobs if j.metric), None))
    with _runs_db(runs_db) as db:
        runs = [a.mlflow_run_id for j in jobs for a in j.attempts if a.mlflow_run_id]
        # Its producers' shares too: a drop-in loader's (auto) is read by jobs that do not say so.
        shares = sorted({j.share for j in rows_of_group if j.share})
        producer_runs = _producer_runs(db, shares)
        private = state.private_runs(sorted({j.job_key for j in jobs if j.share}))
        private_runs = [a.mlflow_run_id for j in private.values() for a in j.attempts if a.mlflow_run_id]
        latest = _latest(db, runs + [r for r, *_ in producer_runs] + private_runs)
        fed = _fed(state, producer_runs)
        batch_sizes = {s.name: s.spec.batch_size for s in state.shares() if s.name in shares}
    rows = [_row(j, latest) for j in jobs]
    keys = _picked({k for r in rows for k in r.pop("all_metrics")}, metrics)
    for r in rows:
        r["metrics"] = {k: r["metrics"][k] for k in keys if k in r["metrics"]}
    producers = [_producer(p, latest, fed, jobs) for p in producer_runs]
    producers = [p for p in producers if p["group_jobs"]]
    out = {
        "group": group,
        "partial": _partial(jobs, rows_of_group),
        "jobs": rows,
        "metric_keys": keys,
        "best": _best([r for r in rows if r["state"] != PRUNED] or rows, goal),  # of those run to their end
        "pruned": _pruned(jobs),
        "producers": producers,
        "totals": _totals(rows, producers, jobs),
        "saving": _saving(jobs, rows, producers, private, latest, batch_sizes),
    }
    out["said"] = said(out)
    return out


def _partial(jobs: list[Job], rows_of_group: list[Job]) -> dict[str, int] | None:
    """What still runs (or waits) while the report is made: its figures are those so far and
    grow until these end (None: every job and producer of the group has ended)."""
    jobs_on = sum(j.state not in FINAL_STATES for j in jobs)
    producers_on = sum(j.role == PRODUCER_ROLE and j.state not in FINAL_STATES for j in rows_of_group)
    if not jobs_on and not producers_on:
        return None
    return {"jobs": jobs_on, "of_jobs": len(jobs), "producers": producers_on}


def _row(job: Job, latest: dict[str, dict[str, float]]) -> dict[str, Any]:
    last_run = next((a.mlflow_run_id for a in reversed(job.attempts) if a.mlflow_run_id), None)
    values = latest.get(last_run or "", {})
    samples = [v for k, v in values.items() if _SAMPLES.match(k)]
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "where": job.attempts[-1].placement.where if job.attempts else None,  # node/cuda:i on Ray
        "share": job.share,
        "params": job.params,
        "run_s": run_seconds(job),
        "pruned_rung": job.pruned_rung,
        **_cost(job, latest),
        "samples_read": sum(samples) if samples else None,
        "mlflow_run_id": last_run,
        "metrics": {k: v for k, v in values.items() if not _HIDDEN.match(k)},
        "all_metrics": set(values),
    }


def _pruned(jobs: list[Job]) -> dict[str, Any] | None:
    """What the group's --prune rule stopped, by rung (None: it has no rule)."""
    ruled = [j for j in jobs if j.prune is not None]
    if not ruled:
        return None
    by_rung: dict[int, list[int]] = {}
    for j in ruled:
        if j.state == PRUNED and j.pruned_rung is not None:
            by_rung.setdefault(j.pruned_rung, []).append(j.id)
    return {
        "rule": f"{ruled[0].prune} by {ruled[0].metric}",
        "trials": len(ruled),
        "count": sum(map(len, by_rung.values())),
        "by_rung": {str(r): ids for r, ids in sorted(by_rung.items())},
    }


def _best(rows: list[dict[str, Any]], goal: tuple[str, str] | None) -> dict[str, Any] | None:
    if goal is None:
        return None
    key, how = goal
    have = [r for r in rows if key in r["metrics"]]
    if not have:
        return {"metric": key, "goal": how, "job": None, "value": None}
    pick = (min if how == "min" else max)(have, key=lambda r: r["metrics"][key])
    return {
        "metric": key,
        "goal": how,
        "job": pick["id"],
        "value": pick["metrics"][key],
        "params": pick["params"],
    }


def _fed(state: Any, producer_runs: list[tuple[str, str, float, float | None]]) -> dict[str, list[int]]:
    """``producer run -> the ids of the jobs (of any group) that ran while it served``."""
    out: dict[str, list[int]] = {}
    by_share: dict[str, list[Job]] = {}
    for run, share, start, end in producer_runs:
        if share not in by_share:
            by_share[share] = [
                j for j in state.jobs(shares=(share,), attempts=True) if j.role != PRODUCER_ROLE
            ]
        out[run] = [
            j.id
            for j in by_share[share]
            if any(
                a.started <= (end or float("inf")) and (a.ended or float("inf")) >= start for a in j.attempts
            )
        ]
    return out


def _producer(
    p: tuple[str, str, float, float | None],
    latest: dict[str, dict[str, float]],
    fed: dict[str, list[int]],
    jobs: list[Job],
) -> dict[str, Any]:
    run, share, start, end = p
    last = latest.get(run, {})
    ids = {j.id for j in jobs}
    fed_ids = fed.get(run, [])
    group_jobs = [i for i in fed_ids if i in ids]
    energy = energy_by_kind(last)
    cost = {
        "cpu_s": last["summary/cpu_seconds"] if "summary/cpu_seconds" in last else _tree_cpu(last),
        **{f"energy_{k}_joules": energy.get(k) for k in ENERGY_KINDS},
    }
    part = len(group_jobs) / len(fed_ids) if fed_ids else 0.0
    produced = last.get(PRODUCED.format(share=metric_name(share)))
    return {
        "share": share,
        "mlflow_run_id": run,
        "run_s": last.get("summary/duration_s") or ((end or time.time()) - start),
        **cost,
        "fed_jobs": len(fed_ids),
        "group_jobs": len(group_jobs),
        "charged": {k: (None if v is None else v * part) for k, v in cost.items()},
        "published_batches": produced,
    }


def _totals(rows: list[dict[str, Any]], producers: list[dict[str, Any]], jobs: list[Job]) -> dict[str, Any]:
    """The group's counts and sums, and its makespan apart: from its first submission to its
    last job's end (None while a job has not ended), the wall time the sweep took, which no
    sum of run times is."""
    out: dict[str, Any] = {"jobs": len(rows), "states": dict(Counter(r["state"] for r in rows))}
    ends = [j.ended for j in jobs if j.state in FINAL_STATES and j.ended is not None]
    out["makespan_s"] = max(ends) - min(j.submitted for j in jobs) if len(ends) == len(jobs) else None
    for what in ("run_s", "cpu_s", "energy_measured_joules", "energy_estimated_joules"):
        jobs_sum: dict[str, float | None] = {}
        for r in rows:
            _add(jobs_sum, what, r[what])
        out[f"jobs_{what}"] = jobs_sum.get(what)
        if what == "run_s":
            continue
        prod: dict[str, float | None] = {}
        for p in producers:
            _add(prod, what, p["charged"][what])
        out[f"producers_{what}"] = prod.get(what)
        both = [v for v in (jobs_sum.get(what), prod.get(what)) if v is not None]
        out[what] = sum(both) if both else None
    return out


COSTS = ("cpu_s", "energy_measured_joules", "energy_estimated_joules")


def _saving(
    jobs: list[Job],
    rows: list[dict[str, Any]],
    producers: list[dict[str, Any]],
    private: dict[str, Job],
    latest: dict[str, dict[str, float]],
    batch_sizes: dict[str, int],
) -> dict[str, Any] | None:
    """Against each job loading for itself: the cost had each loaded privately less the cost
    with sharing (the jobs' own and the producers' part), per cost kind."""
    readers = [(j, r) for j, r in zip(jobs, rows) if j.share]
    if not readers or not producers:
        return None
    by_share: dict[str, dict[str, Any]] = {}
    s: dict[str, Any] | None  # a share's sums (None below: a share no producer's figures came for)
    for p in producers:
        s = by_share.setdefault(p["share"], {"charged": {}, "cost": {}, "run_s": 0.0, "batches": 0.0})
        for k in COSTS:
            _add(s["charged"], k, p["charged"][k])
            _add(s["cost"], k, p[k])
        s["run_s"] += p["run_s"] or 0.0
        s["batches"] += p["published_batches"] or 0.0
    n = Counter(j.share for j, _ in readers)
    per_job: list[dict[str, Any]] = []
    bases: Counter[str] = Counter()
    for job, row in readers:
        s = by_share.get(job.share or "")
        if s is None:
            continue
        mine = {k: None if s["charged"].get(k) is None else s["charged"][k] / n[job.share] for k in COSTS}
        twin = private.get(job.job_key)
        if twin is not None:
            basis, alone = "measured", _cost(twin, latest)
        else:
            produced = s["batches"] * batch_sizes.get(job.share or "", 0)
            if row["samples_read"] and produced:
                part, how = min(1.0, row["samples_read"] / produced), "samples read"
            else:
                part, how = min(1.0, (row["run_s"] or 0.0) / s["run_s"]) if s["run_s"] else 1.0, "time read"
            basis = f"estimated ({how})"
            alone = {
                k: None if row[k] is None or s["cost"].get(k) is None else row[k] + s["cost"][k] * part
                for k in COSTS
            }
        bases[basis.split(" ")[0]] += 1
        saved = {
            k: None if alone[k] is None or row[k] is None or mine[k] is None else alone[k] - row[k] - mine[k]
            for k in COSTS
        }
        shared = {k: None if row[k] is None or mine[k] is None else row[k] + mine[k] for k in COSTS}
        per_job.append({"job": job.id, "basis": basis, "alone": alone, "shared": shared, "saved": saved})
    totals: dict[str, Any] = {}
    for what in ("alone", "shared", "saved"):
        sums: dict[str, float | None] = {}
        for entry in per_job:
            for k in COSTS:
                _add(sums, k, entry[what][k])
        totals[what] = {k: sums.get(k) for k in COSTS}
    basis = (
        "measured"
        if not bases["estimated"]
        else "estimated"
        if not bases["measured"]
        else f"measured for {bases['measured']} job(s), estimated for {bases['estimated']}"
    )
    note = {
        "measured": "measured against a run of the same job (same name, else command) without a share",
        "estimated": "ESTIMATED: each job loading for itself would repeat the producer's work for the "
        "samples it read (no run of these jobs without a share to measure against)",
    }.get(
        basis,
        f"{basis}: measured against a run of the same job without a share where one succeeded, "
        "otherwise ESTIMATED from the producer's cost for the samples each job read",
    )
    return {"basis": basis, "note": note, "jobs": per_job, **totals}


def _totals_said(t: dict[str, Any]) -> str:
    """The wall time and the sums apart: makespan, the jobs' run times summed, the CPU-s."""
    span = f"{t['makespan_s']:,.1f} s" if t.get("makespan_s") is not None else "- (a job has not ended)"
    line = f"makespan {span}, first submission to last end; the jobs ran {_num(t['jobs_run_s'])} s summed"
    line += f"; CPU-s {_num(t['cpu_s'])}"
    if t.get("producers_cpu_s") is not None:
        line += f": jobs {_num(t['jobs_cpu_s'])} + producers {_num(t['producers_cpu_s'])}"
    return line


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def said(report: dict[str, Any]) -> list[str]:
    """The best job and what sharing saved, in words (the CLI and the dashboard print these)."""
    out = [_totals_said(report["totals"])]
    partial = report.get("partial")
    if partial is not None:
        still = [f"{partial['jobs']} of {partial['of_jobs']} job(s)"] if partial["jobs"] else []
        still += [f"{partial['producers']} producer(s)"] if partial["producers"] else []
        out.insert(
            0,
            f"PARTIAL: {' and '.join(still)} still running or waiting: the figures are those so far "
            "(the sums, the saving and the best grow or change until they end; no makespan yet)",
        )
    best = report["best"]
    if best is not None:
        if best["job"] is None:
            out.append(f"best by {best['metric']} ({best['goal']}): no job logged {best['metric']}")
        else:
            params = params_text(best["params"])
            out.append(
                f"best by {best['metric']} ({best['goal']}): job {best['job']}, {best['value']:.4g}"
                + (f" ({params})" if params else "")
            )
    pruned = report["pruned"]
    if pruned is not None:
        where = "; ".join(
            f"at rung {rung}: job{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"
            for rung, ids in pruned["by_rung"].items()
        )
        out.append(
            f"pruned {pruned['count']} of {pruned['trials']} trials early ({pruned['rule']})"
            + (f": {where}" if where else "")
        )
    s = report["saving"]
    if s is None:
        if not report["producers"]:
            out.append("sharing: no producer run found for these jobs (no share, or not tracked)")
        return out
    alone, shared, saved = s["alone"], s["shared"], s["saved"]
    line = f"sharing saved {_num(saved['cpu_s'])} CPU-s against each job loading for itself"
    if alone["cpu_s"] is not None and shared["cpu_s"] is not None:
        line += f" ({_num(shared['cpu_s'])} with sharing, {_num(alone['cpu_s'])} alone)"
    energy = [
        f"{saved[k]:,.0f} J {what}"
        for k, what in (("energy_measured_joules", "measured"), ("energy_estimated_joules", "estimated"))
        if saved[k] is not None
    ]
    if energy:
        line += "; energy " + ", ".join(energy)
    out.append(f"{line}: {s['note']}")
    return out


def own_metrics(keys: Iterable[str]) -> list[str]:
    """The keys a job logged itself (loss, accuracy), sorted: none of the hardware series and
    summaries tandem.watch logs (``system/``, ``summary/``). The dashboard's job page charts these."""
    return sorted(k for k in keys if not _HIDDEN.match(k))
