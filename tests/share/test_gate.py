"""The release gate: seqs go back to the producer only once their CUDA events completed."""

from __future__ import annotations

import pytest

from tandem.share import Consumer
from tandem.share._gate import ReleaseGate

from .workers import serve_range


class FakeEvent:
    """An event that completes when the test says so; counts blocking waits."""

    def __init__(self, done: bool = False):
        self.done = done
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def test_completed_events_release_in_order_and_a_pending_one_stops_the_scan():
    gate = ReleaseGate()
    first, second, third = FakeEvent(True), FakeEvent(False), FakeEvent(True)
    gate.hold(10, first)
    gate.hold(11, second)
    gate.hold(12, third)
    out: list[int] = []
    gate.collect(out)
    assert out == [10] and gate.oldest() == 11 and len(gate) == 2
    second.done = True
    gate.collect(out)
    assert out == [10, 11, 12] and gate.oldest() is None and len(gate) == 0


def test_polling_never_blocks_and_blocking_waits_for_every_event():
    gate = ReleaseGate()
    events = [FakeEvent() for _ in range(3)]
    for seq, event in enumerate(events):
        gate.hold(seq, event)
    out: list[int] = []
    gate.collect(out)
    assert out == [] and all(e.waited == 0 for e in events)
    gate.collect(out, block=True)
    assert out == [0, 1, 2] and all(e.waited == 1 for e in events)


def test_no_event_means_nothing_reads_the_slot():
    gate = ReleaseGate()
    gate.hold(3, None)
    gate.hold(4, FakeEvent(False))
    gate.hold(5, None)
    out: list[int] = []
    gate.collect(out)
    assert out == [3] and gate.oldest() == 4


class SlowEvent:
    """Completes after a few polls (as a GPU would, a while after the CPU moved on)."""

    def __init__(self, polls: int):
        self.left = polls
        self.synced = 0

    def query(self) -> bool:
        self.left -= 1
        return self.left < 0

    def synchronize(self) -> None:
        self.synced += 1
        self.left = -1


@pytest.mark.parametrize("table", ["1", "0"])
def test_held_releases_never_deadlock_a_consumer_with_a_small_window(procs, monkeypatch, table):
    """The consumer side of release-by-event, without a GPU: every finished batch is held
    behind an event that completes only after a few polls. With a window of 2 the producer
    soon waits for those very slots, so the consumer must hand them back (waiting for the
    events) before it waits for the producer, on either transport, or the epoch hangs."""
    monkeypatch.setenv("TANDEM_SHARE_TABLE", table)
    procs.start(serve_range, "gate", 120, 4, epochs=1, window=2)
    c = Consumer("gate", timeout=30, data_timeout=20)
    assert c.transport == ("table" if table == "1" else "socket")
    gate = ReleaseGate()
    reader = c._reader
    reader._gate = reader.channel._gate = gate  # what a GPU consumer has
    events: list[SlowEvent] = []

    def done_with_current() -> None:
        seq = reader._cur.msg.seq
        reader._segments.released(reader._cur.msg.segment.slot)
        reader._cur = None
        events.append(SlowEvent(polls=3))
        gate.hold(seq, events[-1])

    reader._done_with_current = done_with_current
    ids = [i for b in c for i in b["i"].tolist()]
    c.close()
    assert ids == list(range(120))
    # window 2 and events that need polls: the consumer must have waited for some of them
    assert any(e.synced for e in events), "the consumer never had to wait for its events"
