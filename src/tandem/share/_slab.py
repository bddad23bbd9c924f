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

import ctypes
import fcntl
import io
import mmap
import os
import pickle
import warnings
from typing import Generic, NamedTuple, Protocol, TypeVar

import torch

from tandem.share import protocol
from tandem.share._tree import Spec

ALIGN = 64
SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
PAGE = mmap.PAGESIZE
MIN_SEGMENT = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


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


class _GuestMetaUnpickler(pickle.Unpickler):
    """A batch's meta as a reader of another user's (public) share decodes it: the structure
    of tensors, containers and plain values, and tensor dtypes; no other class (a namedtuple's
    or a dataclass's of the producer's code), so their producer can run no code as them."""

    def find_class(self, module: str, name: str) -> object:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == __name__ and name == "TensorDesc":
            return TensorDesc
        raise protocol.ProtocolError(
            f"another user's share sent a batch holding {module}.{name}: a public share's "
            "batches are tensors, plain values, and tuples, lists and dicts of them"
        )


class SlotViews:
    """A consumer's decoded meta and typed views of its mapped slots (host or CUDA memory).
    ``trusted``: the producer is this user's own; else its meta is decoded as a guest's
    (:class:`_GuestMetaUnpickler`)."""

    def __init__(self, trusted: bool = True) -> None:
        self.trusted = trusted
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
        decoded = pickle.loads(raw) if self.trusted else _GuestMetaUnpickler(io.BytesIO(raw)).load()
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

    def typed_count(self, slot: int) -> int:
        """How many typed views of ``slot`` this keeps (tensors over its storage)."""
        return len(self._typed.get(slot, ()))

    def clear(self) -> None:
        self._typed.clear()
        self._meta.clear()


class _HostSegment:
    def __init__(self, segment_id: int, slot: int, size: int, label: str):
        self.segment_id = segment_id
        self.slot = slot
        self.size = size
        self.fd = os.memfd_create(f"tandem:{label}:{segment_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        # A memfd is made 0777: whoever holds a descriptor of it (a guest of a public share,
        # sent a read-only one) could open it again for writing through /proc/self/fd.
        os.fchmod(self.fd, 0o600)
        os.ftruncate(self.fd, size)
        # Its size for good (a slot grows by a new segment): a reader's mapping never loses
        # its pages under it (SIGBUS), whatever its producer does; a guest checks (SegmentMap).
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SIZE_SEALS | fcntl.F_SEAL_SEAL)
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

    @property
    def slot_bytes(self) -> int: ...

    def write(self, slot: int, spec: Spec, leaves: list[torch.Tensor]) -> tuple[int, int]: ...

    def segment(self, slot: int) -> protocol.Segment: ...

    def fd(self, slot: int) -> int: ...

    def read_only_fd(self, slot: int) -> int: ...

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

    @property
    def slot_bytes(self) -> int:
        """The largest slot's bytes (0 before the first write): what one more slot costs."""
        return max((s.size for s in self._segments if s is not None), default=0)

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


WINDOW_MEM_SHARE = 0.1  # of the memory free at start where the slab is: a window's default bound


def window_budget(device: torch.device | None) -> int:
    """A window's default bound in bytes: :data:`WINDOW_MEM_SHARE` of the RAM available now
    (or of the free memory of ``device``, for a slab on a GPU)."""
    if device is not None:
        free, _total = torch.cuda.mem_get_info(device)
        return int(WINDOW_MEM_SHARE * free)
    import psutil

    return int(WINDOW_MEM_SHARE * psutil.virtual_memory().available)


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

    def read_only_fd(self, slot: int) -> int:
        """A new descriptor of ``slot``'s segment, open for reading only (the caller closes
        it): what another user's consumer of a public share is sent."""
        return os.open(f"/proc/self/fd/{self._segment(slot).fd}", os.O_RDONLY | os.O_CLOEXEC)

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
