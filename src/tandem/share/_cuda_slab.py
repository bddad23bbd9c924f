"""The CUDA slab: batches written once into GPU memory and shared with consumers over CUDA IPC.

``Producer(..., device="cuda:N")`` keeps one device buffer per slot on GPU N. A consumer on
that GPU gets tensors that are views of the buffer, opened once per slot through CUDA IPC:
no copy per consumer, and no host memory on the way for data decoded on the GPU.

A slot is two things: the device buffer, and a small host ``memfd`` segment (the ``fd``
that travels with the first ``Batch`` naming the slot, as for the host slab). The host
segment holds a header written once, when the slot is made (the GPU's UUID, the buffer's
IPC handle, the IPC handle of the slot's *written* event), and then each batch's meta
(structure and tensor descriptors) at ``meta_offset``. So the ``Batch`` messages and the
announcement table are the host slab's, with ``Segment.kind == "cuda"``.

Ordering, both ways by CUDA events, never by time:

* written: the producer records the slot's interprocess event after its copies into the
  slot; a consumer's current stream waits on it (on the GPU) before it reads the batch.
* read: a consumer records an event on its stream when it is done with a batch, and hands
  the slot back only once that event has completed (:mod:`tandem.share._gate`). The
  producer refills a slot only when every consumer has handed it back.

The GPU is matched by UUID, not index, so producer and consumer may see it under different
``CUDA_VISIBLE_DEVICES``. CUDA IPC is PyTorch's (``UntypedStorage._share_cuda_``). The
producer keeps every buffer it ever shared (a slot that grows retires its old one) until it
closes, and closes only once every consumer has handed back what it took, or left (with a
timeout): consumers never read freed memory while the producer lives. (PyTorch's own
per-share reference count is not relied on: one share serves every consumer.)

Views of a slot are the producer's memory itself, shared by every consumer on that GPU, so
they are not copy-on-write like the host slab's: a consumer that writes into one is warned
(the views' shared version counter moved), since other consumers may have read the change.
Nothing here runs unless a CUDA slab is asked for.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import warnings
from pathlib import Path
from typing import Any

import psutil
import torch

from tandem.share import protocol
from tandem.share._slab import ALIGN, PAGE, SlotPool, SlotViews, _HostSegment, _round_up, layout
from tandem.share._tree import Spec
from tandem.share.errors import ShareError

_HEADER_LEN = struct.Struct("<Q")
_META_ROOM = 64 << 10  # bytes for a batch's meta: the spec of a batch of tensors is small
_MIN_BUFFER = 1 << 20


def device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def local_device(uuid: str, what: str) -> torch.device:
    """This process's index of the GPU with ``uuid``, or a clear error."""
    if not torch.cuda.is_available():
        raise ShareError(
            f"{what} serves batches from GPU memory (GPU {uuid}), but CUDA is not available "
            "in this process; run the consumer where CUDA is available, or serve from host "
            "memory (a producer without device=)"
        )
    for i in range(torch.cuda.device_count()):
        if device_uuid(torch.device("cuda", i)) == uuid:
            return torch.device("cuda", i)
    raise ShareError(
        f"{what} serves batches from GPU {uuid}, which this process cannot see "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!s}); "
        "make that GPU visible to the consumer"
    )


class _CudaSegment:
    """One slot: its device buffer and its host segment (header, then meta)."""

    def __init__(
        self, segment_id: int, slot: int, size: int, meta_room: int, label: str, device: torch.device
    ):
        self.segment_id = segment_id
        self.slot = slot
        self.size = size
        with torch.cuda.device(device):
            self.buffer = torch.empty(size, dtype=torch.uint8, device=device)
            self.written = torch.cuda.Event(interprocess=True)
            header = pickle.dumps(
                {
                    "uuid": device_uuid(device),
                    "storage": self.buffer.untyped_storage()._share_cuda_(),
                    "written": self.written.ipc_handle(),
                    "size": size,
                },
                protocol=pickle.HIGHEST_PROTOCOL,
            )
        self.meta_offset = _round_up(_HEADER_LEN.size + len(header), ALIGN)
        self.meta_room = meta_room
        self.host = _HostSegment(segment_id, slot, _round_up(self.meta_offset + meta_room, PAGE), label)
        _HEADER_LEN.pack_into(self.host.mm, 0, len(header))
        self.host.mm[_HEADER_LEN.size : _HEADER_LEN.size + len(header)] = header

    def describe(self) -> protocol.Segment:
        return protocol.Segment(kind="cuda", segment_id=self.segment_id, slot=self.slot, size=self.size)

    def close(self) -> None:
        self.host.close()
        self.buffer = None  # type: ignore[assignment]


class CudaSlab(SlotPool[_CudaSegment]):
    """The producer's pool of slots in one GPU's memory."""

    kind = "cuda"

    def __init__(self, label: str, device: torch.device):
        super().__init__(label)
        self.device = device
        self.uuid = device_uuid(device)
        self._retired: list[_CudaSegment] = []  # replaced by larger ones; consumers may hold them

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(s.size for s in self._retired)

    def fd(self, slot: int) -> int:
        return self._segment(slot).host.fd

    def read_only_fd(self, slot: int) -> int:
        raise NotImplementedError("another user reads a public share from host memory only")

    def write(self, slot: int, spec: Spec, leaves: list[torch.Tensor]) -> tuple[int, int]:
        """Copy a flattened batch into ``slot`` on the GPU; returns ``(meta_offset, meta_len)``.

        The copies go on the producer's current stream (after whatever made the batch
        there, a GPU decode say), and the slot's written event is recorded after them: the
        producer's CPU does not wait for them."""
        descs, nbytes, meta = layout(spec, leaves)
        seg = self._current(slot)
        if seg is None or seg.size < nbytes or seg.meta_room < len(meta):
            if seg is not None:
                self._retired.append(seg)
            size = _round_up(max(nbytes + nbytes // 4, _MIN_BUFFER), PAGE)
            seg = _CudaSegment(
                self._next_id, slot, size, max(_META_ROOM, 2 * len(meta)), self.label, self.device
            )
            self._next_id += 1
            self._segments[slot] = seg
        with torch.cuda.device(self.device):
            for t, d in zip(leaves, descs):
                n = t.numel() * t.element_size()
                if n:
                    seg.buffer[d.offset : d.offset + n].view(t.dtype).view(t.shape).copy_(
                        t, non_blocking=True
                    )
            seg.written.record()
        seg.host.mm[seg.meta_offset : seg.meta_offset + len(meta)] = meta
        return seg.meta_offset, len(meta)

    def close(self) -> None:
        if any(s is not None for s in self._segments):
            torch.cuda.synchronize(self.device)  # nothing may still be writing a buffer we drop
        for seg in [*self._segments, *self._retired]:
            if seg is not None:
                seg.close()
        self._segments = [None] * len(self._segments)
        self._retired = []


def remove_files_of_dead_producer(pid: int, shm: str = "/dev/shm") -> list[str]:
    """Remove PyTorch's CUDA IPC reference-count files (``torch_<pid>_*``) of a producer that
    died. ``_share_cuda_`` makes one per shared buffer, and only a normal exit removes them,
    so a SIGKILLed producer would leave them behind. A live process's files are not touched
    (a zombie is dead: it runs nothing). Returns the names removed."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return []
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:
        return []  # cannot tell: leave them
    removed = []
    for path in Path(shm).glob(f"torch_{pid}_*"):
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass  # another consumer of it was first
        except OSError:
            pass  # not ours to remove (another user's): leave it
    return removed


class _Opened:
    __slots__ = ("segment_id", "mm", "u8", "written", "version")

    def __init__(self, segment_id: int, mm: mmap.mmap, u8: torch.Tensor, written: Any):
        self.segment_id = segment_id
        self.mm = mm
        self.u8 = u8
        self.written = written
        self.version = u8._version  # moves when anything writes into a view of the slot


class CudaSegmentMap:
    """A consumer's opened CUDA-slab slots: device views through IPC, meta from the host."""

    def __init__(self, device: torch.device, producer: str):
        self.device = device  # the slab's GPU, as this process numbers it
        self._producer = producer
        self._by_slot: dict[int, _Opened] = {}
        self._views = SlotViews()

    def add(self, segment: protocol.Segment, fd: int) -> None:
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            opened = self._open(segment, mm)
        except BaseException:
            mm.close()
            raise
        previous = self._by_slot.get(segment.slot)
        if previous is not None:
            previous.mm.close()  # only the meta lives there; views are of the device memory
        self._by_slot[segment.slot] = opened
        self._views.forget(segment.slot)

    def _open(self, segment: protocol.Segment, mm: mmap.mmap) -> _Opened:
        (length,) = _HEADER_LEN.unpack_from(mm, 0)
        header = pickle.loads(mm[_HEADER_LEN.size : _HEADER_LEN.size + length])
        if header["uuid"] != device_uuid(self.device):
            raise protocol.ProtocolError(
                f"segment {segment.segment_id} is on GPU {header['uuid']}, not the producer's slab GPU"
            )
        _, handle, size_bytes, offset_bytes, ref_handle, ref_offset, event_handle, sync = header["storage"]
        try:
            with torch.cuda.device(self.device):
                storage = torch.UntypedStorage._new_shared_cuda(
                    self.device.index,
                    handle,
                    size_bytes,
                    offset_bytes,
                    ref_handle,
                    ref_offset,
                    event_handle,
                    sync,
                )
                u8 = torch.empty(0, dtype=torch.uint8, device=self.device)
                u8.set_(storage, 0, (header["size"],), (1,))
                written = torch.cuda.Event.from_ipc_handle(self.device, header["written"])
        except RuntimeError as exc:
            raise ShareError(
                f"cannot open producer {self._producer!r}'s GPU memory through CUDA IPC ({exc}); "
                "CUDA IPC needs both processes on the same host and PID namespace, and does not "
                "work on WSL2; serve from host memory instead (a producer without device=)"
            ) from exc
        return _Opened(segment.segment_id, mm, u8, written)

    def has(self, segment: protocol.Segment) -> bool:
        opened = self._by_slot.get(segment.slot)
        return opened is not None and opened.segment_id == segment.segment_id

    def open(self, batch: protocol.Batch) -> tuple[Spec, list[torch.Tensor]]:
        opened = self._by_slot[batch.segment.slot]
        if opened.segment_id != batch.segment.segment_id:
            raise protocol.ProtocolError(
                f"batch {batch.seq} names segment {batch.segment.segment_id}, "
                f"but slot {batch.segment.slot} is open as segment {opened.segment_id}"
            )
        raw = opened.mm[batch.meta_offset : batch.meta_offset + batch.meta_len]
        spec, leaves = self._views.views(batch.segment.slot, raw, opened.u8)
        # Whatever this process queues on its current stream from now on sees the
        # producer's writes: a wait on the GPU, not the CPU.
        torch.cuda.current_stream(self.device).wait_event(opened.written)
        return spec, leaves

    def released(self, slot: int) -> bool:
        return False  # nothing of this consumer's to undo (see check_unmodified); never copied out

    def check_unmodified(self, slot: int, name: str) -> None:
        """Warn once per slot if this consumer wrote into the shared GPU memory."""
        opened = self._by_slot.get(slot)
        if opened is not None and opened.u8._version != opened.version:
            opened.version = opened.u8._version
            warnings.warn(
                f"a batch from producer {name!r} was modified in place; its GPU memory is shared "
                "with every consumer on that GPU (not copy-on-write), so others may have seen the "
                "change: clone a batch before writing into it",
                RuntimeWarning,
                stacklevel=4,
            )

    def finish(self) -> None:
        """Wait for this process's work on the current stream (the last step's reads)."""
        torch.cuda.current_stream(self.device).synchronize()

    def done_event(self) -> torch.cuda.Event:
        """An event after everything queued so far on the current stream (the training step
        that read the last batch): the slot goes back once it has completed."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def close(self) -> None:
        if self._by_slot:
            # Also when the consumer is dropped without close(): the slots go back when the
            # socket closes, right after this, and our kernels may still read them.
            self.finish()
        self._views.clear()
        for opened in self._by_slot.values():
            opened.mm.close()
        self._by_slot.clear()  # the storages go with the last view of them
