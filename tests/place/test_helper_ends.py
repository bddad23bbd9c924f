"""The manager's MLflow helper ends with what it serves: a daemon stopped (or killed) while a
job runs leaves the job's run open only until the job's result is there; the helper then
closes it with the job's status and ends, and a daemon started later amends the run with
its own end. ``daemon stop`` with a job running returns at once, and ``ls``/``show`` say
that no daemon runs. Real daemons, supervisors, helper and MLflow SQLite store."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil

from tests.place.conftest import Cli
from tests.place.test_daemon import SHORT
from tests.timing import scaled, until


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _running_job(cli: Cli) -> tuple[int, str, int]:
    """A daemon serving one job that runs until ``stop`` appears: the job, its run, the helper."""
    cli("daemon", "start", "--cpus", "2", *SHORT)
    stop = cli.tmp / "stop"
    job_id = cli.submit("--name", "held", "--", "sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.05; done")
    run_id = until(lambda: cli.job(job_id)["mlflow_run_id"], 120, "the job's run was made")
    assert cli.job(job_id)["state"] == "running"
    helper = int((cli.state / "track" / "helper.pid").read_text())
    return job_id, run_id, helper


def _ended_run(cli: Cli, run_id: str, helper: int) -> Any:
    """Let the job end; the helper closes its run and ends within a minute of the result."""
    from mlflow.tracking import MlflowClient

    assert _alive(helper), "it goes on writing the running job's run"
    (cli.tmp / "stop").touch()
    result = until(lambda: list(cli.state.glob("jobs/*/1.*/result.json")), 30, "the job ended")[0]
    until(lambda: not _alive(helper), 60, (cli.state / "tracking.log").read_text())
    after = time.time() - result.stat().st_mtime
    print(f"the helper ended {after:.1f} s after the job's result")
    assert after < scaled(60), "the helper ended within a minute of the job (on an idle machine)"
    return MlflowClient(tracking_uri=f"sqlite:///{cli.state / 'mlflow.db'}").get_run(run_id)


def test_a_daemon_stopped_while_its_job_runs_returns_at_once_and_its_helper_ends_after_it(
    cli: Cli,
) -> None:
    job_id, run_id, helper = _running_job(cli)
    started = time.monotonic()
    r = cli("daemon", "stop", "--timeout", "60")
    took = time.monotonic() - started
    # It waited for its helper until --timeout ran out (31 s with the default 30).
    print(f"daemon stop with a job running: {took:.2f} s")
    assert took < scaled(8), f"daemon stop took {took:.1f} s"
    assert f"MLflow helper (pid {helper}) goes on writing" in r.stderr, r.stderr

    ls = cli("ls")
    assert "running" in ls.stdout and "no daemon serves" in ls.stderr, (ls.stdout, ls.stderr)
    assert "states are as last known" in cli("show", str(job_id)).stdout

    run = _ended_run(cli, run_id, helper)
    assert run.info.status == "FINISHED", run.info
    assert run.data.tags["tandem.state"] == "succeeded"
    assert run.data.tags["tandem.closed_by"] == "mlflow-helper"
    track = cli.state / "track"
    assert (track / f"{job_id}-1.closed.json").exists(), "kept for a daemon's later end"

    # A daemon started again adopts the ended attempt: its end amends the run, and nothing waits.
    cli("daemon", "start", "--cpus", "2", *SHORT)
    assert cli.wait_state(job_id, {"succeeded"})["state"] == "succeeded"
    until(lambda: not list(track.glob("*.end.json")) and not list(track.glob("*.closed.json")), 60, "amended")
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=f"sqlite:///{cli.state / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "FINISHED" and "summary/wait_s" in run.data.metrics, "the daemon's figures"
    assert "no daemon serves" not in cli("ls").stderr


def test_a_daemon_killed_while_its_job_runs_leaves_no_helper_once_the_job_ends(cli: Cli) -> None:
    job_id, run_id, helper = _running_job(cli)
    daemon = cli.daemon_pid()
    assert daemon is not None
    os.kill(daemon, signal.SIGKILL)
    until(lambda: not _alive(daemon), 10, "the daemon died")
    assert "no daemon serves" in cli("ls", "--json").stderr

    run = _ended_run(cli, run_id, helper)
    assert run.info.status == "FINISHED" and run.data.tags["tandem.state"] == "succeeded", run.data.tags
    assert cli.job(job_id)["state"] == "running", "states are as last known: no daemon recorded its end"


def test_with_its_daemon_serving_the_helper_ends_after_its_idle_time_and_comes_back(cli: Cli) -> None:
    """``TANDEM_TRACKING_IDLE_S`` (default 60 s) with nothing open: it ends; the next job
    starts another, whose run is made as the first's."""
    from tandem.place.run.metrics.tracking_ends import IDLE_EXIT_S

    assert IDLE_EXIT_S <= 60, "the default meets the minute"
    cli.env["TANDEM_TRACKING_IDLE_S"] = "2"
    cli("daemon", "start", "--cpus", "2", *SHORT)
    first = cli.submit("--", "true")
    assert cli("wait", str(first), timeout=120).returncode == 0
    pid_file = cli.state / "track" / "helper.pid"  # kept while it runs
    until(lambda: cli.job(first)["mlflow_run_id"], 60, "a helper made its run")
    until(lambda: not pid_file.exists(), 30, "it ended after 2 s with nothing open")
    assert cli("daemon", "status").returncode == 0, "while its daemon serves"
    second = cli.submit("--", "true")
    assert cli("wait", str(second), timeout=120).returncode == 0
    assert until(lambda: cli.job(second)["mlflow_run_id"], 60, "a new helper made its run")
