"""`track()` inside a script: real processes and a real MLflow SQLite store."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.watch.test_run import find_run

SCRIPT = """
import sys, time
from tandem.watch import track
with track(name={name!r}, tags={{"group": "t"}}, interval=0.2, store=None) as run:
    end = time.process_time() + 1.5  # CPU-seconds: the same on a loaded machine
    while time.process_time() < end:
        sum(range(20000))
        run.log_step(samples=32, loss=0.5)
    {extra}
print("RUN", run.run_id)
"""


def _script(tmp_path, name, extra="pass"):
    path = tmp_path / f"{name}.py"
    path.write_text(SCRIPT.format(name=name, extra=extra))
    return path


def test_track_logs_steps_and_leaves_its_writer_out_of_the_run(tmp_path):
    store = tmp_path / "mlflow.db"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{store}", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, str(_script(tmp_path, "in-script"))],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    run = find_run(store, "in-script")
    assert run.info.status == "FINISHED"
    m = run.data.metrics
    assert m["summary/samples"] > 100 and m["summary/samples_per_s"] > 50
    assert m["loss"] == 0.5 and "train/samples_per_s" in m
    # The MLflow writer is a child of the script, but not part of the run.
    procs = MlflowClient(f"sqlite:///{store}").get_metric_history(
        run.info.run_id, "system/process_tree/processes"
    )
    assert max(p.value for p in procs) == 1
    assert 1.4 < m["summary/cpu_seconds"] < 3.2, "the busy 1.5 s, not MLflow's import (about 2 s more)"


def test_bad_metric_names_are_refused_at_once(tmp_path):
    from tandem.watch import Run

    run = Run(name="x", writer="thread")  # not started: the check needs no store
    with pytest.raises(ValueError, match="metric name 'acc@1' is not valid"):
        run.log_step(samples=1, **{"acc@1": 0.9})
    with pytest.raises(ValueError, match="metric name"):
        run.log_metrics({"": 1.0})


def test_a_killed_script_leaves_its_run_marked_killed(tmp_path):
    store = tmp_path / "mlflow.db"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{store}", "PATH": "/usr/bin:/bin"}
    script = _script(tmp_path, "killed", extra="time.sleep(60)")
    MlflowClient(f"sqlite:///{store}").search_experiments()  # create the tables before polling
    p = subprocess.Popen(
        [sys.executable, str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        time.sleep(6)  # inside the sleep after the loop, the run open
        p.kill()
        p.wait(30)
        deadline = time.monotonic() + 60
        while True:
            try:
                run = find_run(store, "killed")
                if run.info.status != "RUNNING":
                    break
            except AssertionError:
                pass
            assert time.monotonic() < deadline, "the writer did not end the run"
            time.sleep(0.5)
        assert run.info.status == "KILLED"
        assert run.data.metrics.get("system/process_tree/cpu_percent") is not None, "what was sampled is kept"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
