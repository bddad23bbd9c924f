"""One report of a selection for every view: ``tandem select report``, ``select show`` and
the dashboard's group pages count the same jobs (every job of the shares that serve it,
of whatever group, and the runs noted among its uses) and give the same break-even.

The job manager's state, the selection and the MLflow summaries are written directly (no
daemon, no torch): what is tested is which jobs are counted and how they are shown."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tandem.cli.select import select_group
from tandem.place.model import JobSpec
from tandem.place.records import Attempt, AttemptPlacement
from tandem.place.state import State
from tandem.select.store import load, record_use, save
from tandem.share.spec import ShareSpec
from tandem.web.data import Reader

SEL_ID = "00112233aabbccdd"
# Each group's jobs cost differently: a page that averaged its own group's jobs alone would
# give another break-even than the selection's (all of them).
WALL = {"a": 12.0, "b": 40.0}
ENERGY = {"a": 100.0, "b": 900.0}
NOTED_RUN = "run-noted-by-a-user"


@dataclass
class Manager:
    state_dir: Path
    state: State
    started: dict[str, list[int]]  # group -> its jobs that ran
    waiting: int  # a job of the share that never started


STARTUP = {"a": 6.0, "b": None}  # seconds before a job's data flowed (b's runs read no share)


def _summary(
    db: sqlite3.Connection, run: str, wall: float, energy: float, startup: float | None = None
) -> None:
    figures = [
        ("summary/duration_s", wall),
        ("summary/cpu_seconds", 2 * wall),
        ("summary/energy_estimated_joules", energy),
    ]
    if startup is not None:
        figures.append(("summary/startup_seconds", startup))
    for key, value in figures:
        db.execute("INSERT INTO latest_metrics VALUES (?, ?, 0, 0, 0, ?)", (key, value, run))


@pytest.fixture
def manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Manager:
    state_dir = tmp_path / "state"
    monkeypatch.setenv("TANDEM_STATE_DIR", str(state_dir))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the state directory's mlflow.db
    meta = {
        "id": SEL_ID,
        "method": "random",
        "keep": "low",
        "budget": 0.3,
        "size": 30,
        "seed": 0,
        "balance": True,
        "params": {"warmup_epochs": 1, "widths": [8, 4]},
        "model": None,
        "dataset": {"fingerprint": "f" * 16, "length": 100, "version": None, "how": "all"},
        "cost": {"wall_s": 30.0, "cpu_s": 60.0, "energy_estimated_joules": 600.0, "mlflow_run_id": "sel-run"},
        "created": time.time(),
    }
    sel = save(SEL_ID, np.arange(30), np.zeros(100), meta)
    state = State(state_dir)
    state.define_share(ShareSpec("picked", "dataset", "tandem.bench.select_data:noisy", selection=SEL_ID))
    db = sqlite3.connect(state_dir / "mlflow.db")
    db.execute("CREATE TABLE latest_metrics (key, value, timestamp, step, is_nan, run_uuid)")
    started: dict[str, list[int]] = {}
    now = time.time()
    for group, count in (("a", 2), ("b", 2)):
        for i in range(count):
            ((job_id, _),) = state.add_jobs(
                [JobSpec(command=["true", group, str(i)], share="picked", group=group)], 0, now
            )
            state.start(Attempt(job_id, 1, "running", AttemptPlacement(), now), None, "test")
            state.finish(job_id, 1, "succeeded", {"ended": now, "exit_code": 0}, {"ended": now}, "test")
            run = f"run-{job_id}"
            state.update_job(job_id, mlflow_run_id=run)
            _summary(db, run, WALL[group], ENERGY[group], STARTUP[group])
            started.setdefault(group, []).append(job_id)
    ((waiting, _),) = state.add_jobs([JobSpec(command=["later"], share="picked", group="b")], 0, now)
    _summary(db, NOTED_RUN, 20.0, 300.0)  # a run outside the manager, noted among its uses
    db.commit()
    db.close()
    record_use(sel, {"role": "made-by-job", "job": 99})
    record_use(sel, {"role": "producer", "share": "picked", "pid": 4242, "job": None})
    record_use(load(SEL_ID), {"role": "trained", "mlflow_run_id": NOTED_RUN})
    return Manager(state_dir, state, started, waiting)


def _cli(*args: str) -> str:
    result = CliRunner().invoke(select_group, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_cli_and_every_group_page_give_the_same_break_even(manager: Manager) -> None:
    report = json.loads(_cli("report", SEL_ID, "--json"))
    reader = Reader(manager.state_dir, manager.state_dir / "mlflow.db")
    for group in ("a", "b"):  # the selection's jobs are in two groups: both pages, one answer
        (shown,) = reader.selections_of(reader.jobs(group=group)["jobs"])
        assert shown["id"] == SEL_ID and shown["share"] == "picked"
        assert shown["break_even"] == report["break_even"], group
        assert shown["jobs"] == report["jobs"], group
    counted = [j["job"] for j in report["jobs"]]
    assert counted == [*manager.started["a"], *manager.started["b"], None]  # the noted run last
    assert manager.waiting not in counted  # queued: it trained on nothing yet
    assert report["measured_jobs"] == 5
    wall = report["break_even"]["wall_s"]
    assert wall["job_mean"] == pytest.approx((2 * 12 + 2 * 40 + 20) / 5)
    # Start-up does not scale with the data: only the rest of a job's time is over the fraction.
    startup = (2 * 6.0) / 5  # group a's two runs; the others have no start-up figure (none)
    assert wall["job_startup_mean"] == pytest.approx(startup)
    assert wall["full_data"] == pytest.approx(startup + (wall["job_mean"] - startup) / 0.3)
    assert wall["break_even_jobs"] == pytest.approx(30 / (wall["full_data"] - wall["job_mean"]))
    assert report["break_even"]["cpu_s"]["job_startup_mean"] == 0.0  # no CPU start-up figure


def test_show_counts_the_jobs_report_counts_and_prints_no_dict(manager: Manager) -> None:
    report = json.loads(_cli("report", SEL_ID, "--json"))
    text = _cli("show", SEL_ID)
    assert "{'" not in text and '{"' not in text and "None" not in text, text
    assert f"jobs    {len(report['jobs'])} trained on it" in text, text
    assert "params warmup_epochs=1 widths=[8, 4]" in text
    assert "made by job 99" in text and "served by share picked's producer" in text
    assert f"MLflow run {NOTED_RUN}" in text and f"{manager.waiting} (queued)" in text
    assert time.strftime("%Y-%m-%d") in text  # when, in local time, not seconds since 1970
    said = _cli("report", SEL_ID)
    assert f"{len(report['jobs'])} job(s) trained on it" in said and "None" not in said
    shown = json.loads(_cli("show", SEL_ID, "--json"))
    assert [j["id"] for j in shown["jobs"]] == [j["job"] for j in report["jobs"]]
    assert [j["id"] for j in shown["not_run"]] == [manager.waiting]
    listed = _cli("ls")
    assert "{'" not in listed and "None" not in listed and SEL_ID in listed
