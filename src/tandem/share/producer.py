"""The producer: loads each batch once and serves it to every attached consumer.

Two threads. The main thread (``serve``) iterates the source, writes each batch into a free
slot of the host slab and publishes it as an *entry*. The control thread accepts consumers
and answers their requests from the published entries (see :mod:`tandem.share.protocol`).
Both share one lock; every wait on it has a timeout so signals and stops are seen.

Pacing (``policy``):

``"wait"`` (default)
    An entry's slot is reused once every attached consumer has taken and released it: the
    slowest consumer sets the pace, and nobody misses anything.
``"skip"``
    The producer keeps pace with the fastest consumer. When it needs a slot, it drops the
    oldest entry that no consumer is reading; consumers that had not taken it yet skip it
    and are told how many batches and samples they missed.
"""

from __future__ import annotations

import collections
import logging
import os
import selectors
import signal
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch.utils.data

from tandem.share import protocol
from tandem.share.errors import UnsupportedBatch
from tandem.share.order import PlannedSampler, plan_epoch
from tandem.share.registry import Registration
from tandem.share.ring import KIND_BATCH, KIND_EPOCH_END, RING_SUPPORTED, ControlBlock
from tandem.share.slab import HostSlab
from tandem.share.tree import flatten, sample_count

log = logging.getLogger("tandem.share")

POLICIES = ("wait", "skip")
_TICK = 0.2  # longest sleep of any wait, so stops and signals are seen promptly
_WARN_BLOCKED_S = 30.0
_POLL_RELEASES_S = 0.002  # under "wait", releases arrive in shared memory: poll this often
MAX_CONSUMERS = 64


@dataclass(slots=True)
class _Entry:
    seq: int
    kind: str  # "batch" | "epoch_end" | "end" | "failed"
    epoch: int
    offset: int
    count: int = 0
    slot: int | None = None
    message: Any = None  # the protocol message sent for it (segment fd attached separately)


@dataclass(slots=True)
class _Consumer:
    """The producer's view of one consumer.

    Under "wait" (``control`` set) the consumer keeps its cursor and releases in its record
    of the control block; under "skip" the producer keeps them here from the messages.
    """

    cid: int
    sock: socket.socket
    pid: int
    batch_size: int | None
    device: str
    server_cursor: int
    start: tuple[int, int]
    cut: int
    index: int
    control: ControlBlock | None
    holds: set[int] = field(default_factory=set)
    segments: set[int] = field(default_factory=set)
    waiting: bool = False
    done: bool = False
    missed_batches_pending: int = 0
    missed_samples_pending: int = 0
    missed_batches: int = 0
    batches: int = 0
    samples: int = 0
    stall_s: float = 0.0
    attached_at: float = field(default_factory=time.monotonic)
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))
    position: tuple[int, int] = (0, 0)

    @property
    def cursor(self) -> int:
        return self.control.taken(self.index) if self.control else self.server_cursor

    def released_below(self) -> int:
        """Every entry below this seq is released by this consumer ("wait" only)."""
        assert self.control is not None
        return self.control.released(self.index)


class Producer:
    """Serve batches from ``source`` to every consumer that attaches to ``name``.

    ``source`` is any re-iterable of batches (a ``DataLoader`` or any iterable): each
    ``iter(source)`` is one epoch. Use :meth:`from_dataset` to let the producer own the
    sample order, which late joiners need to see every sample exactly once when shuffling.
    """

    def __init__(
        self,
        source: Iterable[Any],
        name: str,
        *,
        window: int = 8,
        policy: str = "wait",
        drain_timeout: float | None = None,
    ):
        if not isinstance(source, Iterable):
            raise TypeError(f"source must be a re-iterable of batches, got {type(source).__name__}")
        if isinstance(source, (str, bytes, Iterator)):
            raise TypeError(
                "source must be re-iterable (each iter() one epoch), not a one-shot iterator or "
                "generator; pass a DataLoader, a list, or an object whose __iter__ starts anew"
            )
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if not isinstance(window, int) or window < 2:
            raise ValueError(f"window must be an integer >= 2, got {window!r}")
        self.name = name
        self.window = window
        self.policy = policy
        self.drain_timeout = drain_timeout
        self._source = source
        self._registration = Registration(name)
        self._slab = HostSlab(f"{name}:{os.getpid()}", window)
        self._control = ControlBlock.create(f"{name}:{os.getpid()}", 4 * window + 64, MAX_CONSUMERS)
        self._free_indices = list(range(MAX_CONSUMERS - 1, -1, -1))
        self._cond = threading.Condition(threading.RLock())
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._next_seq = 0
        self._free = list(range(window))
        self._consumers: dict[int, _Consumer] = {}
        self._next_cid = 1
        self._epoch = 0
        self._offset = 0
        self._epoch_done = False
        self._wrapping = False
        self._closing = False
        self._stop_reason: str | None = None
        self._end_seq: int | None = None
        self._samples_per_epoch: int | None = None
        self._batch_size: int | None = None
        self._sampler: PlannedSampler | None = None
        self._shuffle = False
        self._seed = 0
        self._order: np.ndarray | None = None
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._started = False
        self._ever_attached = False
        self._epochs_target: int | None = None
        self._published_batches = 0
        self._recent = collections.deque(maxlen=64)
        self.blocked_s = 0.0
        self.epochs_served = 0
        try:  # a DataLoader: its epoch length in samples, when it is fixed
            self._batch_size = source.batch_size  # type: ignore[attr-defined]
            if source.drop_last:  # type: ignore[attr-defined]
                self._samples_per_epoch = len(source) * self._batch_size  # type: ignore[arg-type]
            else:
                self._samples_per_epoch = len(source.sampler)  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            self._batch_size = self._samples_per_epoch = None

    # ----------------------------------------------------------------------------- setup
    @classmethod
    def from_dataset(
        cls,
        dataset: torch.utils.data.Dataset,
        name: str,
        *,
        batch_size: int = 32,
        shuffle: bool = False,
        num_workers: int = 0,
        collate_fn: Any = None,
        seed: int = 0,
        prefetch_factor: int | None = None,
        **kwargs: Any,
    ) -> Producer:
        """A producer over a map-style dataset whose sample order it owns (see ``order``)."""
        try:
            size = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError("from_dataset needs a map-style dataset with __len__") from None
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        sampler = PlannedSampler(size)
        loader_kwargs: dict[str, Any] = {}
        if num_workers > 0:
            loader_kwargs["persistent_workers"] = True
            if prefetch_factor is not None:
                loader_kwargs["prefetch_factor"] = prefetch_factor
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            drop_last=False,
            **loader_kwargs,
        )
        producer = cls(loader, name, **kwargs)
        producer._sampler = sampler
        producer._shuffle = shuffle
        producer._seed = seed
        producer._samples_per_epoch = size
        producer._batch_size = batch_size
        return producer

    def start(self) -> Producer:
        """Claim the name and start accepting consumers (``serve`` calls this if needed)."""
        if self._started:
            return self
        if self._wake_r.fileno() == -1:
            raise RuntimeError("this producer was closed; create a new one")
        self._registration.acquire()
        try:
            listener = protocol.new_socket()
            old_umask = os.umask(0o177)  # the socket file is for this user only
            try:
                listener.bind(str(self._registration.socket_path))
            finally:
                os.umask(old_umask)
            listener.listen(64)
            listener.setblocking(False)
        except BaseException:
            self._registration.release()
            raise
        self._listener = listener
        self._started = True
        self._thread = threading.Thread(
            target=self._control_loop, name=f"tandem-producer-{self.name}", daemon=True
        )
        self._thread.start()
        log.info("producer %r serving on %s", self.name, self._registration.socket_path)
        return self

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stop(self, reason: str = "stopped") -> None:
        """Ask ``serve`` to stop after the current batch; safe from any thread or handler."""
        with self._cond:
            if self._stop_reason is None:
                self._stop_reason = reason
            self._cond.notify_all()

    def close(self) -> None:
        """Tell consumers, stop the control thread, free the slab and the name."""
        if not self._started:
            self._free_unstarted()
            return
        with self._cond:
            self._publish_end(self._stop_reason or "producer closed", finished=False)
            self._push_final()
            self._closing = True
            self._cond.notify_all()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._cond:
            for c in list(self._consumers.values()):
                self._detach(c, "producer closed")
        if self._listener is not None:
            self._listener.close()
        self._registration.release()
        self._slab.close()
        self._control.close()
        for s in (self._wake_r, self._wake_w):
            s.close()
        shutdown = getattr(getattr(self._source, "_iterator", None), "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._started = False

    def _free_unstarted(self) -> None:
        if self._wake_r.fileno() != -1:
            self._control.close()
            self._slab.close()
            self._wake_r.close()
            self._wake_w.close()

    def __del__(self) -> None:
        try:
            if not self._started:
                self._free_unstarted()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ----------------------------------------------------------------------------- serving
    def serve(self, epochs: int | None = None) -> None:
        """Serve until stopped, or until ``epochs`` epochs (plus late joiners' wrap) are done.

        Raises the source's exception (or :class:`UnsupportedBatch`) after telling the
        consumers. SIGINT/SIGTERM stop it cleanly when called from the main thread.
        """
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ValueError(f"epochs must be a positive integer or None, got {epochs!r}")
        owns = not self._started
        self._epochs_target = epochs
        self.start()
        restore = self._install_signal_handlers()
        failure: BaseException | None = None
        try:
            self._produce(epochs)
        except BaseException as exc:
            failure = exc
            where = "" if isinstance(exc, UnsupportedBatch) else f"{type(exc).__name__}: "
            with self._cond:
                self._publish_failed(f"producer {self.name!r} failed: {where}{exc}")
        try:
            stopped = self._stop_reason is not None or failure is not None
            self._drain(10.0 if stopped else self.drain_timeout)
        finally:
            restore()  # only now: a signal while draining still stops cleanly
            if owns:
                self.close()
        if failure is not None:
            raise failure

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {}

        def handler(signum: int, _frame: object) -> None:
            if self._stop_reason is not None:  # a second signal: stop hard
                raise KeyboardInterrupt
            self.stop(f"stopped by {signal.Signals(signum).name}")

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    def _produce(self, epochs: int | None) -> None:
        epoch = 0
        while self._stop_reason is None:
            limit = None
            if epochs is not None and epoch >= epochs:
                if not self._wait_first_consumer():
                    break
                with self._cond:
                    limit = max((c.cut for c in self._consumers.values()), default=0)
                    self._wrapping = True
                if limit == 0:
                    break
            self._begin_epoch(epoch, limit)
            offset = 0
            completed = True
            for batch in self._source:
                spec, leaves = flatten(batch)
                count = self._count(spec, leaves, offset)
                slot = self._acquire_slot()
                if slot is None:
                    completed = False
                    break
                meta_offset, meta_len = self._slab.write(slot, spec, leaves)
                del spec, leaves, batch
                with self._cond:
                    self._publish_batch(epoch, offset, count, slot, meta_offset, meta_len)
                offset += count
                if self._stop_reason is not None or (limit is not None and offset >= limit):
                    # a stop that comes with the epoch's last batch still ends the epoch
                    known = self._samples_per_epoch
                    completed = limit is None and known is not None and offset >= known
                    break
            if limit is not None:
                break
            if completed and offset == 0:
                raise ValueError(
                    f"the source yielded no batch in epoch {epoch}; a producer needs a source "
                    "whose every iter() yields at least one batch"
                )
            if completed:
                with self._cond:
                    self._publish(_Entry(self._next_seq, "epoch_end", epoch, offset))
                    self._epoch_done = True
                    if self._samples_per_epoch is None:
                        self._samples_per_epoch = offset
                self.epochs_served += 1
            if self._stop_reason is not None:
                break
            epoch += 1
        with self._cond:
            if self._stop_reason is not None:
                self._publish_end(self._stop_reason, finished=False)
            else:
                self._publish_end(f"served {epochs} epoch(s)", finished=True)

    def _wait_first_consumer(self) -> bool:
        """A run shorter than the window must not end before anyone could take it."""
        with self._cond:
            while not self._ever_attached:
                if self._stop_reason is not None:
                    return False
                self._cond.wait(_TICK)
            return True

    def _count(self, spec: tuple, leaves: list, offset: int) -> int:
        if self._sampler is not None and self._batch_size is not None:
            return min(self._batch_size, self._sampler.limit - offset)
        return sample_count(spec, leaves)

    def _begin_epoch(self, epoch: int, limit: int | None) -> None:
        with self._cond:
            cuts = [c.cut for c in self._consumers.values()]
            self._epoch = epoch
            self._offset = 0
            self._epoch_done = False
            if self._sampler is not None:
                self._order = plan_epoch(
                    self._order, self._sampler.size, cuts, self._shuffle, self._seed, epoch
                )
                self._sampler.order = self._order
                self._sampler.limit = self._sampler.size if limit is None else limit

    def _acquire_slot(self) -> int | None:
        waited_from = None
        warned_at = time.monotonic()
        with self._cond:
            while True:
                if self._stop_reason is not None:
                    return None
                self._evict()
                ready = self._policy_allows()
                if ready and self._free:
                    slot = self._free.pop()
                elif ready and self.policy == "skip" and self._slab.slots < self._slot_cap():
                    slot = self._slab.add_slot()
                else:
                    now = time.monotonic()
                    waited_from = waited_from or now
                    if now - warned_at > _WARN_BLOCKED_S:
                        warned_at = now
                        log.warning("producer %r: waiting for %s", self.name, self._laggards())
                    polling = self.policy == "wait" and self._consumers
                    self._cond.wait(_POLL_RELEASES_S if polling else _TICK)
                    continue
                if waited_from is not None:
                    self.blocked_s += time.monotonic() - waited_from
                return slot

    def _slot_cap(self) -> int:
        return self.window + 2 * len(self._consumers) + 1

    def _policy_allows(self) -> bool:
        if self.policy == "wait" or not self._consumers:
            return True
        # "skip": keep pace with the fastest consumer only
        fastest = max(c.cursor for c in self._consumers.values())
        return self._next_seq - fastest < self.window

    def _laggards(self) -> str:
        oldest = next(iter(self._entries), self._next_seq)
        slow = [
            f"consumer {c.cid} (pid {c.pid})"
            for c in self._consumers.values()
            if c.cursor <= oldest
            or oldest in c.holds
            or (c.control is not None and c.released_below() <= oldest)
        ]
        return ", ".join(slow) or "a consumer to attach"

    # ------------------------------------------------------------------ entries (lock held)
    def _publish(self, entry: _Entry) -> None:
        if entry.kind == "batch":
            m = entry.message
            self._control.announce(
                entry.seq, entry.epoch, entry.offset, entry.count, KIND_BATCH, entry.slot,
                m.segment.segment_id, m.segment.size, m.meta_offset, m.meta_len,
            )  # fmt: skip
        elif entry.kind == "epoch_end":
            self._control.announce(entry.seq, entry.epoch, entry.offset, 0, KIND_EPOCH_END,
                                   0, 0, 0, 0, 0)  # fmt: skip
        self._entries[entry.seq] = entry
        self._next_seq = entry.seq + 1
        now = time.monotonic()
        for c in self._consumers.values():
            if c.control is not None:  # progress samples for batches/s in `tandem share ls`
                c.recent.append((now, c.control.consumer(c.index)[4]))
        for c in list(self._consumers.values()):
            if c.waiting:
                self._reply(c)
        self._cond.notify_all()

    def _publish_batch(
        self, epoch: int, offset: int, count: int, slot: int, meta_offset: int, meta_len: int
    ) -> None:
        seg = self._slab.segment(slot).message()
        seq = self._next_seq
        message = protocol.Batch(seq, epoch, offset, count, seg, meta_offset, meta_len)
        self._offset = offset + count
        self._published_batches += 1
        self._recent.append(time.monotonic())
        self._publish(_Entry(seq, "batch", epoch, offset, count, slot, message))

    def _publish_end(self, reason: str, finished: bool) -> None:
        if self._end_seq is not None:
            return
        self._end_seq = self._next_seq
        message = protocol.End(self._next_seq, self._epoch, self._offset, reason, finished)
        self._publish(_Entry(self._next_seq, "end", self._epoch, self._offset, message=message))

    def _publish_failed(self, text: str) -> None:
        if self._end_seq is not None:
            return
        log.error("%s", text)
        self._end_seq = self._next_seq
        message = protocol.Failed(self._next_seq, text)
        self._publish(_Entry(self._next_seq, "failed", self._epoch, self._offset, message=message))

    def _evict(self) -> None:
        if not self._consumers:
            return  # keep the window for the first consumer to attach
        if self.policy == "wait":
            # Each consumer releases in order: below its ``released`` nothing is held.
            below = min(c.released_below() for c in self._consumers.values())
            for seq in list(self._entries):
                if seq >= below or self._entries[seq].kind in ("end", "failed"):
                    break
                self._drop(seq)
            return
        held: set[int] = set()
        for c in self._consumers.values():
            held |= c.holds
        slowest = min(c.cursor for c in self._consumers.values())
        for seq in list(self._entries):
            entry = self._entries[seq]
            if entry.kind in ("end", "failed"):
                break
            if seq < slowest and seq not in held:
                self._drop(seq)
        if self._free:
            return
        # "skip": reuse the oldest slot the fastest consumer has taken and nobody reads now;
        # consumers that had not taken it miss it. Without one, _acquire_slot grows the slab.
        fastest = max(c.cursor for c in self._consumers.values())
        for seq, entry in self._entries.items():
            if seq >= fastest:
                return
            if entry.slot is not None and seq not in held:
                for c in self._consumers.values():
                    if c.cursor <= seq:
                        c.missed_batches_pending += 1
                        c.missed_samples_pending += entry.count
                self._drop(seq)
                return

    def _drop(self, seq: int) -> None:
        entry = self._entries.pop(seq)
        if entry.slot is not None:
            self._free.append(entry.slot)

    def _reply(self, c: _Consumer) -> None:
        """Send ``c`` the entry at its cursor, or mark it waiting for one.

        Under "wait" the consumer advances its own cursor when the reply arrives.
        """
        if c.control is None:
            while c.server_cursor < self._next_seq and c.server_cursor not in self._entries:
                c.server_cursor += 1  # dropped under "skip"; counted in missed_*_pending
        entry = self._entries.get(c.cursor)
        if entry is None:
            c.waiting = True
            return
        c.waiting = False
        fds: tuple[int, ...] = ()
        message = entry.message
        if entry.kind == "batch":
            seg = message.segment
            attach = seg.segment_id not in c.segments
            if attach:
                fds = (self._slab.segment(seg.slot).fd,)
            if attach or c.missed_batches_pending:
                message = message._replace(
                    missed_batches=c.missed_batches_pending,
                    missed_samples=c.missed_samples_pending,
                    fd_attached=attach,
                )
            c.missed_batches += c.missed_batches_pending
            c.missed_batches_pending = c.missed_samples_pending = 0
        elif entry.kind == "epoch_end":
            message = protocol.EpochEnd(entry.seq, entry.epoch, entry.offset)
        try:
            protocol.send(c.sock, message, fds)
        except OSError as exc:
            self._detach(c, f"send failed: {exc}")
            return
        if entry.kind == "batch":
            c.segments.add(message.segment.segment_id)
        elif entry.kind in ("end", "failed"):
            c.done = True
        if c.control is not None:
            return
        if entry.kind == "batch":
            c.holds.add(entry.seq)
            c.batches += 1
            c.recent.append(time.monotonic())
            c.position = (entry.epoch, entry.offset + entry.count)
        elif entry.kind == "epoch_end":
            c.position = (entry.epoch + 1, 0)
        c.server_cursor += 1

    def _push_final(self) -> None:
        """Send the end entry to consumers that have not asked for it yet (we are leaving)."""
        if self._end_seq is None:
            return
        entry = self._entries.get(self._end_seq)
        for c in list(self._consumers.values()):
            if not c.done and entry is not None:
                try:
                    protocol.send(c.sock, entry.message)
                except OSError:
                    pass
                c.done = True

    def _drain(self, timeout: float | None) -> None:
        """Wait until every consumer has taken all published data (or left)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        warned_at = time.monotonic()
        with self._cond:
            while any(c.cursor < (self._end_seq or 0) and not c.done for c in self._consumers.values()):
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    log.warning(
                        "producer %r: leaving before %s took all published batches",
                        self.name, self._laggards(),
                    )  # fmt: skip
                    break
                if now - warned_at > _WARN_BLOCKED_S:
                    warned_at = now
                    log.warning("producer %r: draining, waiting for %s", self.name, self._laggards())
                self._cond.wait(_TICK)
            self._push_final()

    # ---------------------------------------------------------------- control thread
    def _control_loop(self) -> None:
        sel = selectors.DefaultSelector()
        assert self._listener is not None
        sel.register(self._listener, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        conns: dict[socket.socket, _Consumer | None] = {}
        try:
            while not self._closing:
                for key, _ in sel.select(timeout=_TICK):
                    if key.data == "wake":
                        continue
                    if key.data is None:
                        self._accept(sel, conns)
                    else:
                        self._on_message(sel, conns, key.fileobj)  # type: ignore[arg-type]
        except Exception:  # the control thread must never die silently
            log.exception("producer %r: control thread failed", self.name)
            self.stop("control thread failed")
        finally:
            for s in list(conns):
                sel.unregister(s)
                s.close()
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, conns: dict) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)  # protocol.send/recv never block without a timeout
        conns[conn] = None
        sel.register(conn, selectors.EVENT_READ, "conn")

    def _on_message(self, sel: selectors.BaseSelector, conns: dict, conn: socket.socket) -> None:
        consumer = conns.get(conn)
        try:
            message, fds = protocol.recv(conn)
            for fd in fds:
                os.close(fd)
        except (EOFError, OSError, protocol.ProtocolError) as exc:
            sel.unregister(conn)
            conns.pop(conn, None)
            if consumer is not None:
                with self._cond:
                    self._detach(consumer, f"disconnected ({exc})")
            conn.close()
            return
        with self._cond:
            if isinstance(message, protocol.Next) and consumer is not None:
                self._release(consumer, message.release)
                consumer.stall_s = message.stall_s
                consumer.samples = message.samples
                self._reply(consumer)
            elif isinstance(message, protocol.Release) and consumer is not None:
                self._release(consumer, message.seqs)
            elif isinstance(message, protocol.Hello) and consumer is None:
                conns[conn] = self._attach(conn, message)
            elif isinstance(message, protocol.Stats):
                self._send_quietly(conn, self.stats())
            elif isinstance(message, protocol.Bye) and consumer is not None:
                self._detach(consumer, "said goodbye")
                conns[conn] = None
            else:
                self._send_quietly(conn, protocol.Refused(f"unexpected {type(message).__name__}"))

    def _send_quietly(self, conn: socket.socket, message: object) -> None:
        try:
            protocol.send(conn, message)
        except OSError:
            pass

    def _release(self, c: _Consumer, seqs: tuple[int, ...]) -> None:
        if seqs:
            c.holds.difference_update(seqs)
            self._cond.notify_all()

    def _attach(self, conn: socket.socket, hello: protocol.Hello) -> _Consumer | None:
        if hello.version != protocol.PROTOCOL_VERSION:
            self._send_quietly(
                conn,
                protocol.Refused(
                    f"protocol version {hello.version} is not supported by this producer "
                    f"(version {protocol.PROTOCOL_VERSION}); install the same tandem version"
                ),
            )
            return None
        join = self._join_point()
        if join is None:
            self._send_quietly(
                conn,
                protocol.Refused(f"producer {self.name!r} is finishing and has no full epoch left to serve"),
            )
            return None
        if not self._free_indices:
            self._send_quietly(
                conn, protocol.Refused(f"producer {self.name!r} has {MAX_CONSUMERS} consumers")
            )
            return None
        cursor, start = join
        cut = start[1] if start[0] == self._epoch else 0
        index = self._free_indices.pop()
        self._control.reset_consumer(index, cursor)
        control = self._control if self.policy == "wait" and RING_SUPPORTED else None
        c = _Consumer(
            self._next_cid, conn, hello.pid, hello.batch_size, hello.device, cursor, start, cut,
            index, control,
        )  # fmt: skip
        c.position = start
        self._next_cid += 1
        welcome = protocol.Welcome(
            protocol.PROTOCOL_VERSION, self.name, os.getpid(), self.policy, self.window,
            start[0], start[1], self._samples_per_epoch, self._batch_size, c.cid, index,
        )  # fmt: skip
        try:
            protocol.send(conn, welcome, (self._control.fd,))
        except OSError:
            self._free_indices.append(index)
            return None
        self._consumers[c.cid] = c
        self._ever_attached = True
        log.info("consumer %d (pid %d) attached at %s", c.cid, c.pid, start)
        self._cond.notify_all()
        return c

    def _join_point(self) -> tuple[int, tuple[int, int]] | None:
        """Where a new consumer starts, or None when no full epoch is left for it.

        Preferably at the oldest epoch start still in the window (nothing is cut); else at
        the oldest entry of the epoch being produced, whose offset becomes a cut for the
        epochs planned after it (see :mod:`tandem.share.order`).
        """
        full = self._epochs_target if self._epochs_target is not None else float("inf")
        for entry in self._entries.values():
            if entry.kind == "batch" and entry.offset == 0 and entry.epoch < full:
                return entry.seq, (entry.epoch, 0)
            if entry.kind == "epoch_end" and entry.epoch + 1 < full:
                return entry.seq, (entry.epoch + 1, 0)
        if self._end_seq is not None or self._wrapping or self._stop_reason is not None:
            return None
        for entry in self._entries.values():
            if entry.epoch == self._epoch:
                return entry.seq, (self._epoch, entry.offset)
        if self._epoch_done:
            return self._next_seq, (self._epoch + 1, 0)
        return self._next_seq, (self._epoch, self._offset)

    def _detach(self, c: _Consumer, why: str) -> None:
        if self._consumers.pop(c.cid, None) is None:
            return
        self._free_indices.append(c.index)
        try:
            c.sock.shutdown(socket.SHUT_RDWR)  # a detached consumer cannot go on talking
        except OSError:
            pass
        log.info("consumer %d (pid %d) detached: %s", c.cid, c.pid, why)
        self._cond.notify_all()

    # ----------------------------------------------------------------------------- stats
    def _consumer_stats(self, c: _Consumer, now: float) -> protocol.ConsumerStats:
        if c.control is not None:
            taken, released, stall_s, samples, batches, epoch, offset = c.control.consumer(c.index)
            rate = _rate_from_counts(c.recent)
            holds = taken - released
        else:
            taken, stall_s, samples, batches = c.server_cursor, c.stall_s, c.samples, c.batches
            epoch, offset = c.position
            rate, holds = _rate(c.recent, now), len(c.holds)
        return protocol.ConsumerStats(
            c.cid, c.pid, c.batch_size, c.device, epoch, offset, max(0, self._next_seq - taken),
            holds, batches, rate, samples, stall_s, c.missed_batches, now - c.attached_at,
        )  # fmt: skip

    def stats(self) -> protocol.StatsReply:
        now = time.monotonic()
        with self._cond:
            consumers = tuple(self._consumer_stats(c, now) for c in self._consumers.values())
            return protocol.StatsReply(
                self.name, os.getpid(), self.policy, self.window, self._epoch,
                self._published_batches, _rate(self._recent, now), self.blocked_s,
                self._slab.nbytes, consumers,
            )  # fmt: skip


def _rate(stamps: collections.deque, now: float) -> float:
    if len(stamps) < 2:
        return 0.0
    span = now - stamps[0]
    return (len(stamps) - 1) / span if span > 0 else 0.0


def _rate_from_counts(samples: collections.deque) -> float:
    """Batches/s from (time, cumulative batches) pairs recorded at each stats query."""
    if len(samples) < 2:
        return 0.0
    (t0, b0), (t1, b1) = samples[0], samples[-1]
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
