"""The request handlers as functions (:mod:`tandem.place.requests`): each takes its request
and the daemon's parts, returns its reply and what it changed (:class:`Changed`), and the
daemon sets its own flags from that. In-process, on a real state file, no socket: fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.place import protocol as p
from tandem.place.config import DaemonConfig
from tandem.place.daemon import Daemon
from tandem.place.model import DAEMON_PEER, Capacity, JobSpec
from tandem.place.requests import HANDLERS, NOTHING, Changed
from tandem.place.resources import Resources
from tandem.place.state import State
from tandem.share.spec import ShareSpec


@pytest.fixture
def daemon(tmp_path: Path):
    d = Daemon(State(tmp_path), Capacity(Resources(2.0, 8 << 30)), DaemonConfig(track=False, gpus="none"))
    d.wake = d.dirty = False
    yield d
    d.state.close()


def _flags(d: Daemon) -> tuple[bool, bool, bool]:
    return d.wake, d.dirty, d.stop_requested


def test_each_request_type_has_a_handler_of_request_and_parts() -> None:
    requests = {cls for cls in vars(p).values() if isinstance(cls, type) and hasattr(cls, "OP")}
    assert set(HANDLERS) == requests - {p.Wake}, "every request but a wake (which has no reply)"


def test_a_submit_queues_the_job_and_says_so_the_daemon_plans_at_once(daemon: Daemon) -> None:
    job = JobSpec(["true"], "/", cpus=0.5)
    reply, changed = HANDLERS[p.Submit](p.Submit(job), daemon.parts, DAEMON_PEER)
    assert isinstance(reply, p.Submitted) and changed == Changed(queued=True)
    assert _flags(daemon) == (False, False, False), "a handler sets none of the daemon's flags"
    assert daemon.state.job(reply.id) is not None
    assert isinstance(daemon.handle(p.Submit(job)), p.Submitted)
    assert _flags(daemon) == (True, True, False)


def test_a_refused_request_changes_nothing(daemon: Daemon) -> None:
    too_big = JobSpec(["true"], "/", cpus=64.0)
    reply, changed = HANDLERS[p.Submit](p.Submit(too_big), daemon.parts, DAEMON_PEER)
    assert isinstance(reply, p.Failure) and reply.refused and "64 cores" in reply.error
    assert changed == NOTHING and daemon.state.jobs() == []
    assert isinstance(daemon.handle(p.SubmitSweep(too_big, [])), p.Failure)
    assert _flags(daemon) == (False, False, False)


def test_a_submit_of_many_queues_all_or_none_naming_the_one_refused(daemon: Daemon) -> None:
    fits, too_big = JobSpec(["true"], "/", cpus=0.5), JobSpec(["true"], "/", cpus=64.0)
    reply, changed = HANDLERS[p.SubmitMany](p.SubmitMany([fits, fits, too_big]), daemon.parts, DAEMON_PEER)
    assert isinstance(reply, p.Failure) and reply.refused and reply.error.startswith("job 3 of 3: ")
    assert "64 cores" in reply.error and changed == NOTHING and daemon.state.jobs() == []
    wire = p.read_request(p.to_wire(p.SubmitMany([fits, JobSpec(["echo", "b"], "/", cpus=1.0)])))
    reply, changed = HANDLERS[p.SubmitMany](wire, daemon.parts, DAEMON_PEER)
    assert isinstance(reply, p.SweepSubmitted) and changed == Changed(queued=True)
    assert [daemon.state.job(i).command for i in reply.ids] == [["true"], ["echo", "b"]]  # type: ignore[union-attr]
    with pytest.raises(p.ProtocolError, match="list of job objects"):
        p.read_request({"op": "submit_many", "jobs": []})


def test_cancel_shares_status_and_stop_each_say_what_they_changed(daemon: Daemon) -> None:
    job_id = daemon.handle(p.Submit(JobSpec(["true"], "/", cpus=0.5))).id  # type: ignore[union-attr]
    daemon.wake = daemon.dirty = False
    reply, changed = HANDLERS[p.Cancel](p.Cancel([job_id]), daemon.parts, DAEMON_PEER)
    assert isinstance(reply, p.Cancelled) and reply.cancelled == [job_id] and changed == Changed(queue=True)
    spec = ShareSpec(name="s", source="dataset", ref="x:y")
    reply, changed = HANDLERS[p.DefineShare](p.DefineShare(spec), daemon.parts, DAEMON_PEER)
    assert isinstance(reply, p.ShareDefined) and changed == Changed(queued=True, shares=True)
    reply, changed = HANDLERS[p.RemoveShares](p.RemoveShares(["s"]), daemon.parts, DAEMON_PEER)
    assert isinstance(reply, p.SharesRemoved) and reply.removed == ["s"] and changed == Changed(shares=True)
    reply, changed = HANDLERS[p.Status](p.Status(), daemon.parts, DAEMON_PEER)
    assert isinstance(reply, p.DaemonStatus) and changed == NOTHING and reply.capacity.total.cores == 2.0
    assert _flags(daemon) == (False, False, False)
    daemon.handle(p.RemoveShares(["s"]))
    assert _flags(daemon) == (False, True, False), "a pass is due, not at once"
    assert isinstance(daemon.handle(p.Stop()), p.Stopping) and daemon.stop_requested


def test_a_job_and_its_shares_producer_are_reserved_together(daemon: Daemon) -> None:
    """What a job of a share needs is its own and its producer's (it starts it): refused where
    the two do not fit together, with the producer's part said."""
    daemon.handle(p.DefineShare(ShareSpec(name="s", source="dataset", ref="x:y", cpus=1.5)))
    alone = HANDLERS[p.Submit](p.Submit(JobSpec(["true"], "/", cpus=1.0)), daemon.parts, DAEMON_PEER)[0]
    assert isinstance(alone, p.Submitted)
    reply, changed = HANDLERS[p.Submit](
        p.Submit(JobSpec(["true"], "/", cpus=1.0, share="s")), daemon.parts, DAEMON_PEER
    )
    assert isinstance(reply, p.Failure) and reply.refused and changed == NOTHING
    assert "asks for 2.5 cores" in reply.error and "producer reserves 1.5 cores" in reply.error, reply.error
    fits = HANDLERS[p.Submit](
        p.Submit(JobSpec(["true"], "/", cpus=0.5, share="s")), daemon.parts, DAEMON_PEER
    )[0]
    assert isinstance(fits, p.Submitted)


def test_a_request_that_raised_is_answered_with_what_went_wrong(tmp_path: Path) -> None:
    from tandem.place.identity import StateMoved
    from tandem.place.requests import failure

    refused = failure(p.ProtocolError("unknown request 'x'"), "x", tmp_path)
    assert refused == p.Failure("refused: unknown request 'x'", refused=True)
    assert failure(StateMoved("place.db was removed"), "submit", tmp_path) == p.Failure(
        "place.db was removed"
    )
    full = failure(OSError(28, "No space left on device"), "submit", tmp_path)
    assert full.disk and not full.refused and f"the disk of {tmp_path} would not take it" in full.error
    assert failure(RuntimeError("boom"), "submit", tmp_path) == p.Failure("RuntimeError: boom")
