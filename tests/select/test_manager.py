"""A share group whose selection the job manager makes once: ``share define --select``
queues the selection as a job of its own, the group's jobs wait for it, and its producer
serves only the selected items to each of them."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

from tests.place.conftest import cli  # noqa: F401 (the fixture)
from tests.web.conftest import Dashboard, dashboard, wait_for  # noqa: F401 (the fixture)
from tests.web.test_api import _json

ROOT = Path(__file__).resolve().parents[2]
READER = (
    "import os, sys\n"
    "from tandem.share import Consumer\n"
    "c = Consumer.from_env(batch_size=50)\n"
    "n = sum(len(b[1]) for b in c)\n"
    "with open(sys.argv[1], 'a') as f:\n"
    "    f.write(f\"{os.environ['TANDEM_JOB_ID']} {n}\\n\")\n"
    "c.close()\n"
)


def test_share_define_select_makes_the_selection_once_and_the_group_trains_on_it(
    dashboard: Dashboard,  # noqa: F811 (a daemon, and the dashboard of its state)
) -> None:
    cli = dashboard.cli  # noqa: F811
    tmp_path = cli.tmp
    cli.env["PYTHONPATH"] = str(ROOT)
    (tmp_path / "reader.py").write_text(READER)
    data, model = "tandem.bench.select_data:noisy", "tandem.bench.select_data:mlp"
    out = cli("share", "define", "picked", "--dataset", data, "--select", "small-loss:0.3",
              "--select-model", model, "--batch-size", "50", "--shuffle")  # fmt: skip
    select_job = int(out.stderr.split("made once by job ")[1].split()[0])
    results = tmp_path / "seen.txt"
    args = [
        "--cpus",
        "0.5",
        "--share",
        "picked",
        "--group",
        "sweep",
        "--",
        sys.executable,
        "reader.py",
        str(results),
    ]
    jobs = [cli.submit(*args) for _ in range(2)]
    for job in jobs:
        assert select_job in cli.job(job)["after"]  # the group waits for its selection
    assert cli("wait", *map(str, jobs), timeout=240).returncode == 0, cli("logs", str(jobs[0])).stdout
    assert cli.job(select_job)["state"] == "succeeded"
    seen = [line.split() for line in results.read_text().splitlines()]
    assert sorted(int(j) for j, _ in seen) == sorted(jobs) and all(int(n) == 450 for _, n in seen)
    (stored,) = json.loads(cli("select", "ls", "--json").stdout)  # made once, by the job
    shown = json.loads(cli("select", "show", stored["id"], "--json").stdout)
    assert shown["method"] == "small-loss" and any(u.get("share") == "picked" for u in shown["uses"])
    assert [u["job"] for u in shown["uses"] if u.get("role") == "made-by-job"] == [select_job]
    assert sorted(j["id"] for j in shown["jobs"]) == sorted(jobs)  # the jobs that reused it
    from tandem.place.state import State

    share = State(cli.state).share("picked")  # the daemon wrote it when the selection job succeeded
    assert share is not None and share.selection == stored["id"]
    for job in jobs:  # each job says what it trained on, in show and as a tag of its MLflow run
        assert cli.job(job)["selection"] == stored["id"]
    db = sqlite3.connect(cli.state / "mlflow.db")
    tagged = "SELECT count(*) FROM tags WHERE key = 'tandem.selection' AND value = ?"
    wait_for(lambda: db.execute(tagged, (stored["id"],)).fetchone()[0] == 2, 30, "the runs' selection tags")
    report = json.loads(cli("select", "report", stored["id"], "--json").stdout)
    wall = report["break_even"]["wall_s"]
    assert len(report["jobs"]) == 2 and wall["selection"] > 0 and report["baseline"].startswith("estimated")
    group = _json(dashboard, "/api/groups/sweep")  # the dashboard's group page shows when it pays
    (shown_there,) = group["selections"]
    assert shown_there["id"] == stored["id"] and shown_there["share"] == "picked"
    assert len(shown_there["jobs"]) == 2 and shown_there["break_even"]["wall_s"]["selection"] > 0
