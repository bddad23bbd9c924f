"""A consumer's map of the producer's host slab (:mod:`tandem.share._slab`): each slot's
segment mapped once, copy-on-write, its private pages dropped when the batch goes back (on a
helper thread), and a batch still referenced then copied out instead (see
:class:`SegmentMap`)."""

from __future__ import annotations

import collections
import ctypes
import fcntl
import mmap
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Protocol

import torch

from tandem.share import protocol
from tandem.share._slab import PAGE, SIZE_SEALS, SlotViews, _round_up
from tandem.share._tree import Spec

_use_count = getattr(torch._C, "_storage_Use_Count", None)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _drop_private_pages(mapping: torch.Tensor, length: int) -> None:
    # Through ctypes, which releases the GIL: zapping tens of MB of page-table entries takes
    # about a millisecond, and it runs beside the training step, not inside next(). Holding
    # ``mapping`` (a tensor over the mmap) keeps the pages mapped until the call is done.
    if _libc.madvise(mapping.data_ptr(), length, mmap.MADV_DONTNEED) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise(MADV_DONTNEED) failed: {os.strerror(err)}")


_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault every page in for writing


def _make_private(mapping: torch.Tensor, length: int) -> None:
    """Give this process its own copy of the first ``length`` bytes of a private file
    mapping (copy-on-write, page by page), so the file's later writes no longer show."""
    if length <= 0:
        return
    if _libc.madvise(mapping.data_ptr(), length, _MADV_POPULATE_WRITE) == 0:
        return
    # Older kernels: write each page (its first byte, unchanged), which copies it.
    pages = mapping[:length:PAGE]
    pages.copy_(pages.clone())


class _Resetter:
    """One helper thread that drops private pages, in order; callers wait by ticket.

    Submitting must not wake a sleeping thread (a futex wake costs tens of microseconds on
    the hand-off path of a busy or virtualised host), so while work keeps coming the thread
    polls every few milliseconds, and only after a quiet second does it block until woken.
    A wait is almost never needed: a slot is read again only after the producer refilled it.
    """

    _POLL_S = 0.003
    _IDLE_S = 1.0

    def __init__(self) -> None:
        self._work: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._sleeping = False
        self._closed = False
        self._submitted = 0
        self._done = 0  # written by the helper thread only
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="tandem-cow-reset", daemon=True)
        self._thread.start()

    def submit(self, mapping: torch.Tensor, length: int) -> int:
        self._submitted += 1
        self._work.append((mapping, length))
        if self._sleeping:
            self._wake.set()
        return self._submitted

    def _run(self) -> None:
        idle_since = time.monotonic()
        while not self._closed:
            try:
                mapping, length = self._work.popleft()
            except IndexError:
                if time.monotonic() - idle_since < self._IDLE_S:
                    time.sleep(self._POLL_S)
                    continue
                self._sleeping = True
                if not self._work:  # re-check: a submit may have missed the flag
                    self._wake.wait(self._IDLE_S)
                self._wake.clear()
                self._sleeping = False
                continue
            try:
                _drop_private_pages(mapping, length)
            except OSError as exc:
                self._error = exc
            del mapping
            self._done += 1
            idle_since = time.monotonic()

    def wait(self, ticket: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self._done < ticket:
            if time.monotonic() > deadline:
                raise TimeoutError(f"copy-on-write reset did not finish within {timeout:g} s")
            time.sleep(0.0001)
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(5)


class Segments(Protocol):
    """A consumer's view of the producer's slab: the host :class:`SegmentMap` or the CUDA
    slab's map (:mod:`tandem.share._cuda_slab`), as ``Welcome.slab`` says."""

    def add(self, segment: protocol.Segment, fd: int) -> None: ...

    def has(self, segment: protocol.Segment) -> bool: ...

    def open(self, batch: protocol.Batch) -> tuple[Spec, list[torch.Tensor]]: ...

    def released(self, slot: int) -> bool:
        """The producer may reuse ``slot``; True when its batch was copied out first."""

    def close(self) -> None: ...


class SegmentMap:
    """A consumer's mappings of the producer's host segments, keyed by slot.

    A private (copy-on-write) map also tells whether the batch it opened in a slot is still
    referenced when the slot goes back to the producer: the slot's storage counts every
    tensor over it, so the count less this map's own views is the client's. A batch still
    referenced then (a client that
    kept it past the consumer's contract) is copied out rather than overwritten: its pages
    are made private to this process (a write fault on each copies it), the mapping is left
    to the tensors that use it, and the slot is mapped afresh for the next batch.
    """

    def __init__(self, writable_private: bool = True, trusted: bool = True):
        self._private = writable_private
        self._by_slot: dict[int, tuple[int, mmap.mmap, torch.Tensor]] = {}
        self._fds: dict[int, tuple[int, int]] = {}  # slot -> (segment id, fd): to map it again
        self._views = SlotViews(trusted)  # untrusted: another user's producer (a public share)
        self._used: dict[int, int] = {}  # slot -> bytes touched by the current batch
        self._resetting: dict[int, int] = {}  # slot -> ticket of its pending copy-on-write reset
        self._resetter: _Resetter | None = None
        self.copied_out = 0  # bytes copied out of batches kept past their release
        self.on_map: Callable[[mmap.mmap, torch.Tensor], None] | None = None  # hook (e.g. pin for CUDA)

    def add(self, segment: protocol.Segment, fd: int) -> None:
        if not self._views.trusted and not _sized_for_good(fd):
            os.close(fd)  # another user's memory that could be cut under our mapping (SIGBUS)
            raise protocol.ProtocolError(
                f"segment {segment.segment_id} of another user's producer is not sealed to its size"
            )
        self._wait_reset(segment.slot)
        old = self._fds.pop(segment.slot, None)
        if old is not None:
            os.close(old[1])
        self._fds[segment.slot] = (segment.segment_id, fd)
        self._map(segment.slot)

    def _map(self, slot: int) -> None:
        segment_id, fd = self._fds[slot]
        size = os.fstat(fd).st_size
        if self._private:
            mm = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        else:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffer warning for the shared mapping
            u8 = torch.frombuffer(mm, dtype=torch.uint8)
        if self.on_map is not None:
            self.on_map(mm, u8)
        self._by_slot[slot] = (segment_id, mm, u8)
        self._views.forget(slot)

    def has(self, segment: protocol.Segment) -> bool:
        current = self._fds.get(segment.slot)
        return current is not None and current[0] == segment.segment_id

    def open(self, batch: protocol.Batch) -> tuple[Spec, list[torch.Tensor]]:
        slot = batch.segment.slot
        self._wait_reset(slot)
        if slot not in self._by_slot and slot in self._fds:
            self._map(slot)  # its last mapping was left to a batch kept past its release
        segment_id, mm, u8 = self._by_slot[slot]
        if segment_id != batch.segment.segment_id:
            raise protocol.ProtocolError(
                f"batch {batch.seq} names segment {batch.segment.segment_id}, "
                f"but slot {slot} is mapped to segment {segment_id}"
            )
        raw = mm[batch.meta_offset : batch.meta_offset + batch.meta_len]
        spec, leaves = self._views.views(slot, raw, u8)
        self._used[slot] = batch.meta_offset + batch.meta_len
        return spec, leaves

    def released(self, slot: int) -> bool:
        """The producer may reuse ``slot`` now. Returns True when its batch was still
        referenced and was copied out first (see the class docstring).

        Otherwise this consumer's private changes to the slot are dropped before it reads
        the slot again: on a helper thread; the next ``open`` of the slot waits for it.
        """
        used = self._used.pop(slot, 0)
        entry = self._by_slot.get(slot)
        if not self._private or entry is None or not used:
            return False
        length = min(_round_up(used, PAGE), entry[2].numel())
        if self._referenced(slot):
            self._copy_out(slot, length)
            return True
        if self._resetter is None:
            self._resetter = _Resetter()
        self._resetting[slot] = self._resetter.submit(entry[2], length)
        return False

    def _referenced(self, slot: int) -> bool:
        """Whether a tensor other than this map's own uses the slot's memory: the storage's
        reference count (every tensor over it, and the storage object asked for here) less
        this map's whole-slot tensor and typed views. A tenth of a microsecond."""
        if _use_count is None:
            return False  # a torch without the count: nothing to tell by (not seen in 2.2-2.13)
        storage = self._by_slot[slot][2].untyped_storage()
        return _use_count(storage._cdata) > 2 + self._views.typed_count(slot)

    def _copy_out(self, slot: int, length: int) -> None:
        """Make the slot's first ``length`` bytes private to this process and leave the
        mapping to the tensors that use it."""
        _segment_id, _mm, u8 = self._by_slot.pop(slot)
        _make_private(u8, length)
        self._views.forget(slot)
        self.copied_out += length

    def _wait_reset(self, slot: int) -> None:
        ticket = self._resetting.pop(slot, None)
        if ticket is not None and self._resetter is not None:
            self._resetter.wait(ticket)

    def close(self) -> None:
        # Batches the client still refers to keep their data when the producer reuses
        # their slots after this consumer has gone.
        for slot, used in list(self._used.items()):
            entry = self._by_slot.get(slot)
            if self._private and entry is not None and used and self._referenced(slot):
                self._copy_out(slot, min(_round_up(used, PAGE), entry[2].numel()))
        self._views.clear()
        for slot in list(self._resetting):
            self._wait_reset(slot)
        if self._resetter is not None:
            self._resetter.close()
            self._resetter = None
        self._by_slot.clear()
        self._used.clear()
        for _segment_id, fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _sized_for_good(fd: int) -> bool:
    """Whether memory file ``fd`` is sealed against shrinking and growing (:class:`_HostSegment`)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SIZE_SEALS == SIZE_SEALS
    except OSError:  # not a memfd
        return False
