"""The wire protocol between a tandem producer and its consumers: the one place it is defined.

Transport
    One ``AF_UNIX``/``SOCK_SEQPACKET`` connection per consumer, to a socket file in the
    per-user runtime directory. Seqpacket keeps message boundaries, carries file descriptors
    (``SCM_RIGHTS``) and tells each side at once when the other dies: a killed consumer or
    producer is seen as end-of-file, not after a heartbeat timeout. Nothing listens on a
    network interface. The runtime directory and the packet framing live in
    :mod:`tandem._ipc`, shared with tandem's other local endpoints.

Data plane
    Batches never travel over the socket. The producer writes each batch once into a slot
    of its slab; a ``Batch`` message names the slot, and the slot's segment file descriptor
    is attached to the first message that refers to it. So every per-batch message has the
    same small size, whatever the batch's bytes and however many consumers there are.
    ``Welcome.slab`` and ``Segment.kind`` name the slab (``SLAB_KINDS``):

    ``"host"``
        Anonymous ``memfd`` segments (:mod:`tandem.share._slab`). The batch's structure
        (nesting, plain values, tensor dtypes/shapes/offsets) lives in the slot too, after
        the tensor bytes, at ``meta_offset``. A consumer on a GPU copies out of it on a
        side stream and hands the slot back once that copy's CUDA event has completed.
    ``"cuda"``
        Device buffers on one GPU (``Welcome.slab_device``, its UUID), shared over CUDA IPC
        (:mod:`tandem.share._cuda_slab`). The fd is a small host segment holding the slot's
        IPC handles and, at ``meta_offset``, the batch's structure. Consumers on that GPU
        read views of the buffer; each hands a slot back only once the CUDA event it
        recorded after its last use has completed (:mod:`tandem.share._gate`).

Conversation (request-reply, consumer-driven, like ZeroMQ's REQ/REP)::

    consumer                         producer
    Hello  ─────────────────────────▶
           ◀───────────────────────── Welcome [+table fd] | Refused
    Next(release=…) ────────────────▶            (one reply each)
           ◀───────────────────────── Batch [+segment fd] | EpochEnd | End | Failed
    Release(seqs) ──────────────────▶            (optional, no reply)
    Bye ────────────────────────────▶            (or just close / die)

    any client: Stats ──▶ ◀── StatsReply      (used by ``tandem share ls``)

Every entry the producer publishes has a sequence number ``seq`` and a kind
(:class:`EntryKind`); a consumer's cursor is the next ``seq`` it will be given. A ``Batch``
is *held* by a consumer from the reply until it releases it; the slot is reused only when
no consumer holds it and, under the default ``"wait"`` policy, every consumer has passed it.

Each consumer has one of two transports, chosen by the producer when it attaches and named
in ``Welcome.transport``:

``"table"`` (under ``"wait"``, on x86-64, unless ``TANDEM_SHARE_TABLE=0``)
    The per-batch traffic does not use the socket in the steady state: the producer also
    announces each batch and epoch end in the shared-memory *announcement table*
    (:mod:`tandem.share._table`, its fd rides along with ``Welcome``), and the consumer takes
    announced entries and publishes its cursor and releases there. It sends ``Next`` only
    when the entry it needs is not announced yet (it then blocks until the reply), names a
    segment it has not mapped (the reply brings the fd), or is ``End``/``Failed`` (never
    announced).
``"socket"`` (every other case: ``"skip"``, other architectures)
    Every entry goes through ``Next``: the producer keeps the cursor and the releases
    (``Next.release``, ``Release``). A consumer keeps one ``Next`` in flight (prefetch).
    Under ``"skip"`` a consumer that falls a whole window behind the fastest one is moved
    forward; the next ``Batch`` it gets says how many batches and samples it missed.

Positions are ``(epoch, offset)`` pairs in the producer's stream; see
:mod:`tandem.share._order` for how a consumer's own epochs map onto them.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
import socket
import struct
import types
import typing
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tandem._ipc import MAX_PACKET, close_fds, recv_packet, send_packet
from tandem.share.errors import ProtocolError

PROTOCOL_VERSION = 4
TRANSPORTS = ("table", "socket")


class EntryKind(enum.IntEnum):
    """What a published entry is: one vocabulary for the window, the table and the messages."""

    BATCH = 0
    EPOCH_END = 1
    END = 2  # never announced in the table: it goes to each consumer over its socket
    FAILED = 3


# --- consumer -> producer -------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    version: int
    pid: int
    batch_size: int | None
    device: str
    table: bool  # this consumer can use the announcement table
    group: str = ""  # the ranks of one distributed job share a key (see _groups)
    rank: int = 0
    world_size: int = 1


class Next(NamedTuple):
    """Give me the entry at my cursor; ``release`` hands back batches I am done with."""

    release: tuple[int, ...] = ()
    stall_s: float = 0.0  # cumulative time this consumer has waited for data
    samples: int = 0  # cumulative samples this consumer has been given
    batches: int = 0  # cumulative batches this consumer has delivered


@dataclass(frozen=True, slots=True)
class Release:
    seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Bye:
    pass


@dataclass(frozen=True, slots=True)
class Stats:
    pass


@dataclass(frozen=True, slots=True)
class Items:
    """Digest these items of your dataset (a reader checks that its producer's data is its
    own, see :mod:`tandem.share._identity`); answered with :class:`ItemsReply`."""

    indices: tuple[int, ...]


MAX_ITEMS_ASKED = 16


# --- producer -> consumer -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ItemsReply:
    """The digests of the items asked for, in order; None: this producer cannot say (its
    source is not a map-style dataset it owns)."""

    digests: tuple[str, ...] | None


@dataclass(frozen=True, slots=True, kw_only=True)
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
    transport: str  # one of TRANSPORTS; "table": the table's fd rides along
    table_index: int  # this consumer's record in the table (transport "table")
    slab: str  # one of SLAB_KINDS: where the batches are
    slab_device: str  # the CUDA slab's GPU UUID ("" for the host slab)
    dataset_id: str = ""  # the served dataset's fingerprint (see _order.fingerprint), if any


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str


@dataclass(frozen=True, slots=True)
class SetAside:
    """This consumer took nothing for ``after_s`` while others waited: the window went on
    without it, and it may take nothing more (see :mod:`tandem.share._control`)."""

    after_s: float


class Segment(NamedTuple):
    """A shared-memory segment: its fd rides along with the first message naming it."""

    kind: str  # one of SLAB_KINDS
    segment_id: int
    slot: int
    size: int


class Batch(NamedTuple):
    seq: int
    epoch: int
    offset: int  # position of the batch's first sample in the producer's epoch
    count: int  # type: ignore[assignment]  # samples in the batch (the field hides tuple.count)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class End:
    seq: int
    epoch: int
    offset: int
    reason: str
    finished: bool  # True: served every epoch asked for; False: stopped early


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed:
    seq: int
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerStats:
    consumer_id: int
    pid: int
    batch_size: int | None
    device: str
    transport: str
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


@dataclass(frozen=True, slots=True, kw_only=True)
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
    window_mem: int | None = None  # the window's bound in bytes (None: ``window`` batches)
    window_used: int = 0  # batches in the window now (its fill)
    drift: int = 0  # entries between the fastest consumer and the slowest
    drift_bytes: int = 0  # about what those hold in the slab


ToProducer = Hello | Next | Release | Bye | Stats
ToConsumer = Welcome | Refused | Batch | EpochEnd | End | Failed | StatsReply


# --- encoding ---------------------------------------------------------------------------------
# The per-batch messages (Next, Batch, EpochEnd) have a fixed binary layout: each is a few
# dozen bytes whatever the batch, and decodes in a few microseconds. Everything else is
# rare and pickled. The first byte says which.
SLAB_KINDS = ("host", "cuda")
MAX_RELEASE = 64  # seqs one Next may release; more go in Release messages
_PICKLED, _NEXT, _BATCH, _EPOCH_END = 0, 1, 2, 3
_BATCH_FMT = struct.Struct("<B4qB3q2q2q?")


class _BatchWire(NamedTuple):
    """The fields of ``_BATCH_FMT`` in order: a Batch on the wire."""

    tag: int
    seq: int
    epoch: int
    offset: int
    count: int  # type: ignore[assignment]  # the field hides tuple.count
    slab_kind: int  # index into SLAB_KINDS
    segment_id: int
    slot: int
    size: int
    meta_offset: int
    meta_len: int
    missed_batches: int
    missed_samples: int
    fd_attached: bool


_EPOCH_END_FMT = struct.Struct("<B3q")  # tag, seq, epoch, samples
_NEXT_FMT = struct.Struct("<BdqqH")  # tag, stall_s, samples, batches, number of released seqs
_SEQ = struct.Struct("<q")


def encode(message: object) -> bytes:
    if type(message) is Batch:
        seg = message.segment
        wire = _BatchWire(
            tag=_BATCH,
            seq=message.seq,
            epoch=message.epoch,
            offset=message.offset,
            count=message.count,
            slab_kind=SLAB_KINDS.index(seg.kind),
            segment_id=seg.segment_id,
            slot=seg.slot,
            size=seg.size,
            meta_offset=message.meta_offset,
            meta_len=message.meta_len,
            missed_batches=message.missed_batches,
            missed_samples=message.missed_samples,
            fd_attached=message.fd_attached,
        )
        return _BATCH_FMT.pack(*wire)
    if type(message) is Next:
        if len(message.release) > MAX_RELEASE:
            raise ProtocolError(f"a Next releases at most {MAX_RELEASE} batches")
        head = _NEXT_FMT.pack(_NEXT, message.stall_s, message.samples, message.batches, len(message.release))
        return head + b"".join(_SEQ.pack(seq) for seq in message.release)
    if type(message) is EpochEnd:
        return _EPOCH_END_FMT.pack(_EPOCH_END, message.seq, message.epoch, message.samples)
    return bytes([_PICKLED]) + pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> object:
    tag = data[0]
    if tag == _BATCH:
        w = _BatchWire._make(_BATCH_FMT.unpack(data))
        segment = Segment(kind=SLAB_KINDS[w.slab_kind], segment_id=w.segment_id, slot=w.slot, size=w.size)
        return Batch(
            seq=w.seq,
            epoch=w.epoch,
            offset=w.offset,
            count=w.count,
            segment=segment,
            meta_offset=w.meta_offset,
            meta_len=w.meta_len,
            missed_batches=w.missed_batches,
            missed_samples=w.missed_samples,
            fd_attached=w.fd_attached,
        )
    if tag == _NEXT:
        _, stall_s, samples, batches, n = _NEXT_FMT.unpack_from(data)
        base = _NEXT_FMT.size
        release = tuple(_SEQ.unpack_from(data, base + 8 * i)[0] for i in range(n))
        return Next(release=release, stall_s=stall_s, samples=samples, batches=batches)
    if tag == _EPOCH_END:
        _, seq, epoch, samples = _EPOCH_END_FMT.unpack(data)
        return EpochEnd(seq=seq, epoch=epoch, samples=samples)
    if tag == _PICKLED:
        return _checked(_MessageUnpickler(io.BytesIO(data[1:])).load())
    raise ProtocolError(f"unknown message tag {tag}")


def _checked(message: object) -> object:
    """``message`` once each of its fields is of its declared type (a pickle may set a field
    to anything: a peer's ``world_size="x"`` would fail far from here, in the producer's thread)."""
    if type(message) not in _MESSAGE_CLASSES.values() or type(message) is EntryKind:
        raise ProtocolError(f"not a message: {type(message).__name__}")
    hints = _hints(type(message))
    for name, hint in hints.items():
        if not _is(getattr(message, name), hint):
            raise ProtocolError(f"{type(message).__name__}.{name}: not a {hint}")
    return message


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The fields of message class ``cls`` (a dataclass or a named tuple) and their types."""
    if cls not in _HINTS:
        names = getattr(cls, "_fields", None) or [f.name for f in dataclasses.fields(cls)]
        every = typing.get_type_hints(cls)
        _HINTS[cls] = {n: every[n] for n in names}
    return _HINTS[cls]


def _is(value: object, hint: Any) -> bool:
    """Whether ``value`` is of type ``hint`` (the kinds of field the messages declare)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is(value, h) for h in typing.get_args(hint))
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return type(value) is tuple and all(_is(v, item) for v in value)
    if hint is type(None):
        return value is None
    if hint is float:
        return type(value) in (float, int)
    if hint in _MESSAGE_CLASSES.values():  # a record in a record (a Batch's Segment)
        return type(value) is hint and _checked(value) is value
    return type(value) is hint


class _MessageUnpickler(pickle.Unpickler):
    """Unpickles this module's messages and nothing else: a peer (another user's job, where a
    share is public) can build no object but a message, run no code of anyone's."""

    def find_class(self, module: str, name: str) -> type:
        if module == __name__ and name in _MESSAGE_CLASSES:
            return _MESSAGE_CLASSES[name]
        raise ProtocolError(f"a message may not hold {module}.{name}")


_MESSAGE_CLASSES: dict[str, type] = {
    c.__name__: c
    for c in (
        Hello, Next, Release, Bye, Stats, Items, ItemsReply, Welcome, Refused, SetAside, Segment,
        Batch, EpochEnd, End, Failed, ConsumerStats, StatsReply, EntryKind,
    )
}  # fmt: skip


# --- sending and receiving ---------------------------------------------------------------------
def send(
    sock: socket.socket, message: object, fds: tuple[int, ...] = (), timeout: float | None = 2.0
) -> None:
    """Send one message (and optionally file descriptors) as one packet."""
    data = encode(message)
    if len(data) > MAX_PACKET:
        raise ProtocolError(f"control message of {len(data)} bytes exceeds {MAX_PACKET}")
    send_packet(sock, data, fds, timeout)


def recv(sock: socket.socket, timeout: float | None = None) -> tuple[object, list[int]]:
    """Receive one message and any file descriptors it carries.

    A closed or reset connection raises ``EOFError``; no message within ``timeout``
    seconds raises ``TimeoutError``; an undecodable one ``ProtocolError``.
    """
    data, fds = recv_packet(sock, timeout)
    try:
        return decode(data), fds
    except Exception as exc:  # a peer of another version or a corrupted packet
        close_fds(fds)
        raise ProtocolError(f"undecodable control message: {exc}") from exc


__all__ = [
    "PROTOCOL_VERSION",
    "Batch",
    "Bye",
    "ConsumerStats",
    "End",
    "EntryKind",
    "EpochEnd",
    "Failed",
    "Hello",
    "Items",
    "ItemsReply",
    "Next",
    "Refused",
    "Release",
    "Segment",
    "SetAside",
    "Stats",
    "StatsReply",
    "Welcome",
    "recv",
    "send",
]
