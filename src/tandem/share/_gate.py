"""A GPU consumer's release gate: batches it is done with, held back until the GPU is too.

A consumer on a GPU is done with a producer batch, as far as its Python code goes, when it
asks for the next one; the GPU may still be reading the batch's slot (a copy out of host
shared memory, or the training step's kernels on a GPU-slab view) for a while after that.
So the consumer records a CUDA event on the stream that reads the slot and *holds* the
batch's seq here with that event; the seq goes back to the producer only once the event
has completed. Release by event, never by time.

The gate is polled, not waited on: the consumer's channel collects completed seqs without
blocking each time it talks to the producer, and blocks on the events only before it
would itself block waiting for the producer (which may be waiting for these very slots).
So the CPU keeps queueing the next step while the GPU finishes the last one.

Anything with ``query()`` and ``synchronize()`` serves as an event (the unit tests use
fakes); None means nothing on the GPU reads the slot any more.
"""

from __future__ import annotations

import collections
from typing import Protocol


class Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class ReleaseGate:
    """Seqs whose slots the GPU may still read, in the order they were held."""

    def __init__(self) -> None:
        self._pending: collections.deque[tuple[int, Event | None]] = collections.deque()

    def hold(self, seq: int, event: Event | None) -> None:
        self._pending.append((seq, event))

    def collect(self, out: list[int], block: bool = False) -> None:
        """Move the seqs whose events have completed onto ``out``, oldest first.

        Events are recorded in order on one stream, so a pending one stops the scan: a later
        event cannot have completed before it. (Should the user switch streams between
        batches, this stays correct, only a little late.) ``block``: wait for all of them.
        """
        pending = self._pending
        while pending:
            seq, event = pending[0]
            if event is not None:
                if block:
                    event.synchronize()
                elif not event.query():
                    return
            pending.popleft()
            out.append(seq)

    def oldest(self) -> int | None:
        """The oldest seq still held (the table's release watermark stops below it)."""
        return self._pending[0][0] if self._pending else None

    def __len__(self) -> int:
        return len(self._pending)
