"""A supervisor's fence (tandem.place.run.supervisor.fence), in this process with its delay shortened:
it signals its process (as if the supervisor's actor had died) only when its heartbeat
cannot be written *and* the Ray head does not answer; a node that lost only one of the two
is left running. The fence of a real supervisor on a node cut off from both is in
tests/place/test_ray_nodes_lost.py."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.place.run.supervisor import fence
from tandem.place.run.supervisor.files import ORPHAN_SIGNAL
from tests.timing import scaled, until


@pytest.fixture
def signalled(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    monkeypatch.setattr(fence, "FENCE_S", 2.0)  # a loaded machine may hold a thread back for a second
    monkeypatch.setattr(fence, "EVERY_S", 0.1)
    got = threading.Event()
    before = signal.signal(ORPHAN_SIGNAL, lambda *_: got.set())
    try:
        yield got
    finally:
        signal.signal(ORPHAN_SIGNAL, before)


@pytest.fixture
def head() -> Iterator[str]:
    """An address that answers, as a Ray head does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


def _quiet_long_enough(f: fence.Fence) -> bool:
    return time.monotonic() - f.written > 3 * fence.FENCE_S


def test_no_write_and_no_head_stops_the_job(signalled: threading.Event, tmp_path: Path) -> None:
    f = fence.Fence(tmp_path / "gone", "127.0.0.1:1")  # a folder that is not there: every write fails
    f.start()
    try:
        until(signalled.is_set, 30, lambda: f"no fence: {f.why}")
        assert f.why is not None and "does not answer" in f.why and "127.0.0.1:1" in f.why
    finally:
        f.stop()


def test_a_node_that_lost_only_the_disk_is_not_fenced(
    signalled: threading.Event, tmp_path: Path, head: str
) -> None:
    f = fence.Fence(tmp_path / "gone", head)  # Ray still has the node: the daemon does not run it again
    f.start()
    try:
        until(lambda: _quiet_long_enough(f), 30, lambda: "the heartbeat went through")
        assert not signalled.is_set() and f.why is None
    finally:
        f.stop()


def test_a_node_that_lost_only_the_cluster_is_not_fenced(signalled: threading.Event, tmp_path: Path) -> None:
    f = fence.Fence(tmp_path, "127.0.0.1:1")  # its writes go through: the daemon follows it there
    f.start()
    try:
        start = time.monotonic()
        until(
            lambda: (tmp_path / fence.HEARTBEAT).exists() and f.written > start + 5 * fence.FENCE_S, 30, str
        )
        assert not signalled.is_set() and f.why is None
    finally:
        f.stop()


def test_a_fence_stopped_while_it_looks_at_the_head_signals_nothing(
    signalled: threading.Event, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its supervisor stops it while its look at the head is under way (the head does not
    answer): ``stop`` returns once that look has ended, and no signal comes (after ``stop``,
    the supervisor may have put SIGUSR1's default back: a signal then would kill it)."""
    looking, answer = threading.Event(), threading.Event()

    def slow_refusal(address: str, timeout: float) -> str:
        looking.set()
        answer.wait(30)
        return "refused"

    monkeypatch.setattr(fence, "unreachable", slow_refusal)
    f = fence.Fence(tmp_path / "gone", "127.0.0.1:1")  # every write fails: it looks at the head
    f.start()
    until(looking.is_set, 30, "the fence never looked at the head")
    stopping = threading.Thread(target=f.stop)
    stopping.start()
    until(lambda: f._done.is_set(), 10, "stop() did not say so")
    assert stopping.is_alive()  # it waits for the look under way
    answer.set()
    stopping.join(scaled(10))
    assert not stopping.is_alive() and not signalled.is_set() and f.why is None


def test_outside_ray_there_is_no_fence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fence.FENCE_GCS, raising=False)
    assert fence.start_fence(tmp_path) is None
    monkeypatch.setenv(fence.FENCE_GCS, "127.0.0.1:1")
    f = fence.start_fence(tmp_path)
    assert f is not None and fence.FENCE_GCS not in os.environ  # its job does not inherit it
    f.stop()
