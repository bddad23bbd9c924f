"""The consumer's reading of the producer's stream: its epochs and its position in the
stream, the producer batch it holds and cuts into its own batches, and handing that back.

:class:`StreamReader` is the base of :class:`tandem.share.consumer.Consumer`, which attaches
to the producer and sets up the state declared on it. Where each epoch begins and ends is
:func:`tandem.share._order.epoch_bounds`; the entries come through :mod:`tandem.share._channel`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from tandem.share import protocol
from tandem.share._channel import Connection, SocketChannel, TableChannel
from tandem.share._cuda import DeviceCopier
from tandem.share._cuda_slab import CudaSegmentMap, remove_files_of_dead_producer
from tandem.share._gate import ReleaseGate
from tandem.share._order import Position, epoch_bounds
from tandem.share._rebatch import Assembler, Piece
from tandem.share._slab import Segments
from tandem.share._tree import flatten, unflatten
from tandem.share.errors import (
    MissedBatchesWarning,
    ProducerError,
    ProducerFinished,
    ProducerGone,
    ProducerStopped,
    ProtocolError,
)


class _Held:
    """The producer batch this consumer is reading."""

    __slots__ = ("msg", "piece_spec", "leaves")

    def __init__(self, msg: protocol.Batch, spec: tuple, leaves: list[torch.Tensor]):
        self.msg = msg
        self.piece_spec = spec
        self.leaves = leaves

    @property
    def end(self) -> Position:
        return (self.msg.epoch, self.msg.offset + self.msg.count)


class StreamReader:
    """Iteration over the producer's stream, one epoch per ``iter()``: the part of
    :class:`~tandem.share.consumer.Consumer` that reads. The consumer sets the attributes
    below when it attaches."""

    name: str
    batch_size: int | None
    drop_last: bool
    data_timeout: float | None
    device: torch.device
    samples: int
    batches: int
    missed_batches: int
    missed_samples: int
    start: Position  # where this consumer joined the stream: its epochs run from there
    _conn: Connection
    _channel: SocketChannel | TableChannel
    _segments: Segments
    _copier: DeviceCopier | None
    _cuda_slab: CudaSegmentMap | None
    _gate: ReleaseGate | None
    _cur: _Held | None
    _release: list[int]
    _end: protocol.End | None
    _k: int
    _pos: Position
    _samples_per_epoch: int | None
    _producer_batch: int | None

    def __len__(self) -> int:
        n = self._samples_per_epoch
        if n is None:
            raise TypeError("the producer's epoch length is not known (its source has no len())")
        if self.batch_size is not None:
            return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        pbs = self._producer_batch
        if pbs is None:
            raise TypeError("the producer's batch size is not fixed; ask for a batch_size")
        p = self.start[1]
        head = math.ceil((n - p) / pbs)
        tail = p // pbs
        if self.drop_last:
            head = (n - p) // pbs
        return head + tail

    def __iter__(self) -> Iterator[Any]:
        return self._epoch()

    def _epoch(self) -> Iterator[Any]:
        begin, end = epoch_bounds(self.start, self._k)
        self._k += 1
        self._skip_until(begin)
        size = self.batch_size
        while size is None:  # the producer's batches as they are: no assembly, no copy
            if self._pos >= end:
                return
            if not self._readable():
                self._advance(end, 0)
                continue
            a, b = self._readable_range(end)
            yield self._deliver(self._take(a, b).view(), b - a)
        while True:
            asm = Assembler(size)
            while self._pos < end and asm.n < size:
                if not self._readable():
                    if asm.holds_views:
                        asm.materialize()  # copy out before the slot is released
                    if not self._advance(end, asm.n):
                        break
                    continue
                a, b = self._readable_range(end)
                asm.add(self._take(a, min(b, a + size - asm.n)))
            if asm.empty:
                return
            if asm.n < size and self.drop_last:
                return
            yield self._deliver(asm.result(), asm.n)
            if self._pos >= end:
                return

    def _readable_range(self, end: Position) -> tuple[int, int]:
        """Samples ``[a, b)`` of the current producer batch that belong to this epoch."""
        assert self._cur is not None
        msg = self._cur.msg
        a = self._pos[1] - msg.offset
        b = msg.count if end[0] != msg.epoch else min(msg.count, end[1] - msg.offset)
        return a, b

    def _take(self, a: int, b: int) -> Piece:
        """Samples ``[a, b)`` of the current producer batch; the position moves past them."""
        assert self._cur is not None
        msg = self._cur.msg
        self._pos = (msg.epoch, msg.offset + b)
        return Piece(self._cur.piece_spec, self._cur.leaves, msg.count, a, b)

    def _deliver(self, batch: Any, samples: int) -> Any:
        self.samples += samples
        self.batches += 1
        if self._copier is not None:
            return self._copier.to_device(batch)
        if self._cuda_slab is not None and self.device != self._cuda_slab.device:
            # Another GPU, or the CPU: a copy, queued on the slab GPU's current stream after
            # its wait for the producer's writes (to the CPU it is waited for at once).
            spec, leaves = flatten(batch)
            with torch.cuda.device(self._cuda_slab.device):
                return unflatten(spec, [t.to(self.device) for t in leaves])
        return batch

    def _done_with_current(self) -> None:
        """Hand back the producer batch being read: at once, or, where the GPU may still be
        reading its slot, once the CUDA event recorded now has completed."""
        assert self._cur is not None
        seq = self._cur.msg.seq
        slot = self._cur.msg.segment.slot
        self._segments.released(slot)
        self._cur = None
        if self._gate is None:
            self._release.append(seq)
        elif self._cuda_slab is not None:
            self._cuda_slab.check_unmodified(slot, self.name)
            self._gate.hold(seq, self._cuda_slab.done_event())
        else:
            assert self._copier is not None
            self._gate.hold(seq, self._copier.last_event)

    def _readable(self) -> bool:
        cur = self._cur
        return cur is not None and cur.msg.epoch == self._pos[0] and self._pos[1] < cur.end[1]

    def _skip_until(self, begin: Position) -> None:
        """Discard what is left of an epoch the caller abandoned, up to the next epoch."""
        while self._pos < begin:
            if self._readable():
                assert self._cur is not None
                if self._cur.msg.epoch == begin[0]:
                    self._pos = (begin[0], min(begin[1], self._cur.end[1]))
                else:
                    self._pos = self._cur.end
                continue
            if not self._advance(begin, 0):
                return

    def _advance(self, end: Position, have: int) -> bool:
        """Take the next producer entry. Returns True, or raises at the stream's end.

        The channel brings it (from the announcement table without a system call, or over
        the socket; see :mod:`tandem.share._channel`) and hands back what this consumer
        released.
        """
        if self._cur is not None:
            self._done_with_current()
        if self._end is not None:
            return self._at_end(end, have)
        try:
            reply = self._channel.take(self._release, self.data_timeout)
        except ProducerGone:
            if self._cuda_slab is not None and self._conn.producer_pid:
                remove_files_of_dead_producer(self._conn.producer_pid)
            raise
        if isinstance(reply, protocol.Batch):
            self._on_batch(reply)
        elif isinstance(reply, protocol.EpochEnd):
            self._pos = max(self._pos, (reply.epoch + 1, 0))
        elif isinstance(reply, protocol.End):
            self._end = reply
            return self._at_end(end, have)
        elif isinstance(reply, protocol.Failed):
            raise ProducerError(reply.message)
        else:
            raise ProtocolError(f"unexpected {type(reply).__name__} from the producer")
        self._channel.taken(reply.seq, self._holding())
        return True

    def _holding(self) -> int | None:
        """The seq of the producer batch this consumer still reads, if any."""
        return self._cur.msg.seq if self._cur is not None else None

    def _on_batch(self, msg: protocol.Batch) -> None:
        if msg.missed_batches:
            self.missed_batches += msg.missed_batches
            self.missed_samples += msg.missed_samples
            warnings.warn(
                f"consumer of {self.name!r} fell behind the producer's window and missed "
                f"{msg.missed_batches} batch(es), {msg.missed_samples} sample(s) "
                f"({self.missed_batches} batches in all); use policy='wait' on the producer "
                "to never miss data",
                MissedBatchesWarning,
                stacklevel=4,
            )
        spec, leaves = self._segments.open(msg)
        self._cur = _Held(msg, spec, leaves)
        self._pos = max(self._pos, (msg.epoch, msg.offset))

    def _at_end(self, end: Position, have: int) -> bool:
        """The stream has ended. False lets the caller deliver a partial batch first."""
        assert self._end is not None
        if have:
            return False
        if self._end.finished:
            raise ProducerFinished(
                f"producer {self.name!r} has finished ({self._end.reason}); "
                "this consumer has no further epoch"
            )
        begin = (end[0] - 1, end[1])
        if self._pos <= begin:
            raise ProducerStopped(f"producer {self.name!r} stopped: {self._end.reason}")
        raise ProducerStopped(
            f"producer {self.name!r} stopped before the end of this consumer's epoch "
            f"({self._end.reason}); the epoch ended at producer position {self._pos}, "
            f"short of {end}"
        )
