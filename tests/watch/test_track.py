"""`track()` inside a script: real processes and a real MLflow SQLite store."""

from __future__ import annotations

import subprocess
import sys

from mlflow.tracking import MlflowClient

from tests.timing import until
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


def _status(store, name) -> str | None:
    """The run's status in the store; None while it is not there."""
    try:
        return find_run(store, name).info.status
    except AssertionError:
        return None


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


def test_bad_metric_names_are_warned_about_once_and_dropped(capfd):
    from tandem.watch import Run

    run = Run(name="x", writer="thread")  # not started: the check needs no store
    assert run._good({"acc@1": 0.9, "loss": 1.0}) == {"loss": 1.0}, "training goes on"
    assert run._good({"acc@1": 0.8}) == {}
    err = capfd.readouterr().err
    assert err.count("metric name 'acc@1' is not valid") == 1


def test_unchanged_values_are_skipped_but_a_change_keeps_its_place():
    from tandem.watch import Run

    run = Run(name="x", writer="thread")
    stored = []
    # a rate: 100 for ticks 0..4, then 0 from tick 5
    for tick, value in enumerate([100.0, 100.0, 100.0, 100.0, 100.0, 0.0, 0.0]):
        run._tick_n = tick
        stored += [
            (p.step, p.value) for p in run._changed({"cpu": value}, now=float(tick), ts=tick, last=False)
        ]
    # tick 4 (the last 100) is stored when the value changes, so the drop is placed at tick 5
    assert stored == [(0, 100.0), (4, 100.0), (5, 0.0)]
    run._tick_n = 7
    assert [(p.step, p.value) for p in run._changed({"cpu": 0.0}, now=7.0, ts=7, last=True)] == [(7, 0.0)]


def test_a_killed_script_leaves_its_run_marked_killed(tmp_path):
    store = tmp_path / "mlflow.db"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{store}", "PATH": "/usr/bin:/bin"}
    script = _script(tmp_path, "killed", extra="open('looped', 'w').close(); time.sleep(600)")
    MlflowClient(f"sqlite:///{store}").search_experiments()  # create the tables before polling
    p = subprocess.Popen(
        [sys.executable, str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        # Killed inside the sleep after the loop, with the run open in its store.
        until(
            lambda: (tmp_path / "looped").exists() and _status(store, "killed") == "RUNNING",
            60,
            "no run open",
            every=0.5,
        )
        p.kill()
        p.wait(30)
        # The writer is niced (10): on a busy machine it gets a tenth of a core's share.
        until(lambda: _status(store, "killed") != "RUNNING", 120, "the writer did not end the run", every=0.5)
        run = find_run(store, "killed")
        assert run.info.status == "KILLED"
        assert run.data.metrics.get("system/process_tree/cpu_percent") is not None, "what was sampled is kept"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
