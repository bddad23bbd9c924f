"""How the producer sees each attached consumer's progress: one *link* per consumer.

The pacing policies (:mod:`tandem.share._window`) ask every consumer the same questions:
where is its cursor (the next seq it will take), below which seq has it released
everything, does it still hold a given seq. A link answers them whichever transport the
consumer uses (see :mod:`tandem.share.protocol`), so policy code never asks which it has:

:class:`TableLink`
    The consumer keeps its cursor, releases and statistics in its record of the
    announcement table; the producer reads them there.
:class:`SocketLink`
    The producer keeps them itself: the cursor moves when an entry is sent, a batch is held
    from then until a ``Next``/``Release`` hands it back, and ``Next`` brings the statistics.

Links are plain state, without sockets or locks; the producer's lock guards them.
"""

from __future__ import annotations

from typing import Protocol

from tandem.share._table import AnnouncementTable, ConsumerRecord
from tandem.share.protocol import EntryKind


class Link(Protocol):
    transport: str

    def cursor(self) -> int:
        """The next seq this consumer will take."""

    def released_below(self) -> int:
        """Every seq below this one is released by this consumer."""

    def holds(self, seq: int) -> bool:
        """Whether this consumer may still be reading entry ``seq``."""

    def sent(self, seq: int, kind: EntryKind, end: tuple[int, int]) -> None:
        """Entry ``seq`` went to this consumer over its socket; ``end`` is the stream
        position after it."""

    def released(self, seqs: tuple[int, ...]) -> None:
        """The consumer handed back ``seqs`` over its socket."""

    def reported(self, stall_s: float, samples: int, batches: int) -> None:
        """Statistics that came with a ``Next``."""

    def progress(self) -> ConsumerRecord:
        """Cursor, releases, statistics and position, for ``tandem share ls``."""


class SocketLink:
    """A consumer reached through its socket only: the producer keeps its state."""

    transport = "socket"

    def __init__(self, cursor: int, position: tuple[int, int]):
        self._cursor = cursor
        self._holds: set[int] = set()
        self._position = position
        self._stall_s = 0.0
        self._samples = 0
        self._batches = 0

    def cursor(self) -> int:
        return self._cursor

    def released_below(self) -> int:
        return min(self._holds, default=self._cursor)

    def holds(self, seq: int) -> bool:
        return seq in self._holds

    def sent(self, seq: int, kind: EntryKind, end: tuple[int, int]) -> None:
        if kind == EntryKind.BATCH:
            self._holds.add(seq)
        if kind in (EntryKind.BATCH, EntryKind.EPOCH_END):
            self._position = end
            self._cursor = seq + 1

    def released(self, seqs: tuple[int, ...]) -> None:
        self._holds.difference_update(seqs)

    def reported(self, stall_s: float, samples: int, batches: int) -> None:
        self._stall_s, self._samples, self._batches = stall_s, samples, batches

    def progress(self) -> ConsumerRecord:
        return ConsumerRecord(
            taken=self._cursor,
            released=self.released_below(),
            stall_s=self._stall_s,
            samples=self._samples,
            batches=self._batches,
            epoch=self._position[0],
            offset=self._position[1],
        )


class TableLink:
    """A consumer that keeps its cursor and releases in its announcement-table record.

    It releases in order and never releases what it has not taken, so it holds exactly the
    seqs from ``released`` up to its cursor.
    """

    transport = "table"

    def __init__(self, table: AnnouncementTable, index: int):
        self._table = table
        self.index = index

    def cursor(self) -> int:
        return self._table.taken(self.index)

    def released_below(self) -> int:
        return self._table.released(self.index)

    def holds(self, seq: int) -> bool:
        return self.released_below() <= seq < self.cursor()

    def sent(self, seq: int, kind: EntryKind, end: tuple[int, int]) -> None:
        pass  # the consumer moves its own cursor when the reply arrives

    def released(self, seqs: tuple[int, ...]) -> None:
        pass  # the consumer's record says it

    def reported(self, stall_s: float, samples: int, batches: int) -> None:
        pass  # the consumer's record says it

    def progress(self) -> ConsumerRecord:
        return self._table.consumer(self.index)
