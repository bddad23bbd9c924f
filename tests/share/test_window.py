"""The producer's window as pure state: pacing, eviction, skips, join points (no processes)."""

from __future__ import annotations

import random

import pytest

from tandem.share._table import AnnouncementTable, ConsumerRecord
from tandem.share._transport import SocketLink, TableLink
from tandem.share._window import AHEAD_SLOTS, IDLE_SLOTS, MIN_SLOTS, Window, slots_for
from tandem.share.protocol import EntryKind, Segment


def _publish_batch(w: Window, slot: int, count: int = 4) -> int:
    seg = Segment(kind="host", segment_id=slot, slot=slot, size=1 << 20)
    entry = w.batch_entry(w.epoch, w.offset, count, seg, 0, 0)
    w.publish(entry)
    return entry.seq


def _fill(w: Window, links: list, n: int, cap: int) -> None:
    """Publish ``n`` batches, each into the slot the window gives."""
    for _ in range(n):
        slot, _ = w.take_slot(links, cap)
        _publish_batch(w, slot)


def _take(link: SocketLink, w: Window) -> int:
    """The consumer takes the entry at its cursor (as the control thread sends it)."""
    seq = w.next_live(link.cursor())
    e = w.entries[seq]
    link.sent(seq, e.kind, (e.epoch, e.offset + e.count))
    return seq


def _check_slots(w: Window) -> None:
    """Every slot is free or named by exactly one live batch entry."""
    used = [e.slot for e in w.entries.values() if e.kind == EntryKind.BATCH]
    assert len(used) == len(set(used)), "a slot named twice"
    assert not set(used) & set(w.free), "a live entry's slot is free"
    assert sorted(used + w.free) == list(range(w.slots)), "a slot lost"


def test_wait_reuses_a_slot_only_once_every_consumer_released_it():
    w = Window("wait", 2)
    a, b = SocketLink(0, (0, 0)), SocketLink(0, (0, 0))
    _fill(w, [a, b], 2, 99)
    assert w.take_slot([a, b], 99) == (None, None), "window full"
    assert _take(a, w) == 0 and _take(a, w) == 1
    a.released((0, 1))
    assert w.take_slot([a, b], 99)[0] is None, "b has not taken entry 0: it must not be reused"
    assert w.holds_back(b) and not w.holds_back(a), "b is the one to name in 'waiting for'"
    assert _take(b, w) == 0
    assert w.take_slot([a, b], 99)[0] is None, "b holds entry 0"
    b.released((0,))
    slot, skipped = w.take_slot([a, b], 99)
    assert slot is not None and skipped is None
    assert 0 not in w.entries and 1 in w.entries
    _publish_batch(w, slot)  # a slot taken is the producer's until it publishes the batch
    _check_slots(w)


def test_a_slot_two_set_aside_consumers_hold_is_reused_only_once_both_let_it_go():
    """Consumers set aside keep the slots they may still read (new ones are numbered in
    their place); a slot both of them hold is free only once neither does."""
    w = Window("wait", 2)
    a, b, c = (SocketLink(0, (0, 0)) for _ in range(3))
    _fill(w, [a, b, c], 2, 99)
    for link in (a, b):
        assert _take(link, w) == 0
    held = w.entries[0].slot
    w.retain([held])  # a set aside holding entry 0
    w.retain([held])  # b too
    assert _take(c, w) == 0 and _take(c, w) == 1
    c.released((0, 1))
    slot, _ = w.take_slot([c], 99)  # the others are out of the pacing: entry 0 goes
    assert slot is not None and slot != held and 0 not in w.entries, "a held slot was reused"
    _publish_batch(w, slot)
    w.unretain([held])  # a lets it go: b still reads it
    assert held not in w.free
    w.unretain([held])
    assert held in w.free
    _check_slots(w)


def test_without_consumers_nothing_is_evicted_the_first_one_gets_the_window():
    w = Window("skip", 3)
    cap = w.size + 1  # the producer's cap with no consumer: one slot to grow into
    _fill(w, [], 4, cap)
    assert w.take_slot([], cap) == (None, None)
    assert list(w.entries) == [0, 1, 2, 3]
    assert w.join_point() == (0, (0, 0))


def test_skip_keeps_pace_with_the_fastest_and_the_slow_one_is_told_what_it_missed():
    w = Window("skip", 2)
    fast, slow = SocketLink(0, (0, 0)), SocketLink(0, (0, 0))
    _fill(w, [fast, slow], 2, 5)
    assert w.take_slot([fast, slow], 5)[0] is None, "the fastest has taken nothing: wait"
    _take(fast, w)
    fast.released((0,))
    slot, skipped = w.take_slot([fast, slow], 5)
    assert skipped is not None and skipped.seq == 0, "entry 0 is reused; the slow one had not taken it"
    assert slow.cursor() <= skipped.seq
    _publish_batch(w, slot)
    assert w.next_live(slow.cursor()) == 1, "the slow consumer moves over the evicted entry"
    _check_slots(w)


def test_skip_never_evicts_a_held_entry_and_grows_up_to_the_cap_instead():
    w = Window("skip", 2)
    a = SocketLink(0, (0, 0))
    _fill(w, [a], 2, 3)
    _take(a, w)
    _take(a, w)  # holds both
    slot, skipped = w.take_slot([a], 3)
    assert (slot, skipped) == (2, None), "a new slot, nothing evicted"
    _publish_batch(w, slot)
    assert w.take_slot([a], 3) == (None, None), "at the cap, with every entry held: wait"
    assert set(w.entries) == {0, 1, 2}
    _check_slots(w)


def test_end_is_never_evicted_and_nothing_follows_it():
    w = Window("wait", 2)
    a = SocketLink(0, (0, 0))
    slot, _ = w.take_slot([a], 9)
    _publish_batch(w, slot)
    w.publish(w.end_entry("done", finished=True))
    assert w.end_seq == 1
    _take(a, w)
    a.released((0,))
    a.sent(1, EntryKind.END, (0, 4))
    w.take_slot([a], 9)
    assert list(w.entries) == [1], "the batch is evicted, the end stays"
    with pytest.raises(RuntimeError, match="after the end"):
        _publish_batch(w, 0)


def test_join_points_prefer_an_epoch_start_then_cut_then_refuse():
    w = Window("wait", 8)
    _fill(w, [], 2, 99)
    assert w.join_point() == (0, (0, 0)), "epoch 0's start is still in the window"
    w.entries.pop(0)
    w.free.append(0)
    assert w.join_point() == (1, (0, 4)), "mid-epoch: at the oldest entry, cutting at offset 4"
    w.publish(w.epoch_end_entry(0, 8))
    assert w.samples_per_epoch == 8 and w.epoch_done
    w.full_epochs = 1
    assert w.join_point() == (1, (0, 4)), "no epoch start left within the epochs to serve: cut"
    w.open_to_joiners = False
    assert w.join_point() is None, "closed to joiners and no full epoch left"


def test_table_link_reads_cursor_and_releases_from_the_consumer_record():
    table = AnnouncementTable.create("test", 16, 4)
    try:
        table.reset_consumer(2, 5)
        link = TableLink(table, 2)
        assert (link.cursor(), link.released_below()) == (5, 5)
        table.write_consumer(
            2, ConsumerRecord(taken=9, released=7, stall_s=1.5, samples=40, batches=4, epoch=1, offset=8)
        )
        assert (link.cursor(), link.released_below()) == (9, 7)
        assert link.holds(7) and link.holds(8) and not link.holds(9) and not link.holds(6)
        assert link.progress().stall_s == 1.5
        w = Window("wait", 2)
        w.next_seq = 9
        assert w.take_slot([link], 9)[0] is not None
    finally:
        table.close()


@pytest.mark.parametrize("policy", ["wait", "skip"])
def test_random_runs_keep_the_invariants(policy):
    rng = random.Random(7)
    w = Window(policy, 3)
    links = [SocketLink(0, (0, 0)) for _ in range(3)]
    taken: dict[int, list[int]] = {i: [] for i in range(3)}
    for _ in range(600):
        i = rng.randrange(3)
        link = links[i]
        op = rng.random()
        if op < 0.4:
            slot, skipped = w.take_slot(links, w.size + 2 * len(links) + 1)
            if slot is not None:
                _publish_batch(w, slot)
        elif op < 0.8 and w.next_live(link.cursor()) in w.entries:
            taken[i].append(_take(link, w))
        elif taken[i]:
            link.released((taken[i].pop(0),))
        _check_slots(w)
        for j, other in enumerate(links):
            for seq in taken[j]:
                assert seq in w.entries, "an entry a consumer holds was evicted"
            if policy == "wait":
                assert all(s in w.entries for s in range(other.cursor(), w.next_seq)), "wait: nothing missed"


def test_a_memory_sized_window_lets_consumers_drift_apart_until_it_is_full():
    # a bound of 5 slots' bytes: the fast consumer runs 5 batches ahead of one that took nothing
    w = Window("wait", MIN_SLOTS, cap=64)
    assert (w.slots, w.free) == (0, []), "slots are numbered as they are first needed"
    w.resize(slots_for(5 << 20, 1 << 20, w.cap))
    assert w.size == 5
    fast, slow = SocketLink(0, (0, 0)), SocketLink(0, (0, 0))
    for _ in range(5):
        slot, _ = w.take_slot([fast, slow], 99)
        assert slot is not None
        _publish_batch(w, slot)
        _take(fast, w)
        fast.released((fast.cursor() - 1,))
    assert w.drift([fast, slow]) == 5 and w.drift([fast]) == 0
    assert w.take_slot([fast, slow], 99) == (None, None), "full: the memory ran out"
    _take(slow, w)
    slow.released((0,))
    slot, _ = w.take_slot([fast, slow], 99)
    assert slot == 0, "the slowest released the oldest: its slot again"
    _publish_batch(w, slot)
    _check_slots(w)


def test_a_memory_sized_window_is_made_only_a_few_batches_ahead_of_the_fastest_consumer():
    # The window (32 slots) is room for drift; past the fastest reader, batches wait for a
    # reader that may never come (a sweep's last epoch): at most AHEAD_SLOTS are made there.
    w = Window("wait", 32, ahead=AHEAD_SLOTS)
    fast, slow = SocketLink(0, (0, 0)), SocketLink(0, (0, 0))
    made = 0
    while w.take_slot([fast, slow], 99)[0] is not None:
        _publish_batch(w, made)
        made += 1
        assert made <= 32, "no bound"
    assert made == AHEAD_SLOTS, "made ahead of a fastest consumer that took nothing"
    for _ in range(3):
        _take(fast, w)
    _fill(w, [fast, slow], 3, 99)  # the fastest took three: three more may be made
    assert w.take_slot([fast, slow], 99) == (None, None)
    assert w.drift([fast, slow]) == 3 and w.next_seq - fast.cursor() == AHEAD_SLOTS
    _check_slots(w)
    given = Window("wait", 32)  # a window given in batches: made that far ahead
    _fill(given, [SocketLink(0, (0, 0))], 32, 99)
    assert given.take_slot([SocketLink(0, (0, 0))], 99)[0] is None


def test_slots_for_a_budget():
    assert slots_for(100 << 20, 1 << 20, 64) == 64, "at most the cap"
    assert slots_for(10 << 20, 1 << 20, 64) == 10
    assert slots_for(1 << 20, 4 << 20, 64) == MIN_SLOTS, "at least two, however large a batch"
    w = Window("wait", MIN_SLOTS, cap=8)
    w.resize(100)
    assert w.size == 8


@pytest.mark.parametrize("policy", ["wait", "skip"])
def test_with_no_consumer_attached_only_a_few_batches_are_made_ahead(policy: str) -> None:
    # A whole window made before anyone attaches is read by the first consumer alone; the
    # jobs attaching a moment later start where production is, and the producer makes those
    # epochs again for them (an 8-trial sweep: 7 epochs made for 3).
    w = Window(policy, 32)
    made = 0
    while w.take_slot([], 99)[0] is not None:
        _publish_batch(w, made)
        made += 1
        assert made <= 32, "no bound"
    assert made == IDLE_SLOTS
    link = SocketLink(0, (0, 0))  # a consumer attaches: the window grows as it reads
    slot, _ = w.take_slot([link], 99)
    assert slot == IDLE_SLOTS
    _publish_batch(w, slot)
    _check_slots(w)
    small = Window(policy, MIN_SLOTS)  # a window smaller than that: its own size bounds it
    _fill(small, [], MIN_SLOTS, 99)
    assert small.take_slot([], 99)[0] is None
