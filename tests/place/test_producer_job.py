"""A share group's producer is a job row of its own (issue 33, point 2): made by the daemon
when a job of the share waits, shown in ``ls --json`` with role ``producer``; the group's
jobs wait for it; it is stopped, as succeeded, after the group's last job; one that dies
fails its group with its own error; a restarted daemon adopts it; a cancel of it while its
group runs is refused. In-process (tests/place/inproc.py): its attempts are the fake
launcher's, as the group's jobs are."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tandem.place.reserve import producer_key
from tandem.place.resources import Resources

from .inproc import InProc, Step

DATASET = "def make():\n    return list(range(8))\n"


def _group(inproc: Any, tmp_path: Path, monkeypatch: Any, *args: str) -> InProc:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "pj_data.py").write_text(DATASET)
    h: InProc = inproc("--cpus", "2", "--settle", "0.3", "--window", "2", "--grace", "1", *args)
    h.cli("share", "define", "toy", "--dataset", "pj_data:make", "--batch-size", "4")
    return h


def _producers(h: InProc) -> list[dict[str, Any]]:
    return [j for j in h.json("ls") if j["role"] == "producer"]


def test_the_producer_is_a_job_row_its_group_waits_for_and_it_ends_succeeded(inproc, tmp_path, monkeypatch):
    h = _group(inproc, tmp_path, monkeypatch)
    ids = [h.submit("--share", "toy", "--group", "g", "--cpus", "0.5", "--", "true") for _ in range(2)]
    (producer,) = h.run_until(lambda: _producers(h), within=5)
    assert producer["name"] == "producer toy" and producer["share"] == "toy" and producer["group"] == "g"
    assert producer["command"][-2] == "serve-spec" and producer["command"][-1].endswith("/share.json")
    assert producer["request"]["cpus"] == 1  # its definition's, on 2 cores
    # Its group's jobs wait for it, saying which job it is, until it runs.
    for i in ids:
        assert h.job(i)["reason"] == f"waits for its share's producer (job {producer['id']})"
    pid = producer["id"]
    h.wait_state(pid, {"running"})
    spec = json.loads(Path(producer["command"][-1]).read_text())  # the spec it serves, written as it starts
    assert spec["name"] == "toy" and spec["num_workers"] == 2  # its loader workers: the daemon's cores
    h.run_until(lambda: all(h.state_of(i) == "running" for i in ids), within=10)
    assert (pid, 1) in h.launcher.runs and len(_producers(h)) == 1  # one producer feeds both
    # It weighs as much as the jobs it feeds.
    h.step(2.0)
    assert h.weights[os.getpid()] == 2  # its fake supervisor is this process
    # It runs while a job of its group does; after the last, it is stopped, as succeeded.
    h.clock.advance(12)  # long enough a run to learn what it used
    h.finish(ids[0])
    h.step(1.0)
    assert h.state_of(pid) == "running"
    h.finish(ids[1])
    h.step(10.0)  # within the daemon's producer linger (15 s): it serves on for the next jobs
    assert h.state_of(pid) == "running"
    assert h.wait_state(pid, {"succeeded", "failed", "cancelled"}, within=30) == "succeeded"
    shown = h.job(pid)
    assert shown["role"] == "producer" and "its group's last job ended" in shown["cause"], shown
    assert h.run_of(pid).cancelled  # stopped by its supervisor's SIGTERM
    assert h.daemon.producers.learned.runs(producer_key("toy")), "what it used was not learnt"
    # A new job of the share gets a new producer, reserving what the first one used.
    again = h.submit("--share", "toy", "--cpus", "0.5", "--", "true")
    newer = h.run_until(lambda: [p for p in _producers(h) if p["id"] != pid], within=5)
    assert len(newer) == 1 and h.job(again)["reason"].endswith(f"(job {newer[0]['id']})")
    assert newer[0]["request"]["cpus"] < 0.5, newer  # what it used (0.1 core), not its definition's core
    assert "measured, 1 producer run" in h.cli("show", str(newer[0]["id"])).stdout


def test_a_producer_that_dies_fails_its_group_with_its_error(inproc, tmp_path, monkeypatch):
    h = _group(inproc, tmp_path, monkeypatch)
    running = h.submit("--share", "toy", "--cpus", "0.5", "--", "true")
    h.run_until(lambda: h.state_of(running) == "running", within=10)
    (producer,) = _producers(h)
    # One more of the group, held behind a dependency.
    blocker = h.submit("--", "true", steps=Step(run_s=None))
    later = h.submit("--share", "toy", "--cpus", "0.5", "--after", str(blocker), "--", "true")
    h.step(0.5)
    h.finish(producer["id"], 1, "ValueError: no such bucket: s3://typo")
    h.run_until(lambda: h.ended(running, producer["id"]), within=10)
    assert h.state_of(producer["id"]) == "failed"
    shown = h.job(running)
    assert shown["state"] == "failed", shown
    assert f"producer of share 'toy' (job {producer['id']})" in shown["cause"]
    assert "no such bucket: s3://typo" in shown["cause"] and "its log:" in shown["cause"]
    assert "no such bucket" in h.cli("ls").stdout  # the share line says how its producer ended
    # The group's waiting jobs fail with it too (a dependency of theirs still running).
    assert h.state_of(later) == "failed" and "no such bucket" in h.job(later)["cause"]
    assert h.state_of(blocker) == "running"


def test_a_restarted_daemon_adopts_the_running_producer(inproc, tmp_path, monkeypatch):
    h = _group(inproc, tmp_path, monkeypatch)
    job = h.submit("--share", "toy", "--cpus", "0.5", "--", "true")
    h.run_until(lambda: h.state_of(job) == "running", within=10)
    (producer,) = _producers(h)
    h2 = h.restart()
    h2.step(1.0)
    assert h2.state_of(producer["id"]) == "running" and h2.state_of(job) == "running"
    assert "adopted" in h2.cli("show", str(producer["id"])).stdout
    assert len(_producers(h2)) == 1 and len(h2.launcher.running()) == 2  # nothing started again
    h2.finish(job)
    assert h2.wait_state(producer["id"], {"succeeded", "failed", "cancelled"}, within=30) == "succeeded"


def test_a_producer_is_not_cancelled_under_its_running_group_but_cancel_all_ends_everything(
    inproc, tmp_path, monkeypatch
):
    h = _group(inproc, tmp_path, monkeypatch)
    ids = [h.submit("--share", "toy", "--group", "g", "--cpus", "0.5", "--", "true") for _ in range(2)]
    h.run_until(lambda: all(h.state_of(i) == "running" for i in ids), within=10)
    (producer,) = _producers(h)
    r = h.cli("cancel", str(producer["id"]), check=False)
    assert r.returncode == 2, r
    assert f"producer of share 'toy': its group's jobs {ids[0]}, {ids[1]} still read it" in r.stderr
    assert h.state_of(producer["id"]) == "running"
    h.cli("cancel", "--all")
    h.run_until(lambda: h.ended(producer["id"], *ids), within=30)
    assert {h.state_of(i) for i in ids} == {"cancelled"}
    assert h.state_of(producer["id"]) == "cancelled"
    assert not h.launcher.running()


def test_a_producer_stopped_by_a_daemon_that_then_died_ends_succeeded(inproc, tmp_path, monkeypatch):
    """Its stop was asked, its supervisor ended it (a result: cancelled), and the daemon died
    before it read that: the next daemon records the stop as one (succeeded), not a cancel."""
    h = _group(inproc, tmp_path, monkeypatch)
    job = h.submit("--share", "toy", "--cpus", "0.5", "--", "true")
    h.run_until(lambda: h.state_of(job) == "running", within=10)
    (producer,) = _producers(h)
    h.finish(job)
    h.run_until(lambda: h.run_of(producer["id"]).cancelled, within=30)  # after its linger
    assert h.state_of(producer["id"]) == "running"  # its end not yet read
    h2 = h.restart()
    assert h2.wait_state(producer["id"], {"succeeded", "failed", "cancelled"}, within=10) == "succeeded"
    assert "its group's last job ended" in h2.job(producer["id"])["cause"]


def test_a_gpu_slab_producer_row_reserves_a_gpu_not_its_memory(tmp_path: Path) -> None:
    """A share that keeps its batches on a GPU: its producer's row asks for a GPU (its own
    placement, cuda:0 to it) with no GPU memory reserved (its slab is in the GPU's measured
    use), learnt under the share's key, retried once, in the group of the job that asked."""
    from tandem.place.config import DaemonConfig
    from tandem.place.model import Capacity, GpuInfo, JobSpec
    from tandem.place.producers import Producers
    from tandem.place.reserve import Learned
    from tandem.place.state import State
    from tandem.share.spec import ShareSpec

    (tmp_path / "s").mkdir(mode=0o700)
    state = State(tmp_path / "s")
    state.define_share(ShareSpec("pics", "images", str(tmp_path), device="cuda:0"))
    capacity = Capacity(Resources(2.0, 8 << 30), (GpuInfo(0, "GPU-0", 80 << 30),))
    producers = Producers(state, capacity, DaemonConfig(), Learned())
    asked, _ = state.add_job(JobSpec(["true"], str(tmp_path), share="pics", group="sweep"), 1, 1.0)
    share, job = state.share("pics"), state.job(asked)
    assert share is not None and job is not None
    row = state.job(producers.make(share, job))
    assert row is not None and row.role == "producer" and row.name == "producer pics"
    assert (row.gpus, row.gpu_mem, row.share, row.group) == (1, 0, "pics", "sweep")
    assert row.learning_key == producer_key("pics") and row.retries == 1
    state.close()


def test_a_job_of_the_share_that_comes_within_the_linger_reads_the_same_producer(
    inproc, tmp_path, monkeypatch
):
    """A tuner submits its next trials as the last ones end (Optuna's ask-and-tell): the
    producer serves on for the daemon's producer linger, counted from its group's last job."""
    h = _group(inproc, tmp_path, monkeypatch, "--producer-linger", "20")
    first = h.submit("--share", "toy", "--group", "g", "--cpus", "0.5", "--", "true")
    (producer,) = h.run_until(lambda: _producers(h), within=5)
    h.run_until(lambda: h.state_of(first) == "running", within=10)
    h.finish(first)
    h.run_until(lambda: h.ended(first), within=5)
    h.step(15.0)
    assert h.state_of(producer["id"]) == "running"
    second = h.submit("--share", "toy", "--group", "g", "--cpus", "0.5", "--", "true")
    h.run_until(lambda: h.state_of(second) == "running", within=5)
    assert len(_producers(h)) == 1  # no second producer: the data is loaded once
    h.finish(second)
    h.run_until(lambda: h.ended(second), within=5)
    h.step(15.0)
    assert h.state_of(producer["id"]) == "running"  # 15 s after the last job, not the first
    assert h.wait_state(producer["id"], {"succeeded", "failed", "cancelled"}, within=30) == "succeeded"


def test_the_producer_runs_the_interpreter_that_defined_its_share(inproc, tmp_path, monkeypatch):
    """A daemon started from another environment (another venv) cannot import the share's
    dataset: its producer runs the Python that ran ``share define``, not the daemon's."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "pj_data.py").write_text(DATASET)
    h: InProc = inproc("--cpus", "2", "--settle", "0.3", "--window", "2", "--grace", "1")
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    with monkeypatch.context() as m:
        m.setattr(sys, "executable", str(venv_python))
        for name in ("toy", "toy2"):
            h.cli("share", "define", name, "--dataset", "pj_data:make", "--batch-size", "4")
    h.submit("--share", "toy", "--cpus", "0.5", "--", "true")
    (producer,) = h.run_until(lambda: _producers(h), within=5)
    assert producer["command"][0] == str(venv_python), producer["command"]
    # A share whose interpreter is gone (its venv removed): the daemon's own, whose error
    # says what it cannot import.
    venv_python.unlink()
    h.submit("--share", "toy2", "--cpus", "0.5", "--", "true")
    (other,) = h.run_until(lambda: [p for p in _producers(h) if p["share"] == "toy2"], within=5)
    assert other["command"][0] == sys.executable


def test_a_public_share_is_refused_by_a_users_own_daemon(
    inproc: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """--public is for the host's system manager (other users' jobs): on a user's own daemon,
    every job is theirs, and it is refused saying so; nothing is defined."""
    h = _group(inproc, tmp_path, monkeypatch)
    r = h.cli("share", "define", "pub", "--dataset", "pj_data:make", "--public", check=False)
    assert r.returncode == 2 and "--public" in r.stderr and "system manager" in r.stderr, r
    assert "Traceback" not in r.stderr
    assert "pub" not in h.cli("share", "ls").stdout
