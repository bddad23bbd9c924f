"""A sweep's report (``tandem report group:G``, ``--json``, ``--best``; the dashboard's group
page from the same computation): a real daemon, a share's producer, jobs of one ``--grid``
that log their own metric with MLflow into the run tandem made, and one job of the same
key that loaded for itself, so that sharing's saving is measured for it and estimated for
the others."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.place.conftest import Cli
from tests.place.test_daemon import DATASET
from tests.timing import scaled, until

pytestmark = pytest.mark.warm  # Python jobs start warm, as a user's do

# Reads its epoch from the share where it has one, else from the dataset itself (a job
# loading for itself); logs a loss that depends on its --lr, so the best is known.
TRAIN = """\
import os, sys
import mlflow
lr = float(sys.argv[1])
if os.environ.get("TANDEM_SHARE"):
    from tandem.share import Consumer
    with Consumer.from_env(batch_size=8) as c:
        n = sum(int(b.shape[0]) for b in c)
else:
    from torch.utils.data import DataLoader
    from toy_data import make
    n = sum(int(b.shape[0]) for b in DataLoader(make(), batch_size=8))
assert n == 64, n
mlflow.log_metric("val_loss", abs(lr - 0.01) + 0.1)
"""


def _ended(cli: Cli, ids: list[int]) -> None:
    assert cli("wait", *map(str, ids), timeout=240).returncode == 0, cli("ls").stdout


def _report(cli: Cli, *args: str) -> dict:
    out = cli("report", "group:sweep", "--json", *args)
    (sweep,) = json.loads(out.stdout)["groups"]
    return sweep


def _computed(cli: Cli) -> dict:
    """The group's report as ``tandem report group:sweep --json`` computes it, here in this
    process (the CLI loads every run with MLflow: seconds of a core for each poll)."""
    from tandem.place.state import StateReader
    from tandem.place.sweep_report import group_report
    from tandem.place.views import strict_json

    state = StateReader(cli.state)
    try:
        report = group_report(state, "sweep", cli.state / "mlflow.db")
    finally:
        state.close()
    assert report is not None
    return json.loads(strict_json(report))  # as the CLI prints it: a NaN is null


def _written(cli: Cli, ids: list[int]) -> None:
    """Until the manager's MLflow helper has written every job's run whole (summary, metric),
    and its producers' (a producer ends after its group's last job: its run a moment later)."""
    deadline = time.monotonic() + scaled(90)
    while True:
        report = _computed(cli)
        rows = {r["id"]: r for r in report["jobs"]}
        jobs_written = all(
            rows[i]["cpu_s"] is not None and "val_loss" in rows[i]["metrics"] for i in ids if i in rows
        )
        if jobs_written and all(p["cpu_s"] is not None for p in report["producers"]):
            return
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)


def _settled(cli: Cli) -> None:
    """Until the MLflow helper has written the runs whole: two reports a second apart agree."""
    deadline = time.monotonic() + scaled(90)
    last = None
    while (now := _computed(cli)) != last or any(r["energy_estimated_joules"] is None for r in now["jobs"]):
        assert time.monotonic() < deadline, now
        last = now
        time.sleep(1.0)


def test_the_sweep_report_rows_best_producer_totals_and_saving(cli: Cli) -> None:
    (cli.tmp / "toy_data.py").write_text(DATASET)
    (cli.tmp / "train.py").write_text(TRAIN)
    cli("daemon", "start", "--cpus", "2", "--no-host-load", "--settle", "0.3", "--grace", "1")
    cli("share", "define", "toy", "--dataset", "toy_data.py:make", "--batch-size", "4")
    # A job that loaded for itself: the same key (its name) as the sweep's first point.
    private = cli.submit("--name", "r-0.1", "--", sys.executable, "train.py", "0.1")
    _ended(cli, [private])
    out = cli(
        "submit", "--share", "toy", "--group", "sweep", "--grid", "lr=0.1,0.01,0.001", "--name", "r-{lr}",
        "--json", "--", sys.executable, "train.py", "{lr}",
    )  # fmt: skip
    ids = json.loads(out.stdout)["ids"]
    # While the sweep runs its report is partial, and says so first.
    early = _computed(cli)
    going = sum(r["state"] not in ("succeeded", "failed", "cancelled", "pruned") for r in early["jobs"])
    assert (early["partial"] or {}).get("jobs", 0) == going, (early["partial"], early["jobs"])
    if going:
        assert early["said"][0].startswith(f"PARTIAL: {going} of 3 job(s)"), early["said"]
    _ended(cli, ids)
    _written(cli, ids)
    sweep = _report(cli, "--best", "val_loss:min")
    # Its jobs have ended; their producer may serve on a while for the next (its linger).
    partial = sweep["partial"]
    assert partial is None or (partial["jobs"], partial["producers"]) == (0, 1), partial
    if partial:
        assert sweep["said"].pop(0).startswith("PARTIAL: 1 producer(s) still running"), sweep["said"]
    rows = {r["id"]: r for r in sweep["jobs"]}
    assert sorted(rows) == ids
    assert [rows[i]["params"] for i in ids] == [{"lr": "0.1"}, {"lr": "0.01"}, {"lr": "0.001"}]
    assert all(r["state"] == "succeeded" and r["run_s"] > 0 and r["cpu_s"] > 0 for r in rows.values())
    assert {r["where"] for r in rows.values()} == {"cpu"}  # where each ran (node/cuda:i on Ray)
    assert sweep["metric_keys"] == ["val_loss"]  # the training's own; system/ and summary/ are not
    assert sweep["best"]["job"] == ids[1] and abs(sweep["best"]["value"] - 0.1) < 1e-9
    # The producer that fed them, charged to this group (it fed only these three).
    (producer,) = sweep["producers"]
    assert producer["share"] == "toy" and producer["fed_jobs"] == producer["group_jobs"] == 3
    assert producer["cpu_s"] > 0 and producer["charged"]["cpu_s"] == producer["cpu_s"]
    totals = sweep["totals"]
    jobs_cpu = sum(r["cpu_s"] for r in rows.values())
    assert abs(totals["cpu_s"] - (jobs_cpu + producer["cpu_s"])) < 1e-6  # the producer is counted
    assert totals["states"] == {"succeeded": 3}
    # The wall time apart from any sum: first submission to last end, below the summed run times.
    first = min(cli.job(i)["submitted"] for i in ids)
    last = max(cli.job(i)["ended"] for i in ids)
    assert abs(totals["makespan_s"] - (last - first)) < 1e-6 and totals["makespan_s"] > 0
    assert sweep["said"][0].startswith(
        f"makespan {totals['makespan_s']:,.1f} s, first submission to last end"
    )
    assert f"+ producers {producer['cpu_s']:,.1f}" in sweep["said"][0]
    # Saving: measured for the job whose key ran privately, estimated (and said so) for the others.
    saving = sweep["saving"]
    bases = {e["job"]: e["basis"] for e in saving["jobs"]}
    assert bases[ids[0]] == "measured" and all(bases[i].startswith("estimated") for i in ids[1:])
    assert saving["basis"] == "measured for 1 job(s), estimated for 2" and "ESTIMATED" in saving["note"]
    measured = next(e for e in saving["jobs"] if e["job"] == ids[0])
    private_cpu = cli.job(private)["attempts"][0]["cpu_seconds"]
    assert abs(measured["alone"]["cpu_s"] - private_cpu) < 1e-6
    # The run tandem made carries the job's point as MLflow params.
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{cli.state / 'mlflow.db'}"
    # The helper writes a run's params as it closes it, a moment after the job's end.
    client = MlflowClient(store)
    run = until(
        lambda: (r := client.get_run(rows[ids[1]]["mlflow_run_id"])).data.params and r,
        60,
        "job 2's run never got its params",
        every=0.5,
    )
    assert run.data.params == {"lr": "0.01"}
    # The table as a person reads it: the point, the metric, the producer, the best and the saving.
    text = cli("report", "group:sweep", "--best", "val_loss:min", "-o", str(cli.tmp / "r.png")).stdout
    assert "lr=0.01" in text and "producer" in text and f"best by val_loss (min): job {ids[1]}" in text
    assert "sharing saved" in text and "ESTIMATED" in text and "makespan" in text and "run s summed" in text
    assert "None" not in text and "{'" not in text
    bad = cli("report", "group:sweep", "--best", "val_loss:lowest", check=False)
    assert bad.returncode == 2 and "KEY:min or KEY:max" in bad.stderr


def test_the_dashboard_group_page_shows_the_cli_report(cli: Cli, tmp_path: Path) -> None:
    """One computation: /api/groups/NAME's report is the CLI's, number for number."""
    from tandem.place.state import State
    from tandem.place.sweep_report import group_report
    from tandem.web.app import build

    cli("daemon", "start", "--cpus", "2", "--settle", "0.3", "--grace", "1")
    grid = ["--group", "sweep", "--grid", "n=1,2", "--json"]
    out = cli("submit", *grid, "--", sys.executable, "-c", "print({n})")
    _ended(cli, json.loads(out.stdout)["ids"])
    _settled(cli)
    from starlette.testclient import TestClient

    app = build(cli.state, cli.state / "mlflow.db", "t0ken", frozenset({"testserver"}), 4)
    with TestClient(app) as client:
        page = client.get("/api/groups/sweep", headers={"Authorization": "Bearer t0ken"}).json()
    state = State(cli.state)
    try:
        expected = group_report(state, "sweep", cli.state / "mlflow.db")
    finally:
        state.close()
    assert page["report"] == json.loads(json.dumps(expected))
    assert [r["params"] for r in page["report"]["jobs"]] == [{"n": "1"}, {"n": "2"}]
    cli_report = _report(cli)
    for key in ("jobs", "totals", "producers", "said"):
        assert cli_report[key] == page["report"][key], key
