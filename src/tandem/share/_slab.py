"""The host slab: producer-owned shared memory that batches are written into once.

Each slot is one anonymous ``memfd`` segment (``os.memfd_create``). The kernel frees a memfd
when its last file descriptor and last mapping are gone, so no segment can outlive the
processes using it, SIGKILL included: there is nothing in /dev/shm to leak or sweep.

A slot's layout: every tensor of the batch, contiguous, each at a 64-byte aligned offset,
then the pickled *meta* (batch spec and tensor descriptors). A slot grows by replacing its
segment with a larger one (a new ``segment_id``); a consumer drops its mapping of the old
one when it first sees the new one, and tensors it still holds keep the old memory alive.

Consumers map segments copy-on-write (``MAP_PRIVATE``) and drop their private pages when
they release a batch (``MADV_DONTNEED``): a consumer that modifies a batch in place changes
only its own view, never the producer's data or another consumer's. Consumers that copy
batches to a GPU map read-only and shared instead, so the pages can be pinned.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os
import pickle
import threading
import time
import warnings
from typing import Generic, NamedTuple, Protocol, TypeVar

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from tandem.share import protocol
from tandem.share._tree import Spec

ALIGN = 64
PAGE = mmap.PAGESIZE
MIN_SEGMENT = 1 << 20
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


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class TensorDesc(NamedTuple):
    """Where one tensor of a batch sits in its slot (a tuple: cheap to unpickle)."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def layout(spec: Spec, leaves: list[torch.Tensor]) -> tuple[list[TensorDesc], int, bytes]:
    """Where each tensor of a batch goes in a slot: descriptors, bytes they take, and the
    pickled meta that tells a consumer (the same for the host and the CUDA slab)."""
    descs = []
    offset = 0
    for t in leaves:
        descs.append(TensorDesc(offset, t.dtype, tuple(t.shape)))
        offset = _round_up(offset + t.numel() * t.element_size(), ALIGN)
    return descs, offset, pickle.dumps((spec, descs), protocol=pickle.HIGHEST_PROTOCOL)


class SlotViews:
    """A consumer's decoded meta and typed views of its mapped slots (host or CUDA memory)."""

    def __init__(self) -> None:
        # slot -> {dtype: the whole segment viewed as that dtype}; one as_strided per tensor
        self._typed: dict[int, dict[torch.dtype, torch.Tensor]] = {}
        self._meta: dict[int, tuple[bytes, tuple]] = {}  # slot -> (raw meta, decoded)

    def forget(self, slot: int) -> None:
        self._typed[slot] = {}
        self._meta.pop(slot, None)

    def _decode(self, slot: int, raw: bytes) -> tuple[Spec, list[TensorDesc]]:
        # Batches of tensors only have the same meta from one batch to the next: decode once.
        cached = self._meta.get(slot)
        if cached is not None and cached[0] == raw:
            return cached[1]
        decoded = pickle.loads(raw)
        self._meta[slot] = (raw, decoded)
        return decoded

    def views(self, slot: int, raw: bytes, u8: torch.Tensor) -> tuple[Spec, list[torch.Tensor]]:
        spec, descs = self._decode(slot, raw)
        typed = self._typed.setdefault(slot, {})
        leaves = []
        for offset, dtype, shape in descs:
            view = typed.get(dtype)
            if view is None:
                view = typed[dtype] = u8[: len(u8) // dtype.itemsize * dtype.itemsize].view(dtype)
            leaves.append(view.as_strided(shape, _contiguous_strides(shape), offset // dtype.itemsize))
        return spec, leaves

    def fresh_views(self, slot: int, raw: bytes, u8: torch.Tensor) -> tuple[Spec, list[torch.Tensor]]:
        """Like :meth:`views`, over ``u8``'s own storage: no typed view is kept."""
        spec, descs = self._decode(slot, raw)
        typed: dict[torch.dtype, torch.Tensor] = {}
        leaves = []
        for offset, dtype, shape in descs:
            view = typed.get(dtype)
            if view is None:
                view = typed[dtype] = u8[: len(u8) // dtype.itemsize * dtype.itemsize].view(dtype)
            leaves.append(view.as_strided(shape, _contiguous_strides(shape), offset // dtype.itemsize))
        return spec, leaves

    def clear(self) -> None:
        self._typed.clear()
        self._meta.clear()


class _HostSegment:
    def __init__(self, segment_id: int, slot: int, size: int, label: str):
        self.segment_id = segment_id
        self.slot = slot
        self.size = size
        self.fd = os.memfd_create(f"tandem:{label}:{segment_id}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.u8 = torch.frombuffer(self.mm, dtype=torch.uint8)

    def close(self) -> None:
        os.close(self.fd)
        # The mapping goes when the last tensor viewing it does; closing it under live views
        # would be a use-after-unmap.
        self.u8 = None  # type: ignore[assignment]
        self.mm = None  # type: ignore[assignment]

    def describe(self) -> protocol.Segment:
        return protocol.Segment(kind="host", segment_id=self.segment_id, slot=self.slot, size=self.size)


class Slab(Protocol):
    """Producer-owned memory that batches are written into once, one slot per live batch.

    The window (:mod:`tandem.share._window`) decides which slot is free; a slab only holds
    them. ``write`` allocates the slot's segment (or a larger one) as needed and says where
    the batch's meta is; ``segment`` describes a slot's segment for ``Batch`` messages, and
    ``fd`` is what travels to a consumer to map it. Two kinds: :class:`HostSlab` here, and
    the CUDA slab (:mod:`tandem.share._cuda_slab`), whose fd is a small host segment with the
    meta and the IPC handles of the slot's device memory.
    """

    kind: str

    @property
    def nbytes(self) -> int: ...

    def write(self, slot: int, spec: Spec, leaves: list[torch.Tensor]) -> tuple[int, int]: ...

    def segment(self, slot: int) -> protocol.Segment: ...

    def fd(self, slot: int) -> int: ...

    def close(self) -> None: ...


class _Described(Protocol):
    size: int

    def describe(self) -> protocol.Segment: ...


SegmentT = TypeVar("SegmentT", bound=_Described)


class SlotPool(Generic[SegmentT]):
    """Slots by number, each with its current segment (None until first written): what the
    host and the CUDA slab keep alike."""

    def __init__(self, label: str):
        self.label = label
        self._segments: list[SegmentT | None] = []
        self._next_id = 0

    @property
    def nbytes(self) -> int:
        return sum(s.size for s in self._segments if s is not None)

    def _segment(self, slot: int) -> SegmentT:
        seg = self._segments[slot]
        if seg is None:
            raise KeyError(f"slot {slot} holds no segment yet")
        return seg

    def segment(self, slot: int) -> protocol.Segment:
        return self._segment(slot).describe()

    def _current(self, slot: int) -> SegmentT | None:
        """The slot's segment, if any; any slot number may be used: the pool grows to it."""
        if slot >= len(self._segments):
            self._segments.extend([None] * (slot + 1 - len(self._segments)))
        return self._segments[slot]


LARGE_SLAB_FRACTION = 0.25  # of the machine's RAM: a slab projected past this is warned about


class HostSlab(SlotPool[_HostSegment]):
    """The producer's pool of slots in host shared memory (anonymous memfd segments)."""

    kind = "host"

    def __init__(self, label: str, window: int = 8):
        super().__init__(label)
        self.window = window
        self._warned = False

    def _check_size(self, size: int) -> None:
        """Say once when ``window`` slots of this size would take much of the RAM."""
        if self._warned:
            return
        import psutil

        total = psutil.virtual_memory().total
        projected = size * self.window
        if projected > LARGE_SLAB_FRACTION * total:
            self._warned = True
            warnings.warn(
                f"producer {self.label}: batches of {size / 2**20:.0f} MiB with window {self.window} make "
                f"a slab of about {projected / 2**30:.1f} GiB, {100 * projected / total:.0f}% of this "
                "machine's RAM; a smaller window (window=2 keeps two batches) or batch size keeps less "
                "in memory",
                RuntimeWarning,
                stacklevel=2,
            )

    def fd(self, slot: int) -> int:
        return self._segment(slot).fd

    def write(self, slot: int, spec: Spec, leaves: list[torch.Tensor]) -> tuple[int, int]:
        """Copy a flattened batch into ``slot``; returns ``(meta_offset, meta_len)``.

        Any slot number may be used; the slab grows to hold it."""
        descs, offset, meta = layout(spec, leaves)
        needed = offset + len(meta)
        seg = self._current(slot)
        if seg is None or seg.size < needed:
            if seg is not None:
                seg.close()
            size = _round_up(max(needed + needed // 4, MIN_SEGMENT), PAGE)
            self._check_size(size)
            seg = _HostSegment(self._next_id, slot, size, self.label)
            self._next_id += 1
            self._segments[slot] = seg
        for t, d in zip(leaves, descs):
            nbytes = t.numel() * t.element_size()
            if nbytes:
                dst = seg.u8[d.offset : d.offset + nbytes].view(t.dtype).view(t.shape)
                dst.copy_(t)
        seg.mm[offset:needed] = meta
        return offset, len(meta)

    def close(self) -> None:
        for seg in self._segments:
            if seg is not None:
                seg.close()
        self._segments = [None] * len(self._segments)


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

    A private (copy-on-write) map also watches the batch it opened in each slot: its tensors
    share one storage of their own, and :meth:`released` asks whether anything still refers
    to it. A batch still referenced when its slot goes back to the producer (a client that
    kept it past the consumer's contract) is copied out rather than overwritten: its pages
    are made private to this process (a write fault on each copies it), the mapping is left
    to the tensors that use it, and the slot is mapped afresh for the next batch.
    """

    def __init__(self, writable_private: bool = True):
        self._private = writable_private
        self._by_slot: dict[int, tuple[int, mmap.mmap, torch.Tensor]] = {}
        self._fds: dict[int, tuple[int, int]] = {}  # slot -> (segment id, fd): to map it again
        self._views = SlotViews()
        self._used: dict[int, int] = {}  # slot -> bytes touched by the current batch
        self._watch: dict[int, StorageWeakRef] = {}  # slot -> the storage of its open batch
        self._resetting: dict[int, int] = {}  # slot -> ticket of its pending copy-on-write reset
        self._resetter: _Resetter | None = None
        self.copied_out = 0  # bytes copied out of batches kept past their release
        self.on_map = None  # hook (e.g. pin for CUDA): called with (mmap, tensor)

    def add(self, segment: protocol.Segment, fd: int) -> None:
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
        if self._private:
            # A storage of this batch's own (half a microsecond), so that release can tell
            # whether the client still refers to it.
            u8 = torch.frombuffer(mm, dtype=torch.uint8)
            self._watch[slot] = StorageWeakRef(u8.untyped_storage())
            spec, leaves = self._views.fresh_views(slot, raw, u8)
        else:
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
        watch = self._watch.pop(slot, None)
        entry = self._by_slot.get(slot)
        if not self._private or entry is None or not used:
            return False
        length = min(_round_up(used, PAGE), entry[2].numel())
        if watch is not None and not watch.expired():
            self._copy_out(slot, length)
            return True
        if self._resetter is None:
            self._resetter = _Resetter()
        self._resetting[slot] = self._resetter.submit(entry[2], length)
        return False

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
        for slot, watch in list(self._watch.items()):
            entry = self._by_slot.get(slot)
            if entry is not None and not watch.expired():
                self._copy_out(slot, min(_round_up(self._used.get(slot, 0), PAGE), entry[2].numel()))
        self._watch.clear()
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
