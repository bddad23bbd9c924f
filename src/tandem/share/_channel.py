"""A consumer's channel to its producer: the connection, and the transport that carries entries.

:class:`Connection` is the consumer's socket: sending with a timeout, receiving with clear
errors (a timeout leaves the consumer unusable, since a late reply would answer a later
request; end-of-file means the producer is gone), and mapping each segment whose fd arrives.

On top of it one of two channels, as the producer chose in ``Welcome.transport`` (see
:mod:`tandem.share.protocol`). The consumer only ever calls :meth:`take` (the next entry)
and :meth:`release` (hand back batches now) and never asks which channel it has:

:class:`SocketChannel`
    Every entry through ``Next``, one kept in flight (prefetch); releases ride on ``Next``
    or go in ``Release``.
:class:`TableChannel`
    Announced entries straight from the announcement table, without a system call; the
    socket only for what is not announced yet, segments not mapped yet, and the end. The
    cursor and releases are published in the consumer's table record.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable

from tandem._ipc import close_fds, new_socket
from tandem.share import _table, protocol
from tandem.share._control import ASIDE_AFTER_S
from tandem.share._gate import ReleaseGate
from tandem.share._interrupt import sigterm_ends_wait
from tandem.share._segment_map import Segments
from tandem.share._table import AnnouncementTable, ConsumerRecord
from tandem.share.errors import ConsumerTimeout, ProducerGone, ProtocolError, ReaderSetAside

# Everything the producer is told about this consumer's progress: (stall_s, samples,
# batches, (epoch, offset)); a callable, since the consumer's counters move on every batch.
Progress = Callable[[], tuple[float, int, int, tuple[int, int]]]


class Connection:
    """The consumer's socket to its producer."""

    def __init__(self, sock: socket.socket, name: str, timeout: float, segments: Segments | None = None):
        self.sock = sock
        self.name = name
        self.timeout = timeout
        self.producer_pid: int | None = None
        self.segments = segments  # set once Welcome has said which slab the producer has
        self._broken: str | None = None  # why this consumer can no longer be used
        self._gone = False  # a send failed: the producer closed its end
        self.welcome_fds: list[int] = []

    def send(self, message: object) -> None:
        try:
            protocol.send(self.sock, message, timeout=self.timeout)
        except (OSError, TimeoutError):
            # The producer may have left a final message (End/Failed) before closing;
            # the next receive finds it, or finds the connection closed.
            self._gone = True

    def ready(self) -> bool:
        """Whether a message is waiting or the producer has gone (receiving would not block).

        ``poll``, not ``select``: a training process may hold more than 1024 descriptors."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))

    def receive(self, doing: str, timeout: float | None) -> object:
        who = f"producer {self.name!r}" + (f" (pid {self.producer_pid})" if self.producer_pid else "")
        if self._broken:
            raise ConsumerTimeout(self._broken)
        wait = 0.5 if self._gone else timeout
        try:
            with sigterm_ends_wait(who, doing):
                message, fds = protocol.recv(self.sock, wait)
        except TimeoutError:
            # A reply may still come and would answer a later request: this consumer is done.
            self._broken = (
                f"no answer from {who} within {wait} s while {doing}; it may be waiting for a "
                "stopped consumer (see `tandem share ls`). This consumer can no longer be "
                "used; create a new one (or pass a larger timeout)"
            )
            raise ConsumerTimeout(self._broken) from None
        except (EOFError, OSError) as exc:
            raise ProducerGone(f"{who} is gone: the connection closed while {doing} ({exc})") from None
        if isinstance(message, protocol.Batch) and message.fd_attached:
            if not fds or self.segments is None:
                close_fds(fds)
                raise ProtocolError("batch announced a segment but carried no fd (or came before Welcome)")
            self.segments.add(message.segment, fds[0])
        elif isinstance(message, protocol.Welcome):
            self.welcome_fds = fds
        else:
            close_fds(fds)
        return message


def connect(path: str) -> socket.socket | None:
    """A socket connected to ``path``, or None if no producer listens there (yet)."""
    sock = new_socket()
    try:
        sock.connect(path)
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None


class SocketChannel:
    """Every entry through ``Next``, with one ``Next`` kept in flight."""

    transport = "socket"

    def __init__(
        self,
        conn: Connection,
        progress: Progress,
        gate: ReleaseGate | None,
        prefetch: bool = True,
    ):
        self._conn = conn
        self._progress = progress
        self._gate = gate  # a GPU consumer's releases wait for their CUDA events
        self._prefetch = prefetch
        self._inflight = False  # a Next whose reply is not read yet
        self.stall_s = 0.0
        self.name = conn.name

    def take(self, releases: list[int], holding: int | None, data_timeout: float | None) -> object:
        """The next entry; ``releases`` (seqs handed back) are sent and cleared. ``holding``:
        the oldest seq still held (the table channel publishes it)."""
        if not self._inflight:
            self._request(releases, block=True)
        elif (releases or (self._gate is not None and len(self._gate))) and not self._conn.ready():
            # About to wait for the producer, which may be waiting for the slots we still
            # hold: hand them back first (waiting for our GPU work on them, if any).
            if self._gate is not None:
                self._gate.collect(releases, block=True)
            self._send_releases(releases)
        t0 = time.perf_counter()
        reply = self._conn.receive("waiting for a batch", data_timeout)
        self.stall_s += time.perf_counter() - t0
        self._inflight = False
        if self._prefetch and isinstance(reply, (protocol.Batch, protocol.EpochEnd)):
            self._request(releases, block=False)  # prefetch: the producer prepares the reply meanwhile
        return reply

    def taken(self, seq: int, holding: int | None) -> None:
        """The producer moved this consumer's cursor when it replied: nothing to publish."""

    def producer_gone(self) -> bool:
        """Whether the producer has closed its end (a final message may still be waiting)."""
        return not self._inflight and self._conn.ready()

    def release(self, releases: list[int], holding: int | None) -> None:
        if self._gate is not None:
            self._gate.collect(releases, block=True)
        self._send_releases(releases)

    def _send_releases(self, releases: list[int]) -> None:
        for i in range(0, len(releases), 1024):
            self._conn.send(protocol.Release(tuple(releases[i : i + 1024])))
        releases.clear()

    def _request(self, releases: list[int], block: bool) -> None:
        """Send ``Next``; ``block``: its reply will be waited for at once, so every held
        batch is handed back first (waiting for the GPU if need be)."""
        if self._gate is not None:
            self._gate.collect(releases, block=block)
        if len(releases) > protocol.MAX_RELEASE:  # a Next carries at most MAX_RELEASE
            self._send_releases(releases)
        stall_s, samples, batches, _ = self._progress()
        self._conn.send(
            protocol.Next(release=tuple(releases), stall_s=stall_s, samples=samples, batches=batches)
        )
        releases.clear()
        self._inflight = True

    def close(self) -> None:
        pass


class TableChannel:
    """Announced entries from the table; the socket channel for everything else."""

    transport = "table"

    def __init__(
        self,
        conn: Connection,
        table: AnnouncementTable,
        index: int,
        segments: Segments,
        progress: Progress,
        gate: ReleaseGate | None,
    ):
        self._table = table
        self._index = index
        self._segments = segments
        self._progress = progress
        self._gate = gate
        # Never prefetch here: the reply to a Next in flight could arrive after its entry
        # was taken from the table, and answer the wrong request. The producer reads this
        # consumer's releases from its table record only, so the socket channel needs no gate.
        self._socket = SocketChannel(conn, progress, None, prefetch=False)
        self._taken = table.taken(index)  # this consumer's cursor: the next seq to take

    @property
    def stall_s(self) -> float:
        return self._socket.stall_s

    def take(self, releases: list[int], holding: int | None, data_timeout: float | None) -> object:
        reply = self._take_announced()
        if reply is None:
            # About to wait for the producer, which may be waiting for the slots we released
            # since the last publish: publish them first (waiting for our GPU work, if any).
            if self._gate is not None and len(self._gate):
                self._gate.collect(releases, block=True)
            self._publish(holding)
            return self._socket.take(releases, holding, data_timeout)
        # Taking it publishes the release watermark (see _publish), which covers every seq
        # released so far: they must not pile up for a later Next over the socket.
        releases.clear()
        return reply

    def taken(self, seq: int, holding: int | None) -> None:
        """Entry ``seq`` is this consumer's now: move the cursor past it and publish. Set
        aside meanwhile, the producer may not have counted it as held: it is not used."""
        self._taken = seq + 1
        self._publish(holding)
        if self._table.is_aside(self._index):
            raise ReaderSetAside(set_aside_text(self._socket.name, None))

    def _take_announced(self) -> protocol.Batch | protocol.EpochEnd | None:
        if self._table.is_aside(self._index):
            return None  # set aside: the ring's entries may be reused under it; the socket says so
        record = self._table.lookup(self._taken)
        if record is None:
            return None
        message = _table.message(self._taken, record)
        if isinstance(message, protocol.Batch):
            if not self._segments.has(message.segment):
                return None  # the socket path brings the segment's fd
            if message.segment.kind == "cuda" and self._socket.producer_gone():
                # Its GPU memory went with it: read nothing more, let the socket say why.
                return None
        return message

    def release(self, releases: list[int], holding: int | None) -> None:
        if self._gate is not None:
            self._gate.collect(releases, block=True)
        self._publish(holding)
        releases.clear()

    def _publish(self, holding: int | None) -> None:
        """Write cursor, releases and statistics to this consumer's table record.

        Releases are in order: every seq below the batch still held (or below the cursor),
        and below the oldest one whose GPU work is still pending, is released.
        """
        released = holding if holding is not None else self._taken
        if self._gate is not None:
            self._gate.collect([], block=False)
            pending = self._gate.oldest()
            if pending is not None:
                released = min(released, pending)
        stall_s, samples, batches, (epoch, offset) = self._progress()
        self._table.write_consumer(
            self._index,
            ConsumerRecord(
                taken=self._taken,
                released=released,
                stall_s=stall_s,
                samples=samples,
                batches=batches,
                epoch=epoch,
                offset=offset,
            ),
        )

    def close(self) -> None:
        self._table.close()


def set_aside_text(name: str, after_s: float | None) -> str:
    """What a consumer set aside by its producer is told (see ReaderSetAside)."""
    took = (
        f"no batch for {after_s:g} s"
        if after_s
        else f"no batch for longer than its producer allows ({ASIDE_AFTER_S:g} s by default)"
    )
    return (
        f"the producer of {name!r} set this consumer aside: it took {took} while other readers "
        "waited (a stopped process, a debugger, batches kept), and they went on without it. Its "
        "epoch continues on a new consumer: state = consumer.state_dict(), then "
        "load_state_dict(state) on a new Consumer (tandem.share.DataLoader does so itself); "
        "Producer(aside_after_s=...) or $TANDEM_SHARE_ASIDE_S sets how long a reader may pause"
    )


def say_bye(sock: socket.socket) -> None:
    """Detach politely; a producer that is gone already needs no goodbye."""
    try:
        protocol.send(sock, protocol.Bye(), timeout=0.5)
    except (OSError, TimeoutError):
        pass
