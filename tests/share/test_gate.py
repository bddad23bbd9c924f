"""The release gate: seqs go back to the producer only once their CUDA events completed."""

from __future__ import annotations

from tandem.share._gate import ReleaseGate


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
