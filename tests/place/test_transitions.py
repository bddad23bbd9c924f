"""A job's state changes only through the state's named transitions, each from the states
its table allows, writing the row, the attempt and the event in one transaction; the tables
come from the records' declared fields (a field without its migration is caught at open);
a stored field (``params``) reaches ``--json`` without a hand-written line."""

from __future__ import annotations

import itertools
import sqlite3
import time
from pathlib import Path

import pytest

from tandem.place.model import STATES, JobSpec
from tandem.place.records import Attempt, AttemptPlacement
from tandem.place.resources import Resources
from tandem.place.state import TRANSITIONS, IllegalTransition, State, StateError
from tandem.place.views import job_json


def _job_in(state: State, job_state: str) -> int:
    job_id, _ = state.add_job(JobSpec(["true"], "/", {"SECRET": "x"}), 0, time.time())
    if job_state == "running":  # with an attempt, as a running job has
        state.start(Attempt(job_id, 1, "running", AttemptPlacement(), time.time()), None, "attempt 1")
    else:  # a test's shortcut to any state: what the transitions below must respect
        state.db.execute("UPDATE jobs SET state = ? WHERE id = ?", (job_state, job_id))
    return job_id


def _apply(state: State, transition: str, job_id: int, to: str) -> None:
    now = time.time()
    ending = {"state": to, "ended": now, "exit_code": 0}
    if transition == "start":
        state.start(Attempt(job_id, 9, "running", AttemptPlacement(), now), None, "attempt 9")
    elif transition == "requeue":
        state.requeue(job_id, 1, "never started", now)
    elif transition == "retry":
        state.retry(job_id, 1, ending, {"escalation": 1}, "retrying")
    elif transition == "finish":
        state.finish(job_id, 1, to, ending, {"ended": now}, "")
    elif transition == "fail":
        state.fail(job_id, "could not start", now)
    elif transition == "cancel":
        state.cancel(job_id, "cancelled", "while waiting", now)


def _reachable(transition: str) -> str:
    return TRANSITIONS[transition][1][0]


@pytest.mark.parametrize(("transition", "from_state"), list(itertools.product(TRANSITIONS, STATES)))
def test_every_transition_from_every_state(tmp_path: Path, transition: str, from_state: str) -> None:
    state = State(tmp_path)
    job_id = _job_in(state, from_state)
    events = len(state.events(job_id))
    leaves, _ = TRANSITIONS[transition]
    if from_state in leaves:
        _apply(state, transition, job_id, _reachable(transition))
        job = state.job(job_id)
        assert job is not None and job.state == _reachable(transition)
        assert len(state.events(job_id)) > events, "the transition wrote its event"
    else:
        with pytest.raises(IllegalTransition, match=f"cannot {transition} it from {from_state}"):
            _apply(state, transition, job_id, _reachable(transition))
        job = state.job(job_id)
        assert job is not None and job.state == from_state, "refused: nothing written"
        assert len(state.events(job_id)) == events


def test_a_transition_to_a_state_it_cannot_reach_is_refused(tmp_path: Path) -> None:
    state = State(tmp_path)
    job_id = _job_in(state, "queued")
    with pytest.raises(IllegalTransition, match="fail cannot take a job to 'succeeded'"):
        state._move(state.db, "fail", job_id, "succeeded")


def test_state_is_not_written_around_the_transitions(tmp_path: Path) -> None:
    state = State(tmp_path)
    job_id = _job_in(state, "queued")
    with pytest.raises(ValueError, match="only through a transition"):
        state.update_job(job_id, state="succeeded")
    with pytest.raises(ValueError, match="ends only with its job's transition"):
        state.update_attempt(job_id, 1, state="lost")


def test_finish_ends_the_attempt_and_the_job_together(tmp_path: Path) -> None:
    state = State(tmp_path)
    job_id = _job_in(state, "running")
    state.finish(job_id, 1, "succeeded", {"state": "succeeded", "ended": 5.0, "exit_code": 0},
                 {"ended": 5.0, "exit_code": 0}, "", notes=["a note"])  # fmt: skip
    job = state.job(job_id)
    assert job is not None and (job.state, job.exit_code, job.ended) == ("succeeded", 0, 5.0)
    assert (job.attempts[0].state, job.attempts[0].ended) == ("succeeded", 5.0)
    assert [e["kind"] for e in state.events(job_id)][-2:] == ["succeeded", "note"]


def test_params_are_stored_and_shown_from_the_record_alone(tmp_path: Path) -> None:
    state = State(tmp_path)
    job_id, _ = state.add_job(
        JobSpec(["true"], "/", {"SECRET": "x"}, params={"lr": 0.1, "arch": "r18"}), 0, 1.0
    )
    job = state.job(job_id)
    assert job is not None and job.params == {"lr": 0.1, "arch": "r18"}
    (listed,) = state.jobs()
    assert listed.params == {"lr": 0.1, "arch": "r18"} and listed.env == {}, "listed without the environment"
    shown = job_json(job)
    assert shown["params"] == {"lr": 0.1, "arch": "r18"}
    assert shown["request"]["mem_bytes"] == 0 and "mem" not in shown, "declared keys, nested where declared"
    assert "env" not in shown and "token" not in shown and "SECRET" not in repr(shown)


def test_a_declared_field_without_its_column_is_caught_when_the_state_opens(tmp_path: Path) -> None:
    State(tmp_path).close()
    db = sqlite3.connect(tmp_path / "place.db")
    db.execute("ALTER TABLE jobs DROP COLUMN params")
    db.commit()
    db.close()
    with pytest.raises(StateError, match=r"no column for jobs\.params"):
        State(tmp_path)


def test_schema_3_gains_params_and_the_shares_selection(tmp_path: Path) -> None:
    """A state file of schema 3: its jobs get empty params; a share defined with
    --selection keeps it in the share's selection column."""
    from tandem.place.schema import SCHEMA_VERSION
    from tandem.share.spec import ShareSpec

    state = State(tmp_path)
    state.add_job(JobSpec(["true"], "/"), 0, 1.0)
    spec = ShareSpec(name="s", source="dataset", ref="x:y", selection="0123456789abcdef")
    state.define_share(spec)
    state.close()
    db = sqlite3.connect(tmp_path / "place.db")  # back to schema 3
    db.execute("ALTER TABLE jobs DROP COLUMN params")
    db.execute("ALTER TABLE shares DROP COLUMN selection")
    db.execute("UPDATE meta SET v = '3' WHERE k = 'schema'")
    db.commit()
    db.close()
    state = State(tmp_path)
    assert state.setting("schema") == str(SCHEMA_VERSION)
    (job,) = state.jobs()
    assert job.params == {}
    share = state.share("s")
    assert share is not None and share.selection == "0123456789abcdef"


def _attempts(state: State):  # the daemon's follower of attempts, over a fake launcher
    from tandem.place.attempts import Attempts
    from tandem.place.config import DaemonConfig
    from tandem.place.devices import Monitor
    from tandem.place.model import Capacity
    from tests.place.inproc import FakeClock, FakeLauncher, Step

    capacity = Capacity(Resources(2.0, 1 << 30))
    config = DaemonConfig(grace_s=1.0, interval_s=0.2)
    launcher = FakeLauncher(FakeClock(), config.interval_s)
    launcher.default = Step(run_s=0.0)  # each job ends at once, exit 0
    return Attempts(state, capacity, config, Monitor(capacity, 5.0, None), launcher, None, "")


def _followed_until_ended(attempts, job_id: int, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while job_id in attempts.active and time.monotonic() < deadline:
        attempts.launcher.sample()  # what its supervisor writes: here, that it ended
        attempts.follow_all(time.time())


def test_a_write_that_fails_after_the_end_is_recorded_is_retried_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's transition is written once; a later write that fails (a full disk at the
    measured peak) is tried again next tick, and the attempt then leaves the active set."""
    from tests.place.needs import placed

    state = State(tmp_path)
    attempts = _attempts(state)
    job_id, _ = state.add_job(JobSpec(["true"], str(tmp_path), {"PATH": "/usr/bin:/bin"}), 0, time.time())
    attempts.start(state.job(job_id), placed(job_id), (), {"PATH": "/usr/bin:/bin"})
    failures = []
    real = state.record_peak

    def full_disk_once(*args):
        if not failures:
            failures.append(args)
            raise OSError(28, "No space left on device")
        real(*args)

    monkeypatch.setattr(state, "record_peak", full_disk_once)
    monkeypatch.setattr(attempts, "_measure", lambda a, now: setattr(a, "peak_mem", 1 << 20))
    _followed_until_ended(attempts, job_id)
    assert failures, "the peak's write failed once"
    assert job_id not in attempts.active, "left the active set once the write went through"
    job = state.job(job_id)
    assert job is not None and job.state == "succeeded"
    assert [e["kind"] for e in state.events(job_id)].count("succeeded") == 1, "its end written once"


def test_a_job_whose_supervisor_cannot_start_fails_and_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.place.needs import placed

    state = State(tmp_path)
    attempts = _attempts(state)
    job_id, _ = state.add_job(JobSpec(["true"], str(tmp_path)), 0, time.time())

    def cannot(a, what):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(attempts.launcher, "start", cannot)
    with pytest.raises(OSError):
        attempts.start(state.job(job_id), placed(job_id), (), {})
    assert job_id not in attempts.active
    state.fail(job_id, "could not start: Too many open files", time.time(), attempt=1)  # as the daemon does
    job = state.job(job_id)
    assert job is not None and job.state == "failed" and job.attempts[0].state == "lost"


# Every write of an attempt's start, and what failing there looks like (a full disk).
START_WRITES = ["spec", "state.start", "launcher.start", "update_attempt"]


@pytest.mark.parametrize("where", START_WRITES)
def test_a_full_disk_at_any_write_of_a_start_leaves_the_job_queued_then_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """ENOSPC at one write of the start path: the job is never failed for the disk's sake and
    never ``running`` without a process; it is queued again (at once, or by the next pass's
    reconcile) and, the disk taking writes again, runs and succeeds once."""
    import errno

    import tandem.place.attempts as attempts_module
    from tandem.place.run.supervisor.files import disk_trouble
    from tests.place.needs import placed

    state = State(tmp_path)
    attempts = _attempts(state)
    env = {"PATH": "/usr/bin:/bin"}
    job_id, _ = state.add_job(JobSpec(["sh", "-c", "echo x"], str(tmp_path), env), 0, time.time())
    full = OSError(errno.ENOSPC, "No space left on device")

    def failing(*args, **kwargs):
        raise full

    targets = {
        "spec": (attempts_module, "save"),
        "state.start": (state, "start"),
        "launcher.start": (attempts.launcher, "start"),
        "update_attempt": (state, "update_attempt"),
    }
    owner, name = targets[where]
    with monkeypatch.context() as patch:
        patch.setattr(owner, name, failing)
        try:  # as the daemon's pass does: the disk's failure puts the job back
            attempts.start(state.job(job_id), placed(job_id), (), env)
        except Exception as exc:
            assert disk_trouble(exc), exc
            attempts.put_back(job_id, f"could not start: {exc}", time.time())
        job = state.job(job_id)
        assert job is not None and job.state != "failed"
        if job.state == "running":  # its process runs (the write after its launch failed)
            assert job_id in attempts.active
    attempts.reconcile(time.time())  # the next pass, the disk taking writes again
    _followed_until_ended(attempts, job_id)
    job = state.job(job_id)
    assert job is not None
    if job.state in ("queued", "retrying"):  # put back: the next pass starts it again
        attempts.start(job, placed(job_id), (), env)
        _followed_until_ended(attempts, job_id)
        job = state.job(job_id)
    assert job is not None and job.state == "succeeded", job.state
    assert list(attempts.launcher.runs) == [(job_id, len(job.attempts))], "it was launched exactly once"
    assert all(a.state in ("succeeded", "lost") for a in job.attempts), [a.state for a in job.attempts]
