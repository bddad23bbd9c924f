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
           ◀───────────────────────── Welcome | Refused
    Next(release=…) ────────────────▶            (repeated; one reply each)
           ◀───────────────────────── Batch [+fd] | EpochEnd | End | Failed
    Release(seqs) ──────────────────▶            (optional, no reply)
    Bye ────────────────────────────▶            (or just close / die)

    any client: Stats ──▶ ◀── StatsReply      (used by ``tandem share ls``)

Every entry the producer publishes has a sequence number ``seq``; a consumer's cursor is the
next ``seq`` it will be given. A ``Batch`` is *held* by a consumer from the reply until it
names the ``seq`` in a later ``Next.release`` or ``Release``; the slot is reused only when no
consumer holds it and, under the default ``"wait"`` policy, every consumer has passed it.
Under the ``"skip"`` policy a consumer that falls a whole window behind the fastest one is
moved forward; the next ``Batch`` it gets says how many batches and samples it missed.

Positions are ``(epoch, offset)`` pairs in the producer's stream; see
:mod:`tandem.share.order` for how a consumer's own epochs map onto them.
"""

from __future__ import annotations

import pickle
import socket
from dataclasses import dataclass, field

from tandem.share.errors import ProducerGone, ProtocolError

PROTOCOL_VERSION = 1
MAX_MESSAGE = 1 << 16  # control messages are small; Stats replies are the largest
MAX_FDS = 4


# --- consumer -> producer -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    pid: int
    batch_size: int | None
    drop_last: bool
    device: str


@dataclass(frozen=True, slots=True)
class Next:
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


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


@dataclass(frozen=True, slots=True)
class Segment:
    """A shared-memory segment: its fd rides along with the first message naming it."""

    kind: str  # "host" (memfd); a CUDA slab would add "cuda"
    segment_id: int
    slot: int
    size: int


@dataclass(frozen=True, slots=True)
class Batch:
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


@dataclass(frozen=True, slots=True)
class EpochEnd:
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
def new_socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(sock: socket.socket, message: object, fds: tuple[int, ...] = ()) -> None:
    """Send one message (and optionally file descriptors) as one packet."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"control message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv(sock: socket.socket) -> tuple[object, list[int]]:
    """Receive one message and any file descriptors it carries.

    Raises ``ProducerGone``-style ``EOFError`` subclasses are left to callers: here an
    orderly or abrupt close of the peer is ``EOFError``.
    """
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    except ConnectionResetError as exc:
        raise EOFError("connection reset by peer") from exc
    if not data:
        for fd in fds:
            _close_quietly(fd)
        raise EOFError("peer closed the connection")
    try:
        return pickle.loads(data), fds
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
    "ProducerGone",
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
