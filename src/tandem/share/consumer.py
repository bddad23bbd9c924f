"""The consumer: an iterable of batches served by a producer on this host.

``for batch in Consumer("imagenet"):`` is one epoch; every ``iter()`` the next one. Batches are views into
the producer's shared memory, valid while the next batch is fetched, across epoch boundaries
too, until the batch after it is asked for (or :meth:`Consumer.release` is called): what
Lightning's and any device prefetcher's one-ahead fetching needs. A batch still referenced
after that is copied out before its memory is reused (and a
:class:`~tandem.share.errors.BatchKeptWarning` says so once): never overwritten, but a copy.
To keep batches on purpose, copy them: ``tandem.share.clone_batch(batch)``. Modifying a
batch from host memory in place changes only this consumer's copy-on-write view, never the
producer's data or another consumer's. A batch from a CUDA slab (``Producer(...,
device="cuda:N")``) is the producer's GPU memory itself, shared with every consumer on that
GPU: never write into it (clone first); a consumer that does is warned, since the others may
have read the changed data.

This module attaches the consumer to its producer (and detaches it), and keeps its options,
its resumable state and its counts on view; its :class:`~tandem.share._reading.StreamReader`,
made once attached, turns the producer's stream into the consumer's epochs and batches.
"""

from __future__ import annotations

import logging
import math
import os
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tandem._ipc import close_fds, peer_uid
from tandem.share import _table, protocol
from tandem.share._channel import Connection, SocketChannel, TableChannel, connect, say_bye
from tandem.share._cuda import DeviceCopier, check_device
from tandem.share._cuda_slab import CudaSegmentMap, local_device
from tandem.share._gate import ReleaseGate
from tandem.share._order import Position
from tandem.share._reading import SlabAccess, StreamReader
from tandem.share._registry import live_producers, socket_path, validate_name
from tandem.share._resume import Identity, merge
from tandem.share._segment_map import SegmentMap
from tandem.share._tree import flatten, unflatten
from tandem.share.errors import (
    ProducerNotFound,
    ProtocolError,
    RefusedByProducer,
    ShareError,
)
from tandem.share.spec import PUBLIC_SOCKET_ENV, SHARE_OWNER_ENV

log = logging.getLogger("tandem.share")
_SAY_WAITING_AFTER_S = 2.0  # a producer starting up beside its consumers is not worth a message


class Consumer:
    """Attach to the producer serving ``name`` on this host.

    ``batch_size``: None for the producer's batches as they are, or any positive integer.
    ``drop_last``: drop each epoch's last partial batch (needs a ``batch_size``).
    ``timeout``: seconds to wait for the producer to appear and to answer when attaching.
    ``data_timeout``: seconds to wait for a batch; None (default) waits as long as the
    producer lives, like a ``DataLoader``: under the default policy a slow or paused
    consumer legitimately holds the others, and a dead producer is noticed at once anyway.
    ``device``: ``"cpu"`` or ``"cuda[:N]"``.
    ``rank``, ``world_size``: this process's part of a distributed job (default: from
    ``torch.distributed`` once it is initialised, else the whole stream). Rank ``r`` of ``W``
    gets ``n // W`` samples of every ``n``-sample epoch, disjoint from the other ranks' (like
    ``DistributedSampler(drop_last=True)``: the epoch's last ``n % W`` samples are dropped, so
    that every rank runs as many steps). The ranks are one group on the producer, with the
    same epochs; ``group`` names it (default: ``$TANDEM_JOB_ID``, ``$TORCHELASTIC_RUN_ID`` or
    ``$MASTER_ADDR:$MASTER_PORT``, which every rank of a job has alike).
    ``transform``: a function of each batch, run here, after the copy to ``device``: what
    differs from job to job of a sweep (a model's own resize and normalisation), while the
    producer decodes and augments once for all.
    """

    def __init__(
        self,
        name: str,
        batch_size: int | None = None,
        drop_last: bool = False,
        timeout: float = 60.0,
        device: str = "cpu",
        data_timeout: float | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        group: str | None = None,
        transform: Callable[[Any], Any] | None = None,
    ):
        validate_name(name)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable (batch -> batch), got {type(transform).__name__}")
        self.transform = transform
        self.rank, self.world_size, self.group = ranks(rank, world_size, group)
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
        self._slab_access: SlabAccess | None = None
        self._reader: StreamReader | None = None
        self._closed = False
        # Another user's producer (a public share): read as its guest (see _connect).
        self._guest = False
        self._conn = Connection(self._connect(), name, self.timeout)
        # Also run when the consumer is garbage-collected or the interpreter exits.
        self._resources: list = []
        self._finalizer = weakref.finalize(self, _release_resources, self._conn.sock, self._resources)
        welcome = self._hello()
        self.producer_pid = self._conn.producer_pid = welcome.pid
        self.policy = welcome.policy
        self.slab = welcome.slab
        self._slab_access = access = self._open_slab(welcome)
        self._conn.segments = access.segments
        self._resources.append(access.segments)
        # Not the bound method: the channel would keep this consumer alive in a reference
        # cycle, and a consumer the client drops must detach at once, not at the next
        # garbage collection (a DataModule that makes a new one every epoch).
        progress = _weak_progress(weakref.ref(self))
        channel: SocketChannel | TableChannel
        if welcome.transport == "table":
            table = _table.AnnouncementTable.from_fd(self._conn.welcome_fds.pop())
            channel = TableChannel(
                self._conn, table, welcome.table_index, access.segments, progress, access.gate
            )
        else:
            channel = SocketChannel(self._conn, progress, access.gate)
        self._reader = StreamReader(
            channel,
            access,
            welcome,
            name=name,
            batch_size=batch_size,
            drop_last=drop_last,
            rank=self.rank,
            world_size=self.world_size,
            data_timeout=data_timeout,
            device=self.device,
            transform=transform,
        )
        self._dataset_id = getattr(welcome, "dataset_id", "")  # a producer of an older tandem: none
        if self.world_size > 1 and welcome.samples_per_epoch is None:
            self.close()
            raise ShareError(
                f"producer {name!r} does not know its epoch length yet, which ranks need to split "
                "every epoch alike; give its IterableDataset a length (webdataset: .with_length(n))"
            )

    def __iter__(self) -> Iterator[Any]:
        return self._reading.epoch()

    def __len__(self) -> int:
        return len(self._reading)

    @property
    def _reading(self) -> StreamReader:
        if self._reader is None:
            raise ShareError(f"consumer of {self.name!r} is not attached")
        return self._reader

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

    # ------------------------------------------------------------------ what it has read
    @property
    def stall_s(self) -> float:
        """Seconds this consumer has waited for the producer's data."""
        return self._reading.channel.stall_s

    @property
    def transport(self) -> str:
        """How entries reach this consumer: ``"table"`` or ``"socket"`` (see ``protocol``)."""
        return self._reading.channel.transport

    @property
    def position(self) -> Position:
        """This consumer's position in the producer's stream: (epoch, sample offset)."""
        return self._reading.position

    @property
    def start(self) -> Position:
        """Where this consumer joined the stream: its epochs run from there."""
        return self._reading.start

    @property
    def samples(self) -> int:
        """Samples delivered so far."""
        return self._reading.samples

    @property
    def batches(self) -> int:
        """Batches delivered so far."""
        return self._reading.batches

    @property
    def missed_batches(self) -> int:
        """Producer batches missed behind the window (``policy="skip"`` only)."""
        return self._reading.missed_batches

    @property
    def missed_samples(self) -> int:
        """The samples of those batches."""
        return self._reading.missed_samples

    @property
    def kept_batches(self) -> int:
        """Batches copied out because they were still referenced past the contract."""
        return self._reading.kept_batches

    @property
    def last_indices(self) -> torch.Tensor | None:
        """The dataset indices of the last batch handed over (None where the producer sends
        none: a source it does not order), for logging or weighting per sample."""
        return self._reading.last_indices

    @property
    def warn_kept(self) -> bool:
        """Whether a batch kept past the contract is warned of (once); the drop-in
        ``DataLoader`` turns it off: its batches are its user's to keep, as torch's are."""
        return self._reading.warn_kept

    @warn_kept.setter
    def warn_kept(self, warn: bool) -> None:
        self._reading.warn_kept = warn

    def _progress(self) -> tuple[float, int, int, Position]:
        reader = self._reader
        return reader.progress() if reader is not None else (0.0, 0, 0, (0, 0))

    # ------------------------------------------------------------------ connection
    def _connect(self):
        path, owner = self._public()
        started = time.monotonic()
        said = False
        while True:
            sock = connect(str(path))
            if sock is not None:
                return sock if owner is None else self._checked_peer(sock, owner)
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

    def _public(self) -> tuple[Path, int | None]:
        """Where this share's producer listens, and whose it must be: a public share's as
        the job manager told its job (``$TANDEM_SHARE_SOCKET``, ``$TANDEM_SHARE_OWNER``), else
        this user's private runtime directory's (None: theirs by where it is)."""
        env = os.environ
        if env.get("TANDEM_SHARE") != self.name or not env.get(PUBLIC_SOCKET_ENV):
            return socket_path(self.name), None
        try:
            return Path(env[PUBLIC_SOCKET_ENV]), int(env.get(SHARE_OWNER_ENV, ""))
        except ValueError:
            raise ShareError(
                f"{SHARE_OWNER_ENV}={env.get(SHARE_OWNER_ENV)!r} is not a user id: run the job through "
                "tandem submit --share, which sets it"
            ) from None

    def _checked_peer(self, sock: Any, owner: int) -> Any:
        """``sock`` once its peer is the share's definer (what listens there is theirs or
        none: the socket's folder is theirs in one of root's; checked all the same). Another
        user's producer is read as a guest: its batches' structure decoded without any class
        of its code, over the socket only."""
        uid = peer_uid(sock)
        if uid != owner:
            sock.close()
            raise ShareError(
                f"the producer of public share {self.name!r} runs as user {uid}, not as its "
                f"definer {owner}: not read"
            )
        self._guest = uid != os.getuid()
        return sock

    @staticmethod
    def _live_producers() -> str:
        live = [p.name for p in live_producers()]
        return f"live producers: {', '.join(live)}" if live else "no producer is live"

    def _open_slab(self, welcome: protocol.Welcome) -> SlabAccess:
        """The map of the producer's slab, as ``Welcome`` says which it is."""
        if welcome.slab == "cuda":
            try:
                slab_device = local_device(welcome.slab_device, f"producer {self.name!r}")
            except ShareError:
                close_fds(self._conn.welcome_fds)
                self.close()
                raise
            cuda_slab = CudaSegmentMap(slab_device, self.name)
            return SlabAccess(cuda_slab, cuda_slab=cuda_slab, gate=ReleaseGate())
        if welcome.slab != "host":
            close_fds(self._conn.welcome_fds)
            self.close()
            raise ProtocolError(f"unknown slab kind {welcome.slab!r} in Welcome")
        if self._guest and welcome.slab != "host":
            close_fds(self._conn.welcome_fds)
            self.close()
            raise ProtocolError(f"another user's producer {self.name!r} named a {welcome.slab} slab")
        segments = SegmentMap(writable_private=self.device.type == "cpu", trusted=not self._guest)
        if self.device.type != "cuda":
            return SlabAccess(segments)
        copier = DeviceCopier(self.device)
        segments.on_map = copier.pin
        return SlabAccess(segments, copier=copier, gate=ReleaseGate())

    def _hello(self) -> protocol.Welcome:
        hello = protocol.Hello(
            version=protocol.PROTOCOL_VERSION,
            pid=os.getpid(),
            batch_size=self.batch_size,
            device=str(self.device),
            table=_table.supported() and not self._guest,
            group=self.group,
            rank=self.rank,
            world_size=self.world_size,
        )
        self._conn.send(hello)
        reply = self._conn.receive("attaching", self.timeout)
        if isinstance(reply, protocol.Refused):
            self.close()
            raise RefusedByProducer(f"producer {self.name!r} refused this consumer: {reply.reason}")
        if not isinstance(reply, protocol.Welcome):
            self.close()
            raise ProtocolError(f"expected Welcome, got {type(reply).__name__}")
        if self._guest and (reply.transport != "socket" or self._conn.welcome_fds):
            # Another user's table would be memory of theirs we map shared, unsealed.
            close_fds(self._conn.welcome_fds)
            self.close()
            raise ProtocolError(
                f"another user's producer {self.name!r} named the {reply.transport} transport"
            )
        if reply.transport == "table" and not self._conn.welcome_fds:
            self.close()
            raise ProtocolError("Welcome named the table transport but carried no table")
        return reply

    # ------------------------------------------------------------------ lifecycle
    def release(self) -> None:
        """Release the producer batches behind the batches delivered so far now, not at the
        next requests. Their tensors must not be used afterwards (copy what you keep).
        """
        self._reading.release()

    def close(self) -> None:
        """Detach from the producer (also done when the process exits or dies)."""
        if self._closed:
            return
        self._closed = True
        access = self._slab_access
        try:
            if access is not None and access.copier is not None:
                access.copier.close()  # copies out of shared memory finish before we let go
            if access is not None and access.cuda_slab is not None:
                access.cuda_slab.finish()  # our last kernels may still read a slot
        finally:
            say_bye(self._conn.sock)
            if self._reader is not None:
                self._reader.close()
            self._finalizer()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """Where this consumer is in its epoch: the items it has delivered of it (by dataset
        index, where the producer owns the order; else a count), with the share's name and
        its dataset's length and fingerprint. A consumer given it with
        :meth:`load_state_dict` finishes that epoch with exactly the other items, then goes
        on with whole epochs; at an epoch's end it says so, and resumes the next epoch.
        Small: a bit per item.

        The ranks of a distributed job: the state is the whole group's (the items every rank
        has delivered), so any rank's resumes every rank. Taking it is then a collective over
        ``torch.distributed``: every rank calls it, as Lightning does when it saves a
        checkpoint. Without ``torch.distributed``, merge the ranks' states with
        :meth:`merge_states`."""
        state = self._reading.items.state(self._identity(), self.rank, self._full_epoch())
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() == self.world_size:
                states: list[Any] = [None] * self.world_size
                dist.all_gather_object(states, state)
                state = merge(states)
        return state

    @staticmethod
    def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
        """The group's state of its ranks' own states, rank ``r``'s at ``states[r]``."""
        return merge(states)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next epoch is the rest of the interrupted one
        (the next whole one for a state taken at an epoch's end). A state of another share or
        dataset, a malformed or out-of-range one, is a ``ValueError`` saying which."""
        self._reading.items.load(state, self._identity(), self._full_epoch())

    def _identity(self) -> Identity:
        return Identity(self.name, self._reading.samples_per_epoch, self._dataset_id, self.world_size)

    def _full_epoch(self) -> int | None:
        """The samples this consumer delivers in a whole epoch, where known."""
        n = self._reading.samples_per_epoch
        if n is None:
            return None
        n //= self.world_size
        if self.drop_last and self.batch_size is not None:
            n = n // self.batch_size * self.batch_size
        return n


def ranks(rank: int | None, world_size: int | None, group: str | None) -> tuple[int, int, str]:
    """``(rank, world_size, group key)``, as given or from an initialised
    ``torch.distributed``; a clear error for what cannot work."""
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither (then torch.distributed's are used)")
    if rank is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = 0, 1
    assert world_size is not None
    for label, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{label} must be an integer, got {value!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in [0, world_size) and world_size >= 1, got rank={rank}, world_size={world_size}"
        )
    if world_size == 1:
        return 0, 1, ""
    if group is None:
        env = os.environ
        if env.get("TANDEM_JOB_ID"):
            group = f"job:{env['TANDEM_JOB_ID']}"
        elif env.get("TORCHELASTIC_RUN_ID"):
            group = f"torchelastic:{env['TORCHELASTIC_RUN_ID']}"
        elif env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
            group = f"master:{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        else:
            raise ValueError(
                "the ranks of a job must name their group alike: pass group='...' (the same on every "
                "rank), or run under tandem submit, torchrun or a launcher that sets MASTER_PORT"
            )
    return rank, world_size, str(group)


def _weak_progress(ref: weakref.ref) -> Callable[[], tuple[float, int, int, Position]]:
    def progress() -> tuple[float, int, int, Position]:
        consumer = ref()
        return consumer._progress() if consumer is not None else (0.0, 0, 0, (0, 0))

    return progress


def _release_resources(sock, resources: list) -> None:
    for segments in resources:
        segments.close()
    sock.close()


def clone_batch(batch: Any) -> Any:
    """A deep copy of a batch's tensors, to keep it past the next step."""
    spec, leaves = flatten(batch)
    return unflatten(spec, [t.clone() for t in leaves])
