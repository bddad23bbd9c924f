"""The producer's main thread at work: epoch after epoch, each batch of the source (through
``batch_transform``, if any) written into a free slot of the slab and published as an entry
in the window.

:class:`Publisher` is a component of :class:`tandem.share.producer.Producer`, which makes
it with the window, the slab and the control server, and runs :meth:`Publisher.run` from
``serve``. It owns the loop (where epochs begin and end, and the part of one more epoch that
late joiners need), the wait for a free slot (the pacing itself is the window's), and the
entries it publishes; the control thread (:mod:`tandem.share._control`) answers the
consumers from them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

import torch

from tandem.share._control import TICK, WARN_BLOCKED_S, ControlServer
from tandem.share._order import EpochPlanner
from tandem.share._slab import Slab
from tandem.share._tree import flatten, sample_count
from tandem.share._window import Entry, Window, slots_for

log = logging.getLogger("tandem.share")

_POLL_RELEASES_S = 0.002  # table consumers release in shared memory, unannounced: poll this often


class Publisher:
    """The serving loop of a :class:`~tandem.share.producer.Producer` and the entries it
    publishes (under the producer's lock, shared with the control thread): made by the
    producer with the window, the slab and the control server it publishes to."""

    def __init__(
        self,
        name: str,
        source: Iterable[Any],
        window: Window,
        slab: Slab,
        server: ControlServer,
        cond: threading.Condition,
        *,
        transform: Callable[[Any], Any] | None,
        transform_threads: int,
        device: torch.device | None,
        window_mem: int | None,
    ):
        self.name = name
        self._source = source
        self._window = window
        self._slab = slab
        self._server = server
        self._cond = cond
        self._transform = transform
        self._transform_threads = transform_threads
        self.device = device  # the slab's GPU, if the slab is on one
        self.window_mem = window_mem  # the window's bound in bytes (None: ``window.size`` batches)
        # Where the producer owns the sample order (Producer.from_dataset): its plan of epochs.
        self.planner: EpochPlanner | None = None
        self.stop_reason: str | None = None  # why the loop is to stop: set once, by stop()
        self.published_batches = 0
        self.progress: collections.deque[tuple[float, int]] = collections.deque(maxlen=64)  # (time, batches)
        self.blocked_s = 0.0  # time spent waiting for consumers to free a slot
        self.epochs_served = 0

    def stop(self, reason: str) -> None:
        """Stop after the current batch (the first reason given stands); from any thread."""
        with self._cond:
            if self.stop_reason is None:
                self.stop_reason = reason
            self._window.open_to_joiners = False
            self._cond.notify_all()

    def run(self, epochs: int | None) -> None:
        """Serve ``epochs`` epochs (None: until stopped), then publish the stream's end."""
        epoch = 0
        while self.stop_reason is None:
            limit = None
            if epochs is not None and epoch >= epochs:
                # the part of one more epoch that late joiners need to finish their last one
                if not self._wait_first_consumer():
                    break
                with self._cond:
                    limit = max((c.cut for c in self._server.consumers.values()), default=0)
                    self._window.open_to_joiners = False
                if limit == 0:
                    break
            self._begin_epoch(epoch, limit)
            offset = 0
            completed = True
            # closed at the epoch's end (a break included): a batch_transform's threads finish
            # before the next epoch's set_epoch
            with contextlib.closing(self._transformed()) as batches:
                for batch in batches:
                    spec, leaves = flatten(batch)
                    count = self._count(spec, leaves, offset)
                    if self.planner is not None and self._slab.kind == "host":
                        # the items' dataset indices ride along, as the last tensor: what a
                        # consumer's state_dict records (see _tree's "I" node)
                        spec = ("I", spec)
                        leaves.append(torch.from_numpy(self.planner.sampler.order[offset : offset + count]))
                    slot = self._acquire_slot()
                    if slot is None:
                        completed = False
                        break
                    meta = self._slab.write(slot, spec, leaves)
                    del spec, leaves, batch
                    with self._cond:
                        self._publish_batch(epoch, offset, count, slot, meta)
                    offset += count
                    if self.stop_reason is not None or (limit is not None and offset >= limit):
                        # a stop that comes with the epoch's last batch still ends the epoch
                        known = self._window.samples_per_epoch
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
                    self._publish(self._window.epoch_end_entry(epoch, offset))
                self.epochs_served += 1
            if self.stop_reason is not None:
                break
            epoch += 1
        with self._cond:
            if self.stop_reason is not None:
                self.publish_end(self.stop_reason, finished=False)
            else:
                self.publish_end(f"served {epochs} epoch(s)", finished=True)

    def _transformed(self) -> Generator[Any, None, None]:
        """One epoch of the source, through ``batch_transform`` if any: on
        ``transform_threads`` threads, that many batches in flight, in the source's order."""
        # iter() of a DataLoader forks its workers: never while a reader's item check runs the
        # dataset's code on another thread (a lock it held would stay held in every worker).
        with self._server.forking:
            source = iter(self._source)
        if self._transform is None:
            yield from source
            return
        if self._transform_threads == 1:
            for batch in source:
                yield self._transform(batch)
            return
        pending: collections.deque[concurrent.futures.Future] = collections.deque()
        on = self.device
        init = (lambda: torch.cuda.set_device(on)) if on is not None else None
        with concurrent.futures.ThreadPoolExecutor(self._transform_threads, "tandem-transform", init) as pool:
            try:
                for batch in source:
                    pending.append(pool.submit(self._transform, batch))
                    if len(pending) >= self._transform_threads:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:  # stopped early, or a transform failed: the rest is not wanted
                for future in pending:
                    future.cancel()

    def _wait_first_consumer(self) -> bool:
        """A run shorter than the window must not end before anyone could take it."""
        with self._cond:
            while not self._server.ever_attached:
                if self.stop_reason is not None:
                    return False
                self._cond.wait(TICK)
            return True

    def _count(self, spec: tuple, leaves: list, offset: int) -> int:
        if self.planner is not None and self._window.batch_size is not None:
            return self.planner.count(self._window.batch_size, offset)
        return sample_count(spec, leaves)

    def _begin_epoch(self, epoch: int, limit: int | None) -> None:
        set_epoch = getattr(self._transform, "set_epoch", None)
        if set_epoch is not None:  # per-sample randomness that is reproducible from the seed
            set_epoch(epoch)
        with self._cond:
            self._window.epoch, self._window.offset, self._window.epoch_done = epoch, 0, False
            if self.planner is not None:
                self.planner.begin(epoch, [c.cut for c in self._server.consumers.values()], limit)

    def _acquire_slot(self) -> int | None:
        waited_from = None
        warned_at = time.monotonic()
        with self._cond:
            while self.stop_reason is None:
                links = self._server.links()
                slot, skipped = self._window.take_slot(links, self._window.size + 2 * len(links) + 1)
                if skipped is not None:
                    self._server.missed(skipped.seq, 1, skipped.count)
                if slot is not None:
                    if waited_from is not None:
                        self.blocked_s += time.monotonic() - waited_from
                    return slot
                now = time.monotonic()
                waited_from = waited_from or now
                if now - warned_at > WARN_BLOCKED_S:
                    warned_at = now
                    log.warning("producer %r: waiting for %s", self.name, self._server.laggards())
                polling = any(link.transport == "table" for link in links)
                self._cond.wait(_POLL_RELEASES_S if polling else TICK)
            return None

    # ------------------------------------------------------------------ entries (lock held)
    def _publish(self, entry: Entry) -> None:
        self._window.publish(entry)
        self._server.published(entry)

    def _publish_batch(self, epoch: int, offset: int, count: int, slot: int, meta: tuple[int, int]) -> None:
        self.published_batches += 1
        if self.window_mem is not None:  # now that a batch's bytes are known
            self._window.resize(slots_for(self.window_mem, self._slab.slot_bytes, self._window.cap))
        self.progress.append((time.monotonic(), self.published_batches))
        self._publish(self._window.batch_entry(epoch, offset, count, self._slab.segment(slot), *meta))

    def publish_end(self, reason: str, finished: bool) -> None:
        if self._window.end_seq is None:
            self._publish(self._window.end_entry(reason, finished))

    def publish_failed(self, text: str) -> None:
        if self._window.end_seq is None:
            log.error("%s", text)
            self._publish(self._window.failed_entry(text))
