"""The announcement table: a small shared-memory table that makes the steady-state hand-off free
of system calls under the default ``"wait"`` policy.

It lives in one ``memfd`` per producer, mapped by every consumer whose transport is
``"table"`` (its fd rides along with ``Welcome``), and has two parts:

*ring*
    The producer announces each published batch and epoch end in record ``seq % capacity``:
    it first marks the record invalid, then writes the fields, then the ``seq``. A consumer
    reads ``seq``, the fields and ``seq`` again, and accepts the record only if both reads
    give the ``seq`` it wants; anything else (not yet published, overwritten, being
    written) sends it down the socket path, where the producer's own table is the truth.
*consumer records*
    One per attached consumer, written by that consumer only: ``taken`` (its cursor: the
    next ``seq`` it will take), ``released`` (every ``seq`` below it is released) and its
    statistics. The producer reads them to know which slots it may reuse: under ``"wait"``
    an entry's slot is reused once every consumer's ``released`` has passed it, and since a
    consumer never releases what it has not taken, an entry a consumer may still take is
    never reused under it.
*aside flags*
    One per consumer record, written by the producer only: set when it sets the consumer
    aside (it took nothing for a while, see :mod:`tandem.share._control`); from then on the
    ring's entries may be reused under that consumer, so it takes none of them (it checks
    the flag before it takes an entry and again after it has published taking it).

The producer polls ``released`` while it waits for a slot (every few milliseconds), so
consumers never have to wake it. Under ``"skip"`` the producer may drop entries that a
consumer is about to take; that policy keeps to the socket transport, as do hosts without
x86-64's store order and every host where ``TANDEM_SHARE_TABLE=0`` (see :func:`supported`).
"""

from __future__ import annotations

import mmap
import os
import platform
import struct
from typing import NamedTuple

from tandem.share.protocol import SLAB_KINDS, Batch, EntryKind, EpochEnd, Segment

# The ring's read-twice check relies on the store order of x86-64 (TSO): the producer's
# field stores are seen before its seq store. Python issues no memory fences, so on weaker
# orderings (ARM) consumers use the socket transport, which is correct everywhere.
_STORE_ORDER_OK = platform.machine().lower() in ("x86_64", "amd64")
SWITCH = "TANDEM_SHARE_TABLE"


def supported() -> bool:
    """Whether this process may use the table: x86-64, and not switched off (``=0``).

    The switch lets the socket transport, which other architectures always use, be tested
    on x86-64 too (CI runs the share tests a second time with it off).
    """
    return _STORE_ORDER_OK and os.environ.get(SWITCH, "1") != "0"


class Announcement(NamedTuple):
    """One ring record: a published batch or epoch end (without its seq)."""

    epoch: int
    offset: int
    count: int  # type: ignore[assignment]  # the field hides tuple.count
    kind: int  # EntryKind.BATCH or EntryKind.EPOCH_END
    slot: int
    segment_id: int
    segment_size: int
    meta_offset: int
    meta_len: int
    slab_kind: int  # index into protocol.SLAB_KINDS


class ConsumerRecord(NamedTuple):
    """One consumer's record, written by that consumer only."""

    taken: int  # its cursor: the next seq it will take
    released: int  # every seq below this is released
    stall_s: float
    samples: int
    batches: int
    epoch: int
    offset: int


# The table's records and the messages they stand for, in both directions: the producer
# announces what it would send, the consumer rebuilds what it would have received.
_NO_SEGMENT = {"slot": 0, "segment_id": 0, "segment_size": 0, "meta_offset": 0, "meta_len": 0, "slab_kind": 0}


def announcement(kind: EntryKind, epoch: int, offset: int, message: object) -> Announcement:
    """The record of a published batch (``message`` its Batch) or epoch end."""
    if kind == EntryKind.EPOCH_END:
        return Announcement(epoch=epoch, offset=offset, count=0, kind=kind, **_NO_SEGMENT)
    assert isinstance(message, Batch)
    return Announcement(
        epoch=epoch,
        offset=offset,
        count=message.count,
        kind=kind,
        slot=message.segment.slot,
        segment_id=message.segment.segment_id,
        segment_size=message.segment.size,
        meta_offset=message.meta_offset,
        meta_len=message.meta_len,
        slab_kind=SLAB_KINDS.index(message.segment.kind),
    )


def message(seq: int, record: Announcement) -> Batch | EpochEnd:
    """The message ``record`` stands for."""
    if record.kind != EntryKind.BATCH:
        return EpochEnd(seq=seq, epoch=record.epoch, samples=record.offset)
    segment = Segment(
        kind=SLAB_KINDS[record.slab_kind],
        segment_id=record.segment_id,
        slot=record.slot,
        size=record.segment_size,
    )
    return Batch(
        seq=seq,
        epoch=record.epoch,
        offset=record.offset,
        count=record.count,
        segment=segment,
        meta_offset=record.meta_offset,
        meta_len=record.meta_len,
    )


_HEADER = struct.Struct("<8sqq")  # magic, ring capacity, consumer records
_MAGIC = b"tandem04"
_RECORD = struct.Struct("<q" + "q" * len(Announcement._fields))  # seq, then an Announcement
_CONSUMER = struct.Struct("<qqdqqqq")  # a ConsumerRecord
_SEQ = struct.Struct("<q")
_INVALID = -1


class AnnouncementTable:
    """The producer's (``create``) or a consumer's (``from_fd``) view of the table."""

    def __init__(self, mm: mmap.mmap, fd: int | None):
        self._mm = mm
        self.fd = fd
        magic, self.capacity, self.max_consumers = _HEADER.unpack_from(mm, 0)
        if magic != _MAGIC:
            raise ValueError("not a tandem announcement table (version mismatch?)")
        self._ring = _HEADER.size
        self._consumers = self._ring + self.capacity * _RECORD.size
        self._aside = self._consumers + self.max_consumers * _CONSUMER.size

    @classmethod
    def create(cls, label: str, capacity: int, max_consumers: int) -> AnnouncementTable:
        size = _HEADER.size + capacity * _RECORD.size + max_consumers * (_CONSUMER.size + _SEQ.size)
        fd = os.memfd_create(f"tandem:{label}:table", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        _HEADER.pack_into(mm, 0, _MAGIC, capacity, max_consumers)
        table = cls(mm, fd)
        for i in range(capacity):
            _SEQ.pack_into(mm, table._ring + i * _RECORD.size, _INVALID)
        return table

    @classmethod
    def from_fd(cls, fd: int) -> AnnouncementTable:
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(mm, None)

    # ---------------------------------------------------------------- ring
    def announce(self, seq: int, record: Announcement) -> None:
        at = self._ring + (seq % self.capacity) * _RECORD.size
        _SEQ.pack_into(self._mm, at, _INVALID)
        _RECORD.pack_into(self._mm, at, _INVALID, *record)
        _SEQ.pack_into(self._mm, at, seq)

    def lookup(self, seq: int) -> Announcement | None:
        """The record of ``seq``, or None if it is not there intact."""
        at = self._ring + (seq % self.capacity) * _RECORD.size
        fields = _RECORD.unpack_from(self._mm, at)
        if fields[0] != seq or _SEQ.unpack_from(self._mm, at)[0] != seq:
            return None
        return Announcement._make(fields[1:])

    # ------------------------------------------------------- consumer records
    def _consumer_at(self, index: int) -> int:
        return self._consumers + index * _CONSUMER.size

    def reset_consumer(self, index: int, cursor: int) -> None:
        self.set_aside(index, False)
        self.write_consumer(
            index,
            ConsumerRecord(
                taken=cursor, released=cursor, stall_s=0.0, samples=0, batches=0, epoch=0, offset=0
            ),
        )

    def consumer(self, index: int) -> ConsumerRecord:
        return ConsumerRecord._make(_CONSUMER.unpack_from(self._mm, self._consumer_at(index)))

    def taken(self, index: int) -> int:
        return _SEQ.unpack_from(self._mm, self._consumer_at(index))[0]

    def released(self, index: int) -> int:
        return _SEQ.unpack_from(self._mm, self._consumer_at(index) + _SEQ.size)[0]

    def write_consumer(self, index: int, record: ConsumerRecord) -> None:
        _CONSUMER.pack_into(self._mm, self._consumer_at(index), *record)

    def set_aside(self, index: int, aside: bool) -> None:
        """The producer's word to consumer ``index``: take nothing more from the ring."""
        _SEQ.pack_into(self._mm, self._aside + index * _SEQ.size, int(aside))

    def is_aside(self, index: int) -> bool:
        return bool(_SEQ.unpack_from(self._mm, self._aside + index * _SEQ.size)[0])

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._mm = None  # type: ignore[assignment]


__all__ = [
    "Announcement",
    "AnnouncementTable",
    "ConsumerRecord",
    "EntryKind",
    "announcement",
    "message",
    "supported",
]
