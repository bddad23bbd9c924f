"""The consumer: an iterable of batches served by a producer on this host.

``for batch in Consumer("imagenet"):`` is one epoch; every ``iter()`` the next one. Batches
are views into the producer's shared memory, valid until the consumer asks for the next
batch (or calls :meth:`Consumer.release`). To keep a batch longer, copy it:
``tandem.share.clone_batch(batch)``. Modifying a batch from host memory in place changes only
this consumer's copy-on-write view, never the producer's data or another consumer's. A batch
from a CUDA slab (``Producer(..., device="cuda:N")``) is the producer's GPU memory itself,
shared with every consumer on that GPU: never write into it (clone first); a consumer that
does is warned, since the others may have read the changed data.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from tandem._ipc import close_fds
from tandem.share import _table, protocol
from tandem.share._channel import Connection, SocketChannel, TableChannel, connect, say_bye
from tandem.share._cuda import DeviceCopier, check_device
from tandem.share._cuda_slab import CudaSegmentMap, local_device, remove_files_of_dead_producer
from tandem.share._gate import ReleaseGate
from tandem.share._order import Position, epoch_bounds
from tandem.share._rebatch import Assembler, Piece
from tandem.share._registry import live_producers, socket_path, validate_name
from tandem.share._slab import SegmentMap, Segments
from tandem.share._tree import flatten, unflatten
from tandem.share.errors import (
    MissedBatchesWarning,
    ProducerError,
    ProducerFinished,
    ProducerGone,
    ProducerNotFound,
    ProducerStopped,
    ProtocolError,
    RefusedByProducer,
    ShareError,
)

log = logging.getLogger("tandem.share")
_SAY_WAITING_AFTER_S = 2.0  # a producer starting up beside its consumers is not worth a message


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


class Consumer:
    """Attach to the producer serving ``name`` on this host.

    ``batch_size``: None for the producer's batches as they are, or any positive integer.
    ``drop_last``: drop each epoch's last partial batch (needs a ``batch_size``).
    ``timeout``: seconds to wait for the producer to appear and to answer when attaching.
    ``data_timeout``: seconds to wait for a batch; None (default) waits as long as the
    producer lives, like a ``DataLoader``: under the default policy a slow or paused
    consumer legitimately holds the others, and a dead producer is noticed at once anyway.
    ``device``: ``"cpu"`` or ``"cuda[:N]"``.
    """

    def __init__(
        self,
        name: str,
        batch_size: int | None = None,
        drop_last: bool = False,
        timeout: float = 60.0,
        device: str = "cpu",
        data_timeout: float | None = None,
    ):
        validate_name(name)
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        if drop_last and batch_size is None:
            raise ValueError(
                "drop_last=True needs a batch_size: with batch_size=None the producer's batches "
                "are passed on as they are"
            )
        if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
        self.name = name
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.timeout = float(timeout)
        if data_timeout is not None and (
            not isinstance(data_timeout, (int, float)) or not math.isfinite(data_timeout) or data_timeout <= 0
        ):
            raise ValueError(
                f"data_timeout must be a positive, finite number of seconds or None (wait as long as the "
                f"producer lives), got {data_timeout!r}"
            )
        self.data_timeout = data_timeout
        self.device = check_device(device)
        self._copier: DeviceCopier | None = None  # host slab, GPU consumer
        self._cuda_slab: CudaSegmentMap | None = None  # CUDA slab
        self._gate: ReleaseGate | None = None  # GPU consumers: releases wait for CUDA events
        self.samples = 0
        self.batches = 0
        self.missed_batches = 0
        self.missed_samples = 0
        self._cur: _Held | None = None
        self._release: list[int] = []  # seqs done with, not handed back yet
        self._end: protocol.End | None = None
        self._k = 0  # this consumer's epoch counter
        self._closed = False
        self._conn = Connection(self._connect(), name, self.timeout)
        # Also run when the consumer is garbage-collected or the interpreter exits.
        self._resources: list = []
        self._finalizer = weakref.finalize(self, _release_resources, self._conn.sock, self._resources)
        welcome = self._hello()
        self.producer_pid = self._conn.producer_pid = welcome.pid
        self.policy = welcome.policy
        self.slab = welcome.slab
        self._segments = self._conn.segments = self._open_slab(welcome)
        self._resources.append(self._segments)
        if welcome.transport == "table":
            table = _table.AnnouncementTable.from_fd(self._conn.welcome_fds.pop())
            self._channel: SocketChannel | TableChannel = TableChannel(
                self._conn, table, welcome.table_index, self._segments, self._progress, self._gate
            )
        else:
            self._channel = SocketChannel(self._conn, self._progress, self._gate)
        self.start: Position = (welcome.start_epoch, welcome.start_offset)
        self._pos: Position = self.start
        self._samples_per_epoch = welcome.samples_per_epoch
        self._producer_batch = welcome.batch_size

    @classmethod
    def from_env(cls, **kwargs: Any) -> Consumer:
        """The consumer of the shared dataset the job manager named in ``$TANDEM_SHARE``
        (``tandem submit --share NAME``); keyword arguments as for ``Consumer``."""
        name = os.environ.get("TANDEM_SHARE")
        if not name:
            raise ValueError(
                "TANDEM_SHARE is not set: submit the job with `tandem submit --share NAME -- ...` "
                "(after `tandem share define NAME ...`), or name the producer: Consumer(NAME)"
            )
        return cls(name, **kwargs)

    @property
    def stall_s(self) -> float:
        """Seconds this consumer has waited for the producer's data."""
        return self._channel.stall_s

    @property
    def transport(self) -> str:
        """How entries reach this consumer: ``"table"`` or ``"socket"`` (see ``protocol``)."""
        return self._channel.transport

    def _progress(self) -> tuple[float, int, int, Position]:
        return self._channel.stall_s, self.samples, self.batches, self._pos

    # ------------------------------------------------------------------ connection
    def _connect(self):
        path = socket_path(self.name)
        started = time.monotonic()
        said = False
        while True:
            sock = connect(str(path))
            if sock is not None:
                return sock
            waited = time.monotonic() - started
            if waited >= self.timeout:
                raise ProducerNotFound(
                    f"no producer named {self.name!r} on this host after {self.timeout:g} s; "
                    + self._live_producers()
                    + f" (runtime dir {path.parent}). Start one with "
                    f"`tandem share serve {self.name} --loader MODULE:FUNCTION`"
                )
            if not said and waited >= _SAY_WAITING_AFTER_S:
                said = True
                live = self._live_producers()
                log.warning("waiting up to %g s for producer %r to start (%s)", self.timeout, self.name, live)
            time.sleep(0.05)

    @staticmethod
    def _live_producers() -> str:
        live = [p.name for p in live_producers()]
        return f"live producers: {', '.join(live)}" if live else "no producer is live"

    def _open_slab(self, welcome: protocol.Welcome) -> Segments:
        """The map of the producer's slab, as ``Welcome`` says which it is."""
        if welcome.slab == "cuda":
            try:
                slab_device = local_device(welcome.slab_device, f"producer {self.name!r}")
            except ShareError:
                close_fds(self._conn.welcome_fds)
                self.close()
                raise
            self._cuda_slab = CudaSegmentMap(slab_device, self.name)
            self._gate = ReleaseGate()
            return self._cuda_slab
        if welcome.slab != "host":
            close_fds(self._conn.welcome_fds)
            self.close()
            raise ProtocolError(f"unknown slab kind {welcome.slab!r} in Welcome")
        segments = SegmentMap(writable_private=self.device.type == "cpu")
        if self.device.type == "cuda":
            self._copier = DeviceCopier(self.device)
            self._gate = ReleaseGate()
            segments.on_map = self._copier.pin
        return segments

    def _hello(self) -> protocol.Welcome:
        hello = protocol.Hello(
            version=protocol.PROTOCOL_VERSION,
            pid=os.getpid(),
            batch_size=self.batch_size,
            device=str(self.device),
            table=_table.supported(),
        )
        self._conn.send(hello)
        reply = self._conn.receive("attaching", self.timeout)
        if isinstance(reply, protocol.Refused):
            self.close()
            raise RefusedByProducer(f"producer {self.name!r} refused this consumer: {reply.reason}")
        if not isinstance(reply, protocol.Welcome):
            self.close()
            raise ProtocolError(f"expected Welcome, got {type(reply).__name__}")
        if reply.transport == "table" and not self._conn.welcome_fds:
            self.close()
            raise ProtocolError("Welcome named the table transport but carried no table")
        return reply

    # ------------------------------------------------------------------ iteration
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

    # ------------------------------------------------------------------ lifecycle
    def release(self) -> None:
        """Release the producer batches behind the last batch now, not at the next request.

        The last batch's tensors must not be used afterwards (copy what you keep).
        """
        if self._cur is not None and self._pos >= self._cur.end:
            self._done_with_current()
        if self._release or self._gate:
            self._channel.release(self._release, self._holding())

    def close(self) -> None:
        """Detach from the producer (also done when the process exits or dies)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._copier is not None:
                self._copier.close()  # copies out of shared memory finish before we let go
            if self._cuda_slab is not None:
                self._cuda_slab.finish()  # our last kernels may still read a slot
        finally:
            say_bye(self._conn.sock)
            self._cur = None
            if hasattr(self, "_channel"):
                self._channel.close()
            self._finalizer()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def position(self) -> Position:
        """This consumer's position in the producer's stream: (epoch, sample offset)."""
        return self._pos


def _release_resources(sock, resources: list) -> None:
    for segments in resources:
        segments.close()
    sock.close()


def clone_batch(batch: Any) -> Any:
    """A deep copy of a batch's tensors, to keep it past the next step."""
    spec, leaves = flatten(batch)
    return unflatten(spec, [t.clone() for t in leaves])
