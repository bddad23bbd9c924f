"""The producer's window: the published entries, the slots they occupy, and the pacing policy.

Pure state: no locks, sockets, threads or clocks. The producer holds its lock around every
call; the unit tests drive it directly. Consumers appear here only as *links*
(:mod:`tandem.share._transport`), which say where each one's cursor is, below which seq it
has released everything, and which seqs it still holds, whatever its transport.

Invariants (checked by ``tests/share/test_window.py``):

* ``entries`` holds consecutive-by-publication entries in seq order; ``next_seq`` is one past
  the last published seq. Once ``end_seq`` is set (``End`` or ``Failed`` published) nothing
  more is published, and that entry is never evicted.
* Every slot is either in ``free`` or named by exactly one live batch entry.
* ``"wait"``: an entry is evicted only once every attached consumer has released it (its
  ``released_below`` has passed it), so no consumer ever misses an entry.
* ``"skip"``: an entry is never evicted while a consumer holds it. When a slot is needed and
  none is free, the oldest entry that the fastest consumer has taken and nobody holds is
  evicted; consumers whose cursor had not reached it miss it (:meth:`Window.take_slot`
  returns who). The window grows instead, up to ``slot_cap``, when no such entry exists.
* Under "wait", at most ``ahead`` entries are published past the fastest consumer's cursor
  (the producer's memory-sized window: :data:`AHEAD_SLOTS`; a window given in batches: no
  bound but its size).
* With no consumer attached nothing is evicted: the first consumer to attach gets the window;
  and at most :data:`IDLE_SLOTS` entries are made ahead (more would be read by the first
  consumer alone).
* Slots are numbered as they are first needed: ``slots`` never passes ``size`` under "wait"
  (nor ``slot_cap`` under "skip") unless ``size`` shrank after they were numbered or slots
  are ``retained`` for a set-aside consumer (one more numbered for each), and
  ``size`` never passes ``cap``. The producer sets
  ``size`` from memory once it knows a batch's bytes (:func:`slots_for`); consumers of
  different speeds drift apart within it and wait only where it is full.
"""

from __future__ import annotations

import collections
from collections.abc import Collection
from dataclasses import dataclass

from tandem.share._transport import Link
from tandem.share.protocol import Batch, End, EntryKind, EpochEnd, Failed, Segment

PACING_POLICIES = ("wait", "skip")

Position = tuple[int, int]


@dataclass(slots=True, kw_only=True)
class Entry:
    seq: int
    kind: EntryKind
    epoch: int
    offset: int
    count: int = 0  # samples (batches only)
    slot: int | None = None  # the slab slot (batches only)
    message: object = None  # the protocol message sent for it (a segment's fd goes beside it)


MIN_SLOTS = 2  # one batch read while the next is written
MAX_SLOTS = 64  # a memory-sized window's most batches (each slot's segment is an fd per consumer)
# Batches made ahead while no consumer is attached. A whole window made before anyone
# attaches is read by the first consumer alone (joiners a moment later start where production
# is, and the producer makes those epochs again for them), and it takes the cores that the
# starting jobs need: an 8-trial sweep's producer made 2.7 epochs while its jobs imported
# torch, then 7 epochs in all for a 3-epoch sweep.
IDLE_SLOTS = 4
# Batches made ahead of the fastest consumer in a memory-sized window ("wait"). The window
# bounds how far consumers drift apart; made further ahead than this, batches wait for a
# reader that may never come: when a sweep's jobs end their last epoch, everything made
# past them is thrown away (an 8-trial sweep's producer: up to 64 batches, 2.7 epochs).
AHEAD_SLOTS = 8


def slots_for(budget: int, slot_bytes: int, cap: int) -> int:
    """How many slots of ``slot_bytes`` a window of ``budget`` bytes holds: at least
    :data:`MIN_SLOTS`, at most ``cap``."""
    fits = budget // slot_bytes if slot_bytes > 0 else cap
    return max(MIN_SLOTS, min(cap, fits))


class Window:
    """Entries published and not yet evicted, and the slots they hold."""

    def __init__(self, policy: str, slots: int, cap: int | None = None, ahead: int | None = None):
        if policy not in PACING_POLICIES:
            raise ValueError(f"policy must be one of {PACING_POLICIES}, got {policy!r}")
        self.policy = policy
        self.cap = max(slots, cap or slots)  # the most ``size`` may become
        self.size = slots  # the window: slots in use ("wait"), ahead of the fastest ("skip")
        self.ahead = ahead  # "wait": the most entries published past the fastest consumer
        self.slots = 0  # slots numbered so far ("skip" may grow it past ``size``)
        # Slots set-aside consumers may still read (see ControlServer.set_aside), with how
        # many of them may: never reused while one may, and new ones numbered in their place.
        self.retained: collections.Counter[int] = collections.Counter()
        self.entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()
        self.free: list[int] = []
        self.next_seq = 0
        self.end_seq: int | None = None
        # where production is: the epoch being produced and the samples published in it
        self.epoch = 0
        self.offset = 0
        self.epoch_done = False
        # the stream's shape, when known (a consumer's len() needs it)
        self.samples_per_epoch: int | None = None
        self.batch_size: int | None = None
        # joining: the epochs a producer will serve in full, and whether it takes joiners
        self.full_epochs: float = float("inf")
        self.open_to_joiners = True

    # ------------------------------------------------------------------------ publishing
    def publish(self, entry: Entry) -> None:
        if self.end_seq is not None:
            raise RuntimeError(f"entry {entry.seq} published after the end ({self.end_seq})")
        if entry.seq != self.next_seq:
            raise RuntimeError(f"entry {entry.seq} published out of order (next is {self.next_seq})")
        self.entries[entry.seq] = entry
        self.next_seq = entry.seq + 1
        if entry.kind in (EntryKind.END, EntryKind.FAILED):
            self.end_seq = entry.seq
        elif entry.kind == EntryKind.BATCH:
            self.offset = entry.offset + entry.count
        else:
            self.epoch_done = True
            if self.samples_per_epoch is None:
                self.samples_per_epoch = entry.offset

    # entries to publish next (the caller publishes them)
    def batch_entry(
        self, epoch: int, offset: int, count: int, segment: Segment, meta_offset: int, meta_len: int
    ) -> Entry:
        message = Batch(
            seq=self.next_seq,
            epoch=epoch,
            offset=offset,
            count=count,
            segment=segment,
            meta_offset=meta_offset,
            meta_len=meta_len,
        )
        return Entry(
            seq=self.next_seq,
            kind=EntryKind.BATCH,
            epoch=epoch,
            offset=offset,
            count=count,
            slot=segment.slot,
            message=message,
        )

    def epoch_end_entry(self, epoch: int, samples: int) -> Entry:
        message = EpochEnd(seq=self.next_seq, epoch=epoch, samples=samples)
        return Entry(
            seq=self.next_seq, kind=EntryKind.EPOCH_END, epoch=epoch, offset=samples, message=message
        )

    def end_entry(self, reason: str, finished: bool) -> Entry:
        seq, epoch, offset = self.next_seq, self.epoch, self.offset
        message = End(seq=seq, epoch=epoch, offset=offset, reason=reason, finished=finished)
        return Entry(seq=seq, kind=EntryKind.END, epoch=epoch, offset=offset, message=message)

    def failed_entry(self, text: str) -> Entry:
        message = Failed(seq=self.next_seq, message=text)
        return Entry(
            seq=self.next_seq, kind=EntryKind.FAILED, epoch=self.epoch, offset=self.offset, message=message
        )

    def next_live(self, seq: int) -> int:
        """The first seq at or after ``seq`` still in the window (under "skip" the consumer's
        cursor may point at evicted entries: it moves over them)."""
        if self.policy == "skip":
            while seq < self.next_seq and seq not in self.entries:
                seq += 1
        return seq

    # ------------------------------------------------------------------------- slots
    def take_slot(self, links: Collection[Link], slot_cap: int) -> tuple[int | None, Entry | None]:
        """A slot for the next batch, or None while the policy says wait.

        Returns ``(slot, skipped)``: ``skipped`` is the entry evicted under "skip" although
        some consumer had not taken it (those with ``cursor <= skipped.seq`` missed it).
        A slot equal to the old ``slots`` is a new one: the caller grows the slab.
        """
        skipped = self._evict(links)
        if not self._policy_allows(links):
            return None, skipped
        if self.free:
            return self.free.pop(), skipped
        if self.slots < self.size + len(self.retained) or (self.policy == "skip" and self.slots < slot_cap):
            self.slots += 1
            return self.slots - 1, skipped
        return None, skipped

    def _policy_allows(self, links: Collection[Link]) -> bool:
        if not links:
            return self.slots - len(self.free) < min(self.size, IDLE_SLOTS)
        fastest = max(link.cursor() for link in links)
        if self.policy == "wait":
            return self.ahead is None or self.next_seq - fastest < self.ahead
        return self.next_seq - fastest < self.size  # "skip": keep pace with the fastest

    def _evict(self, links: Collection[Link]) -> Entry | None:
        if not links:
            return None  # keep the window for the first consumer to attach
        if self.policy == "wait":
            below = min(link.released_below() for link in links)
            for seq in list(self.entries):
                if seq >= below or self.entries[seq].kind in (EntryKind.END, EntryKind.FAILED):
                    break
                self._drop(seq)
            return None
        slowest = min(link.cursor() for link in links)
        for seq in list(self.entries):
            entry = self.entries[seq]
            if entry.kind in (EntryKind.END, EntryKind.FAILED):
                break
            if seq < slowest and not any(link.holds(seq) for link in links):
                self._drop(seq)
        if self.free or self.slots < self.size:
            return None
        # Reuse the oldest slot the fastest consumer has taken and nobody reads now;
        # consumers that had not taken it miss it. Without one, take_slot grows the slab.
        fastest = max(link.cursor() for link in links)
        for seq, entry in self.entries.items():
            if seq >= fastest:
                return None
            if entry.slot is not None and not any(link.holds(seq) for link in links):
                self._drop(seq)
                return entry
        return None

    def _drop(self, seq: int) -> None:
        entry = self.entries.pop(seq)
        if entry.slot is not None and entry.slot not in self.retained:
            self.free.append(entry.slot)

    def retain(self, slots: Collection[int]) -> None:
        """Keep ``slots`` from reuse until :meth:`unretain` (a set-aside consumer reads them;
        each retain of a slot is undone by one unretain: two consumers may hold one slot)."""
        self.retained.update(slots)

    def unretain(self, slots: Collection[int]) -> None:
        """One consumer no longer reads ``slots``: each may be reused once no other does,
        at once if its entry is gone."""
        live = {entry.slot for entry in self.entries.values()}
        for slot in slots:
            if self.retained[slot] > 1:
                self.retained[slot] -= 1
            elif self.retained.pop(slot, 0) and slot not in live:
                self.free.append(slot)

    def resize(self, size: int) -> None:
        """Set the window's size in slots (kept within ``MIN_SLOTS..cap``). Slots already
        numbered stay in use (their memory is held already): a smaller size stops growth."""
        self.size = max(MIN_SLOTS, min(self.cap, size))

    def drift(self, links: Collection[Link]) -> int:
        """Entries between the fastest consumer's cursor and the slowest's (0 with fewer than two)."""
        if len(links) < 2:
            return 0
        cursors = [link.cursor() for link in links]
        return max(cursors) - min(cursors)

    def holds_back(self, link: Link) -> bool:
        """Whether this consumer keeps the oldest entry in the window (it has not taken it,
        or still holds it): who to name in "waiting for ..." messages."""
        return link.released_below() <= next(iter(self.entries), self.next_seq)

    # ------------------------------------------------------------------------- joining
    def join_point(self) -> tuple[int, Position] | None:
        """Where a new consumer starts: ``(cursor, (epoch, offset))``, or None when no full
        epoch is left for it.

        Preferably at the oldest epoch start still in the window (nothing is cut); else at
        the oldest entry of the epoch being produced, whose offset becomes a cut for the
        epochs planned after it (see :mod:`tandem.share._order`).
        """
        for entry in self.entries.values():
            if entry.kind == EntryKind.BATCH and entry.offset == 0 and entry.epoch < self.full_epochs:
                return entry.seq, (entry.epoch, 0)
            if entry.kind == EntryKind.EPOCH_END and entry.epoch + 1 < self.full_epochs:
                return entry.seq, (entry.epoch + 1, 0)
        if self.end_seq is not None or not self.open_to_joiners:
            return None
        for entry in self.entries.values():
            if entry.epoch == self.epoch:
                return entry.seq, (self.epoch, entry.offset)
        if self.epoch_done:
            return self.next_seq, (self.epoch + 1, 0)
        return self.next_seq, (self.epoch, self.offset)
