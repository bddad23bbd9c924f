"""One MLflow run per submitted job: the job starts once the manager's run for it exists and
is told it (``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``), so what it logs with MLflow itself
lands beside the manager's ``system/*`` metrics; ``tandem report`` finds the job's runs in
the manager's store even where the working directory holds an ``mlflow.db`` of its own.
A real daemon, real supervisors, real MLflow SQLite stores; and a supervisor alone, with the
test in the MLflow helper's place, for what happens when the run comes, fails or is waited
for when the job is cancelled."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.place.run.supervisor.files import AttemptSpec, Result, RunRef, load, save
from tests.place.conftest import Cli
from tests.timing import scaled

pytestmark = pytest.mark.warm  # Python jobs start warm, as a user's do

# The fluent API with no start_run, and Lightning's logger where Lightning is installed.
JOB = """\
import json, os
import mlflow
told = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID")}
print("told", json.dumps(told))
mlflow.log_metric("child/loss", 0.5, step=1)  # resumes the run (and takes MLFLOW_RUN_ID out of os.environ)
try:
    import lightning
except ImportError:
    lightning = None
if lightning is not None:
    from lightning.pytorch.loggers import MLFlowLogger

    logger = MLFlowLogger(run_id=told["MLFLOW_RUN_ID"], tracking_uri=told["MLFLOW_TRACKING_URI"])
    logger.log_metrics({"lit/loss": 0.25}, step=1)
    logger.finalize("success")  # marks the run FINISHED, as Trainer.fit does at its end
print("done")
"""


def _ended_run(client, run_id: str):  # type: ignore[no-untyped-def]
    """The run once the manager's helper has closed it (it forwards every 2 s). Its summary
    is looked for too: MLflow's ``get_run`` reads a run's metrics and its tags in separate
    SQLite statements, not one snapshot, so a read between them can see the helper's closing
    tags (written last) without the summary (written just before)."""
    deadline = time.monotonic() + scaled(60)
    while True:
        run = client.get_run(run_id)
        closed = run.info.status != "RUNNING" and "tandem.state" in run.data.tags
        if closed and "summary/run_s" in run.data.metrics:
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run.info.status}"
        time.sleep(0.2)


def test_a_job_logs_into_its_own_run_and_report_reads_the_managers_store(cli: Cli) -> None:
    from mlflow.tracking import MlflowClient

    cli("daemon", "start", "--cpus", "2", "--no-host-load", "--settle", "0.3", "--grace", "1")
    (cli.tmp / "job.py").write_text(JOB)
    job_id = cli.submit("--name", "logged", "--group", "gx", "--", sys.executable, "job.py")
    r = cli("wait", str(job_id), timeout=180)
    assert r.returncode == 0
    out = cli("logs", str(job_id)).stdout
    told = json.loads(next(line for line in out.splitlines() if line.startswith("told "))[5:])
    uri = cli.json("daemon", "status")["tracking"]
    assert told["MLFLOW_TRACKING_URI"] == uri == f"sqlite:///{cli.state / 'mlflow.db'}"
    run_id = cli.job(job_id)["mlflow_run_id"]
    assert told["MLFLOW_RUN_ID"] == run_id and run_id

    client = MlflowClient(tracking_uri=uri)
    run = _ended_run(client, run_id)
    (only,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert only.info.run_id == run_id, "the job made no run of its own"
    metrics = run.data.metrics
    assert "child/loss" in metrics and "system/process_tree/cpu_percent" in metrics, sorted(metrics)
    if importlib.util.find_spec("lightning") is not None:
        assert "lit/loss" in metrics, sorted(metrics)
    assert run.info.status == "FINISHED" and run.data.tags["tandem.job_id"] == str(job_id)
    assert run.data.metrics["summary/run_s"] > 0
    # It ends when its attempt did (the daemon's record), not when the helper closed it. The
    # helper tags the run before it closes it (the job's own logger ended it already).
    ended = int(cli.job(job_id)["attempts"][-1]["ended"] * 1000)
    deadline = time.monotonic() + scaled(60)
    while abs((end := client.get_run(run_id).info.end_time) - ended) > 1:
        assert time.monotonic() < deadline, (end, ended)
        time.sleep(0.2)
    assert not list(cli.tmp.glob("mlflow.db")) and not (cli.tmp / "mlruns").exists()

    # A store in the working directory (as Lightning's logger makes one there when it is not
    # told the run) does not hide the manager's: a group and a job are found there.
    decoy = MlflowClient(tracking_uri=f"sqlite:///{cli.tmp / 'mlflow.db'}")
    decoy.log_metric(decoy.create_run(decoy.create_experiment("lightning_logs")).info.run_id, "x", 1.0)
    for ref in ("group:gx", f"job:{job_id}"):
        r = cli("report", ref, "-o", "report.png", timeout=120)
        assert "logged (gx)" in r.stdout, (ref, r.stdout, r.stderr)
    r = cli("report", "job:nine", "-o", "report.png", check=False, timeout=120)
    assert r.returncode == 2 and "a job is named by its number" in r.stderr and "Traceback" not in r.stderr


def _shim(adir: Path, command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """A supervisor for one attempt of a job that waits for its MLflow run (no daemon: the
    test plays the MLflow helper's part, writing ``mlflow.json``, or does not)."""
    adir.mkdir()
    spec = AttemptSpec(command, str(cwd), env, job_id=1, attempt=1, track=False, mlflow_env=True)
    save(adir, spec)
    return subprocess.Popen([sys.executable, "-m", "tandem.place.run.supervisor.shim", str(adir)])


def _catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_the_supervisor_tells_the_job_its_run_and_a_cancel_while_it_waits_starts_nothing(
    tmp_path: Path,
) -> None:
    show = "import os; print('told', os.environ.get('MLFLOW_RUN_ID'), os.environ.get('MLFLOW_TRACKING_URI'))"
    env = {**os.environ, "MLFLOW_TRACKING_URI": "http://elsewhere:5000", "MLFLOW_EXPERIMENT_ID": "5"}
    # Its run is made: the job is told it, in place of the store it was submitted with.
    told = tmp_path / "told"
    proc = _shim(told, [sys.executable, "-c", show], tmp_path, env)
    save(told, RunRef(f"sqlite:///{tmp_path}/m.db", "a" * 32, "tandem"))
    assert proc.wait(scaled(60)) == 0
    assert (told / "output.log").read_text().strip() == f"told {'a' * 32} sqlite:///{tmp_path}/m.db"
    result = load(told, Result)
    assert result is not None and result.state == "succeeded"
    assert any("replaced by the job manager's store" in n for n in result.notes), result.notes
    # No run could be made: it starts without, and says why.
    failed = tmp_path / "failed"
    proc = _shim(failed, [sys.executable, "-c", show], tmp_path, {**os.environ})
    save(failed, RunRef(error="OperationalError: disk I/O error"))
    assert proc.wait(scaled(60)) == 0
    assert "told None" in (failed / "output.log").read_text()
    result = load(failed, Result)
    assert result is not None and any("disk I/O error" in n for n in result.notes), result
    # Cancelled while it waits for its run: the job never starts.
    waiting = tmp_path / "waiting"
    marker = tmp_path / "ran"
    proc = _shim(waiting, ["sh", "-c", f"touch {marker}"], tmp_path, {**os.environ})
    deadline = time.monotonic() + scaled(30)
    while not _catches_sigterm(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, "the supervisor never got ready"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(scaled(30)) == 0
    result = load(waiting, Result)
    assert result is not None and result.state == "cancelled" and not marker.exists()
