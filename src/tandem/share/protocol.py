"""The wire protocol between a tandem producer and its consumers: the one place it is defined.

Transport
    One ``AF_UNIX``/``SOCK_SEQPACKET`` connection per consumer, to a socket file in the
    per-user runtime directory (see :mod:`tandem.share.registry`). Seqpacket keeps message
    boundaries, carries file descriptors (``SCM_RIGHTS``) and tells each side at once when
    the other dies: a killed consumer or producer is seen as end-of-file, not after a
    heartbeat timeout. Nothing listens on a network interface.

Data plane
    Batches never travel over the socket. The producer writes each batch once into a slot
    of its host slab (anonymous ``memfd`` segments, see :mod:`tandem.share.slab`); a
    ``Batch`` message names the slot, and the segment's file descriptor is attached to the
    first message that refers to it. So every per-batch message has the same small size,
    whatever the batch's bytes and however many consumers there are. The batch's structure
    (nesting, plain values, tensor dtypes/shapes/offsets) lives in the slot too, after the
    tensor bytes, at ``meta_offset``. ``Segment.kind`` names the slab; ``"host"`` is the
    only kind today, and a CUDA slab (IPC handles in the meta blob, release by events)
    would add a kind without changing any message.

Conversation (request-reply, consumer-driven, like ZeroMQ's REQ/REP)::

    consumer                         producer
    Hello  ─────────────────────────▶
           ◀───────────────────────── Welcome [+control block fd] | Refused
    Next(release=…) ────────────────▶            (one reply each)
           ◀───────────────────────── Batch [+segment fd] | EpochEnd | End | Failed
    Release(seqs) ──────────────────▶            (optional, no reply)
    Bye ────────────────────────────▶            (or just close / die)

    any client: Stats ──▶ ◀── StatsReply      (used by ``tandem share ls``)

Every entry the producer publishes has a sequence number ``seq``; a consumer's cursor is the
next ``seq`` it will be given. A ``Batch`` is *held* by a consumer from the reply until it
releases it; the slot is reused only when no consumer holds it and, under the default
``"wait"`` policy, every consumer has passed it.

Under ``"wait"`` the per-batch traffic does not use the socket at all in the steady state:
the producer also announces each entry in the *control block* (:mod:`tandem.share.ring`),
and the consumer takes announced entries and publishes its cursor and releases there. It
sends ``Next`` only when the entry it needs is not announced yet (it then blocks until the
reply), names a segment it has not mapped (the reply brings the fd), or is ``End``/``Failed``
(never announced). Under ``"skip"`` every entry goes through ``Next``: the producer keeps
the cursor and the releases (``Next.release``), and a consumer that falls a whole window
behind the fastest one is moved forward; the next ``Batch`` it gets says how many batches
and samples it missed. A consumer keeps one ``Next`` in flight there (prefetch).

Positions are ``(epoch, offset)`` pairs in the producer's stream; see
:mod:`tandem.share.order` for how a consumer's own epochs map onto them.
"""

from __future__ import annotations

import array
import pickle
import select
import socket
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from tandem.share.errors import ProtocolError

PROTOCOL_VERSION = 1
MAX_MESSAGE = 1 << 16  # control messages are small; Stats replies are the largest
MAX_FDS = 4
_FDS_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


# --- consumer -> producer -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    pid: int
    batch_size: int | None
    drop_last: bool
    device: str


class Next(NamedTuple):
    """Give me the entry at my cursor; ``release`` hands back batches I am done with."""

    release: tuple[int, ...] = ()
    stall_s: float = 0.0  # cumulative time this consumer has waited for data
    samples: int = 0  # cumulative samples this consumer has been given


@dataclass(frozen=True, slots=True)
class Release:
    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Bye:
    pass


@dataclass(frozen=True, slots=True)
class Stats:
    pass


# --- producer -> consumer -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Welcome:
    version: int
    name: str
    pid: int
    policy: str
    window: int
    start_epoch: int
    start_offset: int
    samples_per_epoch: int | None  # None when the source's length is not known yet
    batch_size: int | None  # the producer's batch size, when fixed
    consumer_id: int
    consumer_index: int  # this consumer's record in the control block (its fd rides along)


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


class Segment(NamedTuple):
    """A shared-memory segment: its fd rides along with the first message naming it."""

    kind: str  # "host" (memfd); a CUDA slab would add "cuda" to SLAB_KINDS
    segment_id: int
    slot: int
    size: int


class Batch(NamedTuple):
    seq: int
    epoch: int
    offset: int  # position of the batch's first sample in the producer's epoch
    count: int  # samples in the batch
    segment: Segment
    meta_offset: int
    meta_len: int
    missed_batches: int = 0  # skipped since this consumer's previous batch ("skip" policy)
    missed_samples: int = 0
    fd_attached: bool = False


class EpochEnd(NamedTuple):
    seq: int
    epoch: int
    samples: int  # samples the producer served in that epoch


@dataclass(frozen=True, slots=True)
class End:
    seq: int
    epoch: int
    offset: int
    reason: str
    finished: bool  # True: served every epoch asked for; False: stopped early


@dataclass(frozen=True, slots=True)
class Failed:
    seq: int
    message: str


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    consumer_id: int
    pid: int
    batch_size: int | None
    device: str
    epoch: int
    offset: int
    lag: int  # published entries not yet taken
    holds: int
    batches: int
    batches_per_s: float
    samples: int
    stall_s: float
    missed_batches: int
    attached_s: float


@dataclass(frozen=True, slots=True)
class StatsReply:
    name: str
    pid: int
    policy: str
    window: int
    epoch: int
    published: int
    batches_per_s: float
    blocked_s: float  # time the producer waited for consumers to free a slot
    slab_bytes: int
    consumers: tuple[ConsumerStats, ...] = field(default_factory=tuple)


ToProducer = Hello | Next | Release | Bye | Stats
ToConsumer = Welcome | Refused | Batch | EpochEnd | End | Failed | StatsReply


# --- framing ----------------------------------------------------------------------------------
# Sockets stay in blocking mode and every call first tries without waiting (MSG_DONTWAIT):
# a reply that is already there costs one system call. Python's own socket timeouts would
# poll() before every send and recv, and settimeout() costs two fcntl() calls; on a busy or
# virtualised host each is tens of microseconds on the hand-off path.
def new_socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _wait(sock: socket.socket, events: int, timeout: float | None) -> None:
    poller = select.poll()
    poller.register(sock, events | select.POLLERR | select.POLLHUP)
    if not poller.poll(None if timeout is None else max(0, int(timeout * 1000))):
        raise TimeoutError(f"no progress on the socket within {timeout:g} s")


# The per-batch messages (Next, Batch, EpochEnd) have a fixed binary layout: each is a few
# dozen bytes whatever the batch, and decodes in a few microseconds. Everything else is
# rare and pickled. The first byte says which.
SLAB_KINDS = ("host",)
MAX_RELEASE = 64  # seqs one Next may release; more go in Release messages
_PICKLED, _NEXT, _BATCH, _EPOCH_END = 0, 1, 2, 3
_BATCH_FMT = struct.Struct("<B4qB3q2q2q?")
_EPOCH_END_FMT = struct.Struct("<B3q")
_NEXT_FMT = struct.Struct("<BdqH")
_SEQ = struct.Struct("<q")


def encode(message: object) -> bytes:
    if type(message) is Batch:
        seg = message.segment
        return _BATCH_FMT.pack(
            _BATCH, message.seq, message.epoch, message.offset, message.count,
            SLAB_KINDS.index(seg.kind), seg.segment_id, seg.slot, seg.size,
            message.meta_offset, message.meta_len, message.missed_batches,
            message.missed_samples, message.fd_attached,
        )  # fmt: skip
    if type(message) is Next:
        if len(message.release) > MAX_RELEASE:
            raise ProtocolError(f"a Next releases at most {MAX_RELEASE} batches")
        head = _NEXT_FMT.pack(_NEXT, message.stall_s, message.samples, len(message.release))
        return head + b"".join(_SEQ.pack(seq) for seq in message.release)
    if type(message) is EpochEnd:
        return _EPOCH_END_FMT.pack(_EPOCH_END, *message)
    return bytes([_PICKLED]) + pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> object:
    tag = data[0]
    if tag == _BATCH:
        f = _BATCH_FMT.unpack(data)
        seg = Segment(SLAB_KINDS[f[5]], f[6], f[7], f[8])
        return Batch(f[1], f[2], f[3], f[4], seg, f[9], f[10], f[11], f[12], f[13])
    if tag == _NEXT:
        _, stall_s, samples, n = _NEXT_FMT.unpack_from(data)
        base = _NEXT_FMT.size
        release = tuple(_SEQ.unpack_from(data, base + 8 * i)[0] for i in range(n))
        return Next(release, stall_s, samples)
    if tag == _EPOCH_END:
        return EpochEnd(*_EPOCH_END_FMT.unpack(data)[1:])
    if tag == _PICKLED:
        return pickle.loads(data[1:])
    raise ProtocolError(f"unknown message tag {tag}")


def send(
    sock: socket.socket, message: object, fds: tuple[int, ...] = (), timeout: float | None = 2.0
) -> None:
    """Send one message (and optionally file descriptors) as one packet."""
    data = encode(message)
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"control message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    while True:
        try:
            sock.sendmsg([data], ancillary, socket.MSG_DONTWAIT)
            return
        except BlockingIOError:
            _wait(sock, select.POLLOUT, timeout)


def recv(sock: socket.socket, timeout: float | None = None) -> tuple[object, list[int]]:
    """Receive one message and any file descriptors it carries.

    A closed or reset connection raises ``EOFError``; no message within ``timeout``
    seconds raises ``TimeoutError``.
    """
    while True:
        try:
            # recvmsg itself: socket.recv_fds ignores its flags argument on Python < 3.12
            data, ancillary, _flags, _addr = sock.recvmsg(
                MAX_MESSAGE, _FDS_SPACE, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
            )
            break
        except BlockingIOError:
            _wait(sock, select.POLLIN, timeout)
        except ConnectionResetError as exc:
            raise EOFError("connection reset by peer") from exc
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds += received
    if not data:
        for fd in fds:
            _close_quietly(fd)
        raise EOFError("peer closed the connection")
    try:
        return decode(data), fds
    except Exception as exc:  # a peer of another version or a corrupted packet
        for fd in fds:
            _close_quietly(fd)
        raise ProtocolError(f"undecodable control message: {exc}") from exc


def _close_quietly(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass


__all__ = [
    "PROTOCOL_VERSION",
    "Batch",
    "Bye",
    "ConsumerStats",
    "End",
    "EpochEnd",
    "Failed",
    "Hello",
    "Next",
    "Refused",
    "Release",
    "Segment",
    "Stats",
    "StatsReply",
    "Welcome",
    "new_socket",
    "recv",
    "send",
]
