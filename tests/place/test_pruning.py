"""A sweep with ``--prune asha --metric loss:min``, end to end: a real daemon, real trials
logging their loss each epoch with MLflow into the runs tandem made, the worse ones stopped
at their rung and ended ``pruned`` (never failed, never retried), their runs KILLED and
tagged, the best run to its end; a daemon that cannot prune says so at submit."""

from __future__ import annotations

import json
import sys

import pytest

from tests.place.conftest import Cli
from tests.place.test_daemon import SHORT
from tests.timing import scaled

pytestmark = pytest.mark.warm  # Python jobs start warm, as a user's do

# Its loss falls with each epoch, from a start that its --lr sets (0.01 is the best); the
# epochs are paced (a second each) so that the daemon, which reads the store each second,
# finds a trial still running when it reaches a rung it misses.
TRAIN = """\
import sys, time
import mlflow
lr = float(sys.argv[1])
for epoch in range(9):
    mlflow.log_metric("loss", (1 + 100 * abs(lr - 0.01)) / (epoch + 1), step=epoch)
    time.sleep(1.0)
print("done", lr)
"""


def test_a_pruned_sweep_stops_the_worse_trials_and_runs_the_best_to_its_end(cli: Cli) -> None:
    (cli.tmp / "train.py").write_text(TRAIN)
    cli("daemon", "start", "--cpus", "2", "--no-host-load", *SHORT)
    lrs = ["0.01", "0.05", "0.1", "0.3"]  # losses 1, 5, 10, 30 (/ epoch): 0.1 and 0.3 miss rung 1
    out = cli(
        "submit", "--group", "lr", "--grid", f"lr={','.join(lrs)}", "--cpus", "0.3", "--name", "lr-{lr}",
        "--prune", "asha", "--metric", "loss:min", "--json", "--", sys.executable, "train.py", "{lr}",
    )  # fmt: skip
    ids = json.loads(out.stdout)["ids"]
    waited = cli("wait", "group:lr", timeout=scaled(240), check=False)
    assert waited.returncode == 0, (waited.stderr, cli("ls").stdout)  # pruned is an end as asked
    jobs = {i: cli.job(i) for i in ids}
    states = [jobs[i]["state"] for i in ids]
    best = jobs[ids[0]]
    assert best["state"] == "succeeded" and "done 0.01" in cli("logs", str(ids[0])).stdout, best
    pruned = [j for j in jobs.values() if j["state"] == "pruned"]
    assert len(pruned) >= 2 and set(states) <= {"succeeded", "pruned"}, states
    for j in pruned:
        assert len(j["attempts"]) == 1, j  # never retried
        assert j["pruned_rung"] in (1, 3) and j["cause"].startswith(
            f"pruned (asha) at rung {j['pruned_rung']}"
        )
        assert "loss" in j["cause"] and "other trial(s) that reached it" in j["cause"], j["cause"]
    shown = cli("show", str(pruned[0]["id"])).stdout
    assert "pruned" in shown and "rung" in shown, shown
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{cli.state / 'mlflow.db'}")

    def run_of(job: dict) -> object:
        return client.get_run(cli.job(job["id"])["mlflow_run_id"])

    # The helper writes a run's end a moment after the job's: until each is written.
    from tests.timing import until

    until(lambda: all(run_of(j).info.status == "KILLED" for j in pruned), 60, lambda: "runs not ended")
    run = run_of(pruned[0])
    assert run.data.tags["tandem.pruned"] == "true" and run.data.tags["tandem.state"] == "pruned"
    assert run.data.tags["tandem.pruned.rung"] == str(pruned[0]["pruned_rung"])
    until(lambda: run_of(best).info.status == "FINISHED", 60, lambda: "the best run not ended")
    assert len(client.get_metric_history(best["mlflow_run_id"], "loss")) == 9
    # The sweep's report: what was pruned where, and the best (by the rule's metric, unasked).
    (report,) = json.loads(cli("report", "group:lr", "--json").stdout)["groups"]
    assert report["best"]["job"] == ids[0] and report["totals"]["states"].get("failed") is None
    assert report["pruned"]["count"] == len(pruned) and report["pruned"]["trials"] == len(ids)
    by_rung = {i for rung_ids in report["pruned"]["by_rung"].values() for i in rung_ids}
    assert by_rung == {j["id"] for j in pruned}
    text = cli("report", "group:lr").stdout
    assert f"pruned {len(pruned)} of {len(ids)} trials early (asha by loss:min): at rung" in text, text


def test_a_prune_rule_is_checked_at_submit(cli: Cli) -> None:
    cli("daemon", "start", "--cpus", "2", "--no-track", *SHORT)
    args = ("submit", "--grid", "lr=1,2", "--prune", "asha")
    bad = cli(*args, "--metric", "loss", "--", "sh", "-c", "true", check=False)
    assert bad.returncode == 2 and "--metric loss: give NAME:min or NAME:max" in bad.stderr, bad.stderr
    untracked = cli(*args, "--metric", "loss:min", "--", "sh", "-c", "true", check=False)
    assert untracked.returncode == 2 and "makes none" in untracked.stderr, untracked.stderr
