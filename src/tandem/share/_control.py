"""The producer's control side: the thread that accepts consumers and answers their requests.

One thread runs a selector over the listening socket and every consumer's connection. It
admits consumers (``Hello`` → ``Welcome``, choosing each one's transport and join point),
answers ``Next`` from the window, takes ``Release``/``Bye``, answers ``Stats``, and detaches
a consumer whose connection closes (a dead consumer is seen at once as end-of-file).

Everything it touches is guarded by the producer's lock (``cond``); the produce loop calls
:meth:`ControlServer.published` (lock held) after each entry, which answers the consumers
that were waiting for it. Every wait has a timeout, so a stop is seen within ``TICK``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tandem._ipc import close_fds, peer_uid
from tandem.share import _table, protocol
from tandem.share._groups import Groups, StartHold
from tandem.share._slab import Slab
from tandem.share._transport import Link, SocketLink, TableLink
from tandem.share._window import Entry, Window
from tandem.share.protocol import EntryKind

log = logging.getLogger("tandem.share")

TICK = 0.2  # longest sleep of any wait, so stops and signals are seen promptly
WARN_BLOCKED_S = 30.0  # say who holds things up after this long
# A consumer that takes no batch for this long while others wait for it is set aside: they
# go on, and it continues its epoch on a new consumer when it comes back (a stopped process,
# a debugger, a reader that keeps its batches). Producer(aside_after_s=...) or
# $TANDEM_SHARE_ASIDE_S change it.
ASIDE_AFTER_S = 10.0
MAX_CONSUMERS = 64
# Other users' connections to a public share at once, of each and of all: theirs cannot take
# every place (MAX_CONSUMERS) nor every descriptor from the definer's jobs.
GUESTS = 16
ALL_GUESTS = MAX_CONSUMERS // 2
GUEST_MESSAGES = (protocol.Hello, protocol.Next, protocol.Release, protocol.Bye)  # all they may say
GUEST_HELLO_S = 10.0  # a guest's connection that has not attached by then is let go
GUEST_SEND_S = 0.2  # what a send to a guest may wait (a full socket: it does not read), then let go


@dataclass(slots=True, kw_only=True)
class Attached:
    """The producer's record of one attached consumer."""

    cid: int
    sock: socket.socket
    pid: int
    batch_size: int | None
    device: str
    cut: int  # its join offset within the epoch it joined (0: at an epoch start)
    link: Link
    table_index: int
    guest: int | None = None  # the uid of another user reading a public share (None: ours)
    segments: set[int] = field(default_factory=set)  # segment ids whose fd it has
    waiting: bool = False  # it asked for an entry not published yet
    done: bool = False  # it was sent End or Failed
    missed_pending: tuple[int, int] = (0, 0)  # (batches, samples) skipped, not told yet
    missed_batches: int = 0
    attached_at: float = field(default_factory=time.monotonic)
    # Its progress (cursor, released) when last seen to move, and when: a consumer that
    # takes nothing for ``aside_after_s`` while others wait is set aside.
    seen: tuple[int, int] = (-1, -1)
    seen_at: float = field(default_factory=time.monotonic)
    aside: bool = False
    retained: dict[int, int] = field(default_factory=dict)  # seq -> slot it may still read
    # (time, batches delivered) at each publish: batches/s for `tandem share ls`
    progress: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))


class ControlServer:
    """Admits consumers and answers them from the window (see the module docstring)."""

    def __init__(
        self,
        name: str,
        window: Window,
        slab: Slab,
        cond: threading.Condition,
        stats: Callable[[], protocol.StatsReply],
        on_error: Callable[[str], None],
    ):
        self.name = name
        self.window = window
        self.slab = slab
        self.cond = cond
        self.table = _table.AnnouncementTable.create(
            f"{name}:{os.getpid()}", 4 * window.cap + 64, MAX_CONSUMERS
        )
        self.consumers: dict[int, Attached] = {}
        self.groups = Groups()
        self.start_hold: StartHold | None = None  # the stream's start kept for expected consumers
        self.ever_attached = False
        self.dataset_id = ""  # the served dataset's fingerprint, for consumers' states
        # Digests of the served dataset's items (a reader's check of its data), where the
        # producer owns a map-style dataset: set by Producer.from_dataset.
        self.item_digests: Callable[[list[int]], list[str]] | None = None
        # Held while the produce loop starts an epoch (a DataLoader forks its workers then)
        # and while items are digested on a thread of their own (see _answer_items).
        self.forking = threading.Lock()
        self.aside_after_s: float | None = ASIDE_AFTER_S
        # A public share's (the host's system manager's): other users' jobs may read it, each
        # as a guest (GUESTS below); else a consumer of another user is refused.
        self.public = False
        self._guests: dict[socket.socket, int] = {}  # another user's connections: their uid
        self._guest_since: dict[socket.socket, float] = {}  # and when, until they attach
        self._tended_at = 0.0
        self._stats = stats
        self._on_error = on_error
        self._free_indices = list(range(MAX_CONSUMERS - 1, -1, -1))
        self._next_cid = 1
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._closing = False
        self._thread: threading.Thread | None = None

    def links(self) -> list[Link]:
        held = self.start_hold is not None and self.start_hold.first is not None
        start = [self.start_hold.link] if held and self.start_hold is not None else []
        readers = [c.link for c in self.consumers.values() if not c.aside]
        return readers + self.groups.holds() + start

    def expect(self, consumers: int, within_s: float) -> None:
        """Keep the stream's start for ``consumers`` that will attach soon (``within_s`` of
        the first at most): :class:`~tandem.share._groups.StartHold`."""
        with self.cond:
            if consumers > 1 and not self.ever_attached:
                self.start_hold = StartHold(consumers, within_s)

    def _end_start_hold(self) -> None:
        """Let the stream's start go once its consumers came or its time is up (lock held)."""
        if self.start_hold is not None and self.start_hold.over(time.monotonic()):
            self.start_hold = None
            self.cond.notify_all()  # the produce loop may have waited for a slot it held

    # --------------------------------------------------------------------- lifecycle
    def start(self, listener: socket.socket) -> None:
        self._listener = listener
        self._thread = threading.Thread(target=self._loop, name=f"tandem-producer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and detach every consumer (lock not held)."""
        with self.cond:
            self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self.cond:
            for c in list(self.consumers.values()):
                self.detach(c, "producer closed")
        self.close()

    def close(self) -> None:
        """Free the table, the wake-up pair and the listener (idempotent)."""
        if self._wake_r.fileno() == -1:
            return
        if self._listener is not None:
            self._listener.close()
        self.table.close()
        self._wake_r.close()
        self._wake_w.close()

    # --------------------------------------------------------------------- the thread
    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        assert self._listener is not None
        sel.register(self._listener, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        conns: dict[socket.socket, Attached | None] = {}
        try:
            while not self._closing:
                if self.start_hold is not None:
                    with self.cond:
                        self._end_start_hold()
                if time.monotonic() - self._tended_at >= TICK:
                    with self.cond:
                        self._tend_idle(time.monotonic())
                    for conn, since in list(self._guest_since.items()):
                        if time.monotonic() - since > GUEST_HELLO_S:  # a place held, not taken
                            self._let_go(sel, conns, conn, f"no Hello within {GUEST_HELLO_S:g} s")
                for key, _ in sel.select(timeout=TICK):
                    if key.data == "wake":
                        continue
                    if key.data is None:
                        self._accept(sel, conns)
                    else:
                        self._on_message(sel, conns, key.fileobj)  # type: ignore[arg-type]
        except Exception:  # the control thread must never die silently
            log.exception("producer %r: control thread failed", self.name)
            self._on_error("control thread failed")
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
        guest = _guest(conn)
        conn.setblocking(True)  # protocol.send/recv never block without a timeout
        if guest is not None:
            refused = self._guest_refused(guest)
            if refused:
                _send_quietly(conn, protocol.Refused(refused))
                conn.close()
                return
            self._guests[conn] = guest
            self._guest_since[conn] = time.monotonic()
        conns[conn] = None
        sel.register(conn, selectors.EVENT_READ, "conn")

    def _on_message(self, sel: selectors.BaseSelector, conns: dict, conn: socket.socket) -> None:
        consumer = conns.get(conn)
        try:
            message, fds = protocol.recv(conn)
            close_fds(fds)
        except (EOFError, OSError, protocol.ProtocolError) as exc:
            sel.unregister(conn)
            conns.pop(conn, None)
            self._guests.pop(conn, None)
            self._guest_since.pop(conn, None)
            if consumer is not None:
                with self.cond:
                    self.detach(consumer, f"disconnected ({exc})")
            conn.close()
            return
        guest = self._guests.get(conn)
        if guest is not None and (
            not isinstance(message, GUEST_MESSAGES) or (isinstance(message, protocol.Hello) and consumer)
        ):
            # Another user's: only to read, as one consumer a connection (their digest of items
            # would run our dataset's code at their asking; our consumers' figures are ours).
            # Told once, and let go: a guest that would not read our answers holds us up never.
            self._let_go(sel, conns, conn, f"{type(message).__name__} is not another user's to ask")
            return
        if isinstance(message, protocol.Items):
            if consumer is not None:  # its reader's check: on a connection of its own
                _send_quietly(conn, protocol.Refused("Items are asked on a connection of their own"))
                return
            # Loading items takes a while: answered beside this thread, on a connection of
            # its own (a reader's check as it attaches; not a consumer's).
            sel.unregister(conn)
            conns.pop(conn, None)
            threading.Thread(target=self._answer_items, args=(conn, message), daemon=True).start()
            return
        try:
            with self.cond:
                self._answer(conns, conn, consumer, guest, message)
        except Exception as exc:  # noqa: BLE001 - one peer's message that makes no sense: its loss
            log.warning("producer %r: a consumer's %s let go: %s", self.name, type(message).__name__, exc)
            self._let_go(sel, conns, conn, f"{type(message).__name__} not understood")

    def _answer(
        self,
        conns: dict,
        conn: socket.socket,
        consumer: Attached | None,
        guest: int | None,
        message: object,
    ) -> None:
        """Answer ``message`` of ``conn``'s peer (``consumer``, once attached; lock held)."""
        if isinstance(message, protocol.Next) and consumer is not None:
            self._released(consumer, message.release)
            consumer.link.reported(message.stall_s, message.samples, message.batches)
            self.reply(consumer)
        elif isinstance(message, protocol.Release) and consumer is not None:
            self._released(consumer, message.seqs)
        elif isinstance(message, protocol.Hello) and consumer is None:
            conns[conn] = self._attach(conn, message, guest)
            if conns[conn] is not None:
                self._guest_since.pop(conn, None)
        elif isinstance(message, protocol.Stats):
            _send_quietly(conn, self._stats())
        elif isinstance(message, protocol.Bye) and consumer is not None:
            self.detach(consumer, "said goodbye")
            conns[conn] = None
        else:
            _send_quietly(conn, protocol.Refused(f"unexpected {type(message).__name__}"))

    def _let_go(self, sel: selectors.BaseSelector, conns: dict, conn: socket.socket, why: str) -> None:
        """Refuse ``conn``'s peer (a short wait at most: it may not read) and close it."""
        consumer = conns.pop(conn, None)
        self._guests.pop(conn, None)
        self._guest_since.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        if consumer is not None:
            with self.cond:
                self.detach(consumer, why)
        with contextlib.suppress(OSError):
            protocol.send(conn, protocol.Refused(why), timeout=GUEST_SEND_S)
        conn.close()

    def _answer_items(self, conn: socket.socket, message: protocol.Items) -> None:
        try:
            digests: tuple[str, ...] | None = None
            indices = list(message.indices)
            if (
                self.item_digests is not None
                and len(indices) <= protocol.MAX_ITEMS_ASKED
                and all(type(i) is int and 0 <= i < (self.window.samples_per_epoch or 0) for i in indices)
            ):
                try:
                    with self.forking:
                        digests = tuple(self.item_digests(indices))
                except Exception as exc:  # noqa: BLE001 - the user's dataset: say nothing, log why
                    log.warning(
                        "producer %r: items %s not digested (%s: %s)",
                        self.name,
                        indices,
                        type(exc).__name__,
                        exc,
                    )
            _send_quietly(conn, protocol.ItemsReply(digests))
        finally:
            conn.close()

    def _released(self, c: Attached, seqs: tuple[int, ...]) -> None:
        if seqs:
            c.link.released(seqs)
            if c.retained:
                self.window.unretain([c.retained.pop(s) for s in seqs if s in c.retained])
            self.cond.notify_all()

    # ------------------------------------------------------- readers set aside (lock held)
    def _tend_idle(self, now: float) -> None:
        """Set aside each consumer that has taken nothing for ``aside_after_s`` while it
        keeps the window's oldest entry and another consumer waits; give back the slots a
        set-aside table consumer has released."""
        self._tended_at = now
        for c in list(self.consumers.values()):
            progress = (c.link.cursor(), c.link.released_below())
            if c.aside:
                if c.retained and c.link.transport == "table":
                    below = progress[1]
                    self.window.unretain([c.retained.pop(s) for s in list(c.retained) if s < below])
                continue
            # Idle time counts only while it has something to take or give back: a reader
            # that released every published entry (before the stream's start, say, while
            # its job still builds) holds nobody back however long it has been attached.
            if progress != c.seen or progress[1] >= self.window.next_seq:
                c.seen, c.seen_at = progress, now
            elif (
                self.aside_after_s is not None
                and now - c.seen_at >= self.aside_after_s
                and not c.done
                and self.window.holds_back(c.link)
                and any(o.waiting and not o.aside for o in self.consumers.values() if o is not c)
            ):
                self.set_aside(c, now - c.seen_at)

    def set_aside(self, c: Attached, idle_s: float) -> None:
        """The others go on without ``c``: it leaves the pacing, the slots it may still be
        reading are kept from reuse (new ones are numbered in their place), and it takes no
        entry more (its table flag; over the socket its next request is answered so)."""
        if c.link.transport == "table":
            self.table.set_aside(c.table_index, True)  # before its holds are read (see _table)
        c.retained = {
            seq: e.slot for seq, e in self.window.entries.items() if e.slot is not None and c.link.holds(seq)
        }
        self.window.retain(c.retained.values())
        c.aside = True
        log.warning(
            "producer %r: consumer %d (pid %d) took no batch for %.0f s while others waited: set "
            "aside, the others go on (it continues its epoch on a new consumer when it is back)",
            self.name,
            c.cid,
            c.pid,
            idle_s,
        )
        if c.waiting:
            self.reply(c)
        self.cond.notify_all()

    # ------------------------------------------------------------- replies (lock held)
    def reply(self, c: Attached) -> None:
        """Send ``c`` the entry at its cursor, or mark it waiting for one."""
        if c.aside:
            c.waiting = False
            if not c.done:
                c.done = True
                _send_quietly(c.sock, protocol.SetAside(self.aside_after_s or 0.0))
            return
        entry = self.window.entries.get(self.window.next_live(c.link.cursor()))
        if entry is None:
            c.waiting = True
            return
        c.waiting = False
        fds: tuple[int, ...] = ()
        message = entry.message
        if entry.kind == EntryKind.BATCH:
            seg = message.segment  # type: ignore[attr-defined]
            attach = seg.segment_id not in c.segments
            if attach:
                # A guest's a read-only descriptor: it may map our batches, never change them.
                fds = (self.slab.fd(seg.slot) if c.guest is None else self.slab.read_only_fd(seg.slot),)
            missed_batches, missed_samples = c.missed_pending
            if attach or missed_batches:
                message = message._replace(  # type: ignore[attr-defined]
                    missed_batches=missed_batches, missed_samples=missed_samples, fd_attached=attach
                )
            c.missed_batches += missed_batches
            c.missed_pending = (0, 0)
        try:
            protocol.send(c.sock, message, fds, timeout=2.0 if c.guest is None else GUEST_SEND_S)
        except OSError as exc:  # a timeout too
            self.detach(c, f"send failed: {exc}")
            return
        finally:
            if c.guest is not None:
                close_fds(list(fds))
        if entry.kind == EntryKind.BATCH:
            c.segments.add(message.segment.segment_id)  # type: ignore[attr-defined]
            end = (entry.epoch, entry.offset + entry.count)
        elif entry.kind == EntryKind.EPOCH_END:
            end = (entry.epoch + 1, 0)
        else:
            c.done = True
            end = (entry.epoch, entry.offset)
        c.link.sent(entry.seq, entry.kind, end)

    def published(self, entry: Entry) -> None:
        """``entry`` is in the window now: announce it and answer the consumers waiting."""
        if entry.kind in (EntryKind.BATCH, EntryKind.EPOCH_END):
            self.table.announce(
                entry.seq, _table.announcement(entry.kind, entry.epoch, entry.offset, entry.message)
            )
        now = time.monotonic()
        for c in list(self.consumers.values()):
            c.progress.append((now, c.link.progress().batches))
            if c.waiting:
                self.reply(c)
        self.cond.notify_all()

    def missed(self, seq: int, batches: int, samples: int) -> None:
        """Entry ``seq`` was evicted under "skip": consumers that had not taken it missed it."""
        for c in self.consumers.values():
            if c.link.cursor() <= seq:
                mb, ms = c.missed_pending
                c.missed_pending = (mb + batches, ms + samples)

    def drain(self, timeout: float | None) -> None:
        """Wait until every consumer has taken all published data (or left); then send the
        end to those that have not asked for it (lock not held)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        warned_at = time.monotonic()
        end = self.window.end_seq or 0
        with self.cond:
            while any(c.link.cursor() < end and not c.done and not c.aside for c in self.consumers.values()):
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    log.warning(
                        "producer %r: leaving before %s took all published batches",
                        self.name,
                        self.laggards(),
                    )
                    break
                if now - warned_at > WARN_BLOCKED_S:
                    warned_at = now
                    log.warning("producer %r: draining, waiting for %s", self.name, self.laggards())
                self.cond.wait(TICK)
            self.push_final()

    def await_released(self, timeout: float) -> None:
        """Wait until every consumer has handed back every batch, or left (lock not held).

        A CUDA slab's memory must not go while a consumer's kernels may still read it: a
        consumer hands a slot back only once its GPU is done with it (or when it closes)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while any(c.link.released_below() < c.link.cursor() for c in self.consumers.values()):
                if time.monotonic() >= deadline:
                    log.warning(
                        "producer %r: freeing GPU memory after %g s although %s still hold batches",
                        self.name,
                        timeout,
                        ", ".join(f"consumer {c.cid} (pid {c.pid})" for c in self.consumers.values()),
                    )
                    return
                self.cond.wait(TICK)

    def laggards(self) -> str:
        """The consumers that hold the oldest entry back, for "waiting for ..." messages."""
        consumers = self.consumers.values()
        slow = [f"consumer {c.cid} (pid {c.pid})" for c in consumers if self.window.holds_back(c.link)]
        if self.start_hold is not None and self.start_hold.first is not None:
            slow.append(self.start_hold.waiting())
        return ", ".join(slow) or "a consumer to attach"

    def push_final(self) -> None:
        """Send the end entry to consumers that have not asked for it yet (we are leaving)."""
        if self.window.end_seq is None:
            return
        entry = self.window.entries.get(self.window.end_seq)
        for c in list(self.consumers.values()):
            if not c.done and not c.aside and entry is not None:
                _send_quietly(c.sock, entry.message)
                c.done = True

    # --------------------------------------------------------- attach and detach (lock held)
    def _attach(
        self, conn: socket.socket, hello: protocol.Hello, guest: int | None = None
    ) -> Attached | None:
        if hello.version != protocol.PROTOCOL_VERSION:
            _send_quietly(
                conn,
                protocol.Refused(
                    f"protocol version {hello.version} is not supported by this producer "
                    f"(version {protocol.PROTOCOL_VERSION}); install the same tandem version"
                ),
            )
            return None
        join = self.window.join_point()
        if join is None:
            _send_quietly(conn, protocol.Refused(self._why_no_join()))
            return None
        if not self._free_indices:
            _send_quietly(conn, protocol.Refused(f"producer {self.name!r} has {MAX_CONSUMERS} consumers"))
            return None
        if hello.world_size > 1:
            if guest is not None:  # a group's hold waits for every rank: one that never comes stalls us
                _send_quietly(
                    conn,
                    protocol.Refused("another user's distributed job reads a public share rank by rank only"),
                )
                return None
            join = self.groups.join(hello.group, hello.rank, hello.world_size, join)
        cursor, start = join
        index = self._free_indices.pop()
        self.table.reset_consumer(index, cursor)
        # A guest reads over the socket only: the table is writable by every consumer mapping it.
        use_table = self.window.policy == "wait" and hello.table and _table.supported() and guest is None
        link: Link = TableLink(self.table, index) if use_table else SocketLink(cursor, start)
        c = Attached(
            cid=self._next_cid,
            sock=conn,
            pid=hello.pid,
            batch_size=hello.batch_size,
            device=hello.device,
            cut=start[1] if start[0] == self.window.epoch else 0,
            link=link,
            table_index=index,
            guest=guest,
        )
        self._next_cid += 1
        welcome = protocol.Welcome(
            version=protocol.PROTOCOL_VERSION,
            name=self.name,
            pid=os.getpid(),
            policy=self.window.policy,
            window=self.window.size,
            start_epoch=start[0],
            start_offset=start[1],
            samples_per_epoch=self.window.samples_per_epoch,
            batch_size=self.window.batch_size,
            consumer_id=c.cid,
            transport=link.transport,
            table_index=index,
            slab=self.slab.kind,
            slab_device=getattr(self.slab, "uuid", ""),
            dataset_id=self.dataset_id,
        )
        assert self.table.fd is not None
        try:
            protocol.send(conn, welcome, (self.table.fd,) if use_table else ())
        except OSError:
            self._free_indices.append(index)
            return None
        self.consumers[c.cid] = c
        self.ever_attached = True
        if self.start_hold is not None:
            self.start_hold.attach(time.monotonic())
            self._end_start_hold()
        log.info("consumer %d (pid %d) attached at %s over the %s", c.cid, c.pid, start, link.transport)
        self.cond.notify_all()
        return c

    def _guest_refused(self, guest: int | None) -> str:
        """Why another user's consumer may not attach ("": it may, or it is no guest)."""
        if guest is None:
            return ""
        if not self.public:
            return f"share {self.name!r} is another user's, not public"
        if self.slab.kind != "host":
            return (
                f"share {self.name!r} keeps its batches on a GPU: other users read a public share "
                "from host memory"
            )
        # Another user's connections (attached or not) are counted: a guest that opens them by
        # the thousand takes no descriptor, nor place, from the definer's jobs.
        if sum(g == guest for g in self._guests.values()) >= GUESTS:
            return f"share {self.name!r} serves at most {GUESTS} connections of each other user at once"
        if len(self._guests) >= ALL_GUESTS:
            return f"share {self.name!r} serves at most {ALL_GUESTS} connections of other users at once"
        return ""

    def _why_no_join(self) -> str:
        """Why a consumer cannot join: the producer's failure (a full /dev/shm, say) or its
        end, in its own words."""
        seq = self.window.end_seq
        last = self.window.entries.get(seq) if seq is not None else None
        if last is not None and isinstance(last.message, protocol.Failed):
            return f"producer {self.name!r} failed: {last.message.message}"
        if last is not None and isinstance(last.message, protocol.End):
            return f"producer {self.name!r} has ended ({last.message.reason}): no full epoch left to serve"
        return f"producer {self.name!r} is finishing and has no full epoch left to serve"

    def detach(self, c: Attached, why: str) -> None:
        if self.consumers.pop(c.cid, None) is None:
            return
        self._free_indices.append(c.table_index)
        if c.retained:
            self.window.unretain(c.retained.values())
            c.retained = {}
        try:
            c.sock.shutdown(socket.SHUT_RDWR)  # a detached consumer cannot go on talking
        except OSError:
            pass
        log.info("consumer %d (pid %d) detached: %s", c.cid, c.pid, why)
        self.cond.notify_all()

    # ----------------------------------------------------------------- stats (lock held)
    def consumer_stats(self, now: float) -> tuple[protocol.ConsumerStats, ...]:
        return tuple(self._consumer_stats(c, now) for c in self.consumers.values())

    def _consumer_stats(self, c: Attached, now: float) -> protocol.ConsumerStats:
        p = c.link.progress()
        return protocol.ConsumerStats(
            consumer_id=c.cid,
            pid=c.pid,
            batch_size=c.batch_size,
            device=c.device,
            transport=c.link.transport,
            epoch=p.epoch,
            offset=p.offset,
            lag=max(0, self.window.next_seq - p.taken),
            holds=p.taken - p.released,
            batches=p.batches,
            batches_per_s=rate(c.progress),
            samples=p.samples,
            stall_s=p.stall_s,
            missed_batches=c.missed_batches,
            attached_s=now - c.attached_at,
        )


def _guest(conn: socket.socket) -> int | None:
    """The uid of the user at the other end where it is another user (None: this one's)."""
    try:
        uid = peer_uid(conn)
    except OSError:
        return -1  # not known: a stranger
    return None if uid == os.getuid() else uid


def rate(progress: collections.deque) -> float:
    """Per second, from (time, cumulative count) pairs."""
    if len(progress) < 2:
        return 0.0
    (t0, n0), (t1, n1) = progress[0], progress[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def _send_quietly(conn: socket.socket, message: object) -> None:
    try:
        protocol.send(conn, message)
    except OSError:
        pass
