"""The control block: a small shared-memory table that makes the steady-state hand-off free
of system calls under the default ``"wait"`` policy.

It lives in one ``memfd`` per producer, mapped by every consumer (its fd rides along with
``Welcome``), and has two parts:

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

The producer polls ``released`` while it waits for a slot (every few milliseconds), so
consumers never have to wake it. Under ``"skip"`` the producer may drop entries that a
consumer is about to take; that policy keeps to the socket path.
"""

from __future__ import annotations

import mmap
import os
import platform
import struct

# The ring's read-twice check relies on the store order of x86-64 (TSO): the producer's
# field stores are seen before its seq store. Python issues no memory fences, so on weaker
# orderings (ARM) consumers use the socket path, which is correct everywhere.
RING_SUPPORTED = platform.machine().lower() in ("x86_64", "amd64")

_HEADER = struct.Struct("<8sqq")  # magic, ring capacity, consumer records
_MAGIC = b"tandem01"
# seq, epoch, offset, count, kind (0 batch, 1 epoch end), slot, segment id, segment size,
# meta offset, meta length
_RECORD = struct.Struct("<qqqqqqqqqq")
# taken, released, stall_s, samples, batches, epoch, offset
_CONSUMER = struct.Struct("<qqdqqqq")
_SEQ = struct.Struct("<q")
KIND_BATCH, KIND_EPOCH_END = 0, 1
_INVALID = -1


class ControlBlock:
    """The producer's (creator) or a consumer's (``from_fd``) view of the control block."""

    def __init__(self, mm: mmap.mmap, fd: int | None):
        self._mm = mm
        self.fd = fd
        magic, self.capacity, self.max_consumers = _HEADER.unpack_from(mm, 0)
        if magic != _MAGIC:
            raise ValueError("not a tandem control block (version mismatch?)")
        self._ring = _HEADER.size
        self._consumers = self._ring + self.capacity * _RECORD.size

    @classmethod
    def create(cls, label: str, capacity: int, max_consumers: int) -> ControlBlock:
        size = _HEADER.size + capacity * _RECORD.size + max_consumers * _CONSUMER.size
        fd = os.memfd_create(f"tandem:{label}:control", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        _HEADER.pack_into(mm, 0, _MAGIC, capacity, max_consumers)
        block = cls(mm, fd)
        for i in range(capacity):
            _SEQ.pack_into(mm, block._ring + i * _RECORD.size, _INVALID)
        return block

    @classmethod
    def from_fd(cls, fd: int) -> ControlBlock:
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(mm, None)

    # ---------------------------------------------------------------- ring
    def announce(self, seq: int, *fields: int) -> None:
        at = self._ring + (seq % self.capacity) * _RECORD.size
        _SEQ.pack_into(self._mm, at, _INVALID)
        _RECORD.pack_into(self._mm, at, _INVALID, *fields)
        _SEQ.pack_into(self._mm, at, seq)

    def lookup(self, seq: int) -> tuple[int, ...] | None:
        """The record of ``seq`` (without the seq), or None if it is not there intact."""
        at = self._ring + (seq % self.capacity) * _RECORD.size
        record = _RECORD.unpack_from(self._mm, at)
        if record[0] != seq or _SEQ.unpack_from(self._mm, at)[0] != seq:
            return None
        return record[1:]

    # ------------------------------------------------------- consumer records
    def _consumer_at(self, index: int) -> int:
        return self._consumers + index * _CONSUMER.size

    def reset_consumer(self, index: int, cursor: int) -> None:
        _CONSUMER.pack_into(self._mm, self._consumer_at(index), cursor, cursor, 0.0, 0, 0, 0, 0)

    def consumer(self, index: int) -> tuple:
        """(taken, released, stall_s, samples, batches, epoch, offset)."""
        return _CONSUMER.unpack_from(self._mm, self._consumer_at(index))

    def taken(self, index: int) -> int:
        return _SEQ.unpack_from(self._mm, self._consumer_at(index))[0]

    def released(self, index: int) -> int:
        return _SEQ.unpack_from(self._mm, self._consumer_at(index) + 8)[0]

    def write_consumer(self, index: int, *fields: float) -> None:
        _CONSUMER.pack_into(self._mm, self._consumer_at(index), *fields)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._mm = None  # type: ignore[assignment]
