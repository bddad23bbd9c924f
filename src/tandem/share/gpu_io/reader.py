"""The reader: a file's bytes into device memory along the path chosen (guarded: CPU-only safe).

:class:`GpuFileReader` fetches byte ranges of files, or whole files (encoded JPEGs, say),
into ``uint8`` tensors on one device, along one of three paths chosen at construction; its
``backend`` attribute names the path and why it was chosen:

``cufile``  NVIDIA cuFile (GPUDirect Storage), called through ctypes on ``libcufile`` (or
            through ``cuda.bindings.cufile`` where only that is found). Where the nvidia-fs
            kernel driver is loaded, storage DMAs into GPU memory; where it is not, cuFile
            runs in its compatibility mode (POSIX reads into its own pinned bounce buffers,
            then a copy to the GPU), which is the same data path as ``pinned`` run by the
            library.
``pinned``  ``pread`` into a per-thread pinned host buffer, then a non-blocking copy to the
            device on a per-thread stream (two halves of the buffer alternate, so a large
            read overlaps its reads from storage with its copies).
``cpu``     device ``"cpu"``: ``pread`` straight into host tensors; no CUDA needed.

``backend="auto"`` takes ``cufile`` where the library loads and its driver opens, ``pinned``
otherwise on a GPU, and ``cpu`` on device ``"cpu"``. A file cuFile then refuses to register
(as it does on a disk udev has no data about, in VMs and containers) is read through pinned
buffers instead, and ``cufile_refused`` says why; ``backend="cufile"`` raises there.
``read_many`` and ``read_files`` run their reads on ``threads`` threads (the reads release
the GIL), in order of the requests.

A returned device tensor is complete when the call returns. It was allocated on the
reader's side stream and is marked as used on the stream that was current in the calling
thread (``record_stream``), so it may be used and freed there like one of the caller's own.

``direct=True`` opens files with ``O_DIRECT``: reads bypass the page cache (the pinned and
cpu paths then read whole aligned 4 KiB blocks around the range asked for). cuFile opens
with ``O_DIRECT`` itself when nvidia-fs is loaded, as GPUDirect Storage needs it.

cuFile must not be used in a child forked after the library was opened in the parent
(NVIDIA's rule): make a reader in each process, after any ``fork``.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from tandem.share._cuda import check_device as _check_device
from tandem.share.gpu_io._cufile import (
    _O_CLOEXEC,
    _O_DIRECT,
    ALIGN,
    BACKENDS,
    DEFAULT_BUFFER_BYTES,
    MAX_OPEN_FILES,
    CuFileDriver,
    GpuIOError,
    PathLike,
    ReadPastEnd,
)

# ---------------------------------------------------------------------------------------
# Host-side helpers
# ---------------------------------------------------------------------------------------


def aligned_host_buffer(nbytes: int, pin: bool = False) -> torch.Tensor:
    """A ``uint8`` host tensor of ``nbytes`` whose address is a multiple of 4096 (for
    ``O_DIRECT``); pinned (page-locked, for fast copies to a GPU) if ``pin``."""
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    start = (-raw.data_ptr()) % ALIGN
    return raw[start : start + nbytes]


def open_for_read(path: PathLike, direct: bool = False) -> tuple[int, bool]:
    """``(fd, is_direct)``: the file opened read-only, with ``O_DIRECT`` if asked for and the
    file system accepts it (tmpfs refuses it: then a plain descriptor)."""
    flags = os.O_RDONLY | _O_CLOEXEC
    if direct and _O_DIRECT:
        try:
            return os.open(path, flags | _O_DIRECT), True
        except OSError as exc:
            if exc.errno != 22:  # EINVAL: this file system has no O_DIRECT
                raise
    return os.open(path, flags), False


def pread_into(fd: int, out: torch.Tensor, offset: int, direct: bool = False) -> int:
    """Fill the contiguous host tensor ``out`` from ``fd`` at ``offset``; returns the bytes
    read, fewer than ``out.numel()`` only at the end of the file. ``direct`` (an O_DIRECT
    descriptor): a short read is the end of the file; reading on from an unaligned offset
    would fail with EINVAL."""
    view = memoryview(out.numpy()).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ from 3.12
    total = 0
    while total < len(view):
        n = os.preadv(fd, [view[total:]], offset + total)
        total += n
        if n == 0 or direct:
            break
    return total


# ---------------------------------------------------------------------------------------
# Backend choice
# ---------------------------------------------------------------------------------------


def check_device(device: str | torch.device) -> torch.device:
    """The device, with an index for CUDA; the consumer's check (one wording everywhere)."""
    return _check_device(str(device))


def choose_backend(
    requested: str, device: torch.device, probe: Callable[[], CuFileDriver] = CuFileDriver.get
) -> tuple[str, str, CuFileDriver | None]:
    """``(kind, description, driver)``: which path a reader on ``device`` takes when
    ``requested`` is asked for. ``probe`` returns the cuFile driver or raises
    :class:`GpuIOError` with the reason it is unavailable."""
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    if device.type == "cpu":
        if requested == "cufile":
            raise GpuIOError("backend='cufile' reads into GPU memory, but the device is 'cpu'")
        return "cpu", "cpu (pread into host memory: device is cpu)", None
    if requested == "pinned":
        return "pinned", "pinned (asked for)", None
    try:
        driver = probe()
    except GpuIOError as exc:
        if requested == "cufile":
            raise GpuIOError(f"backend='cufile' asked for, but cuFile is unavailable: {exc}") from None
        return "pinned", f"pinned (cuFile unavailable: {exc})", None
    return "cufile", f"cufile ({driver.mode})", driver


# ---------------------------------------------------------------------------------------
# The reader
# ---------------------------------------------------------------------------------------


class _OpenFile:
    __slots__ = ("path", "fd", "size", "direct", "handle", "refs")

    def __init__(self, path: str, fd: int, size: int, direct: bool):
        self.path, self.fd, self.size, self.direct = path, fd, size, direct
        self.handle: int | None = None  # cuFile handle, registered on first cuFile read
        self.refs = 0


class _ThreadState:
    """One thread's side stream, and its host buffer halves (pinned on a GPU) with their
    copy-done events, made on first use."""

    def __init__(self, reader: GpuFileReader):
        self.cuda = reader.device.type == "cuda"
        self.stream: Any = None
        if self.cuda:
            self.stream = torch.cuda.Stream(reader.device)
            self.stream.query()  # a runtime call: binds the device's context to this thread (cuFile needs it)
        self.buffer_bytes = reader.buffer_bytes
        self._halves: list[torch.Tensor] = []
        self.events: list[Any] = []

    @property
    def halves(self) -> list[torch.Tensor]:
        if not self._halves:
            half = self.buffer_bytes // 2
            buf = aligned_host_buffer(2 * half, pin=self.cuda)
            self._halves = [buf[:half], buf[half:]]
            if self.cuda:
                self.events = [torch.cuda.Event(), torch.cuda.Event()]
        return self._halves


class GpuFileReader:
    """Reads byte ranges of files into ``uint8`` tensors on ``device``.

    ``backend``: ``"auto"`` (cuFile where usable, else pinned; cpu on device ``"cpu"``),
    ``"cufile"`` or ``"pinned"``; after construction ``self.backend`` says which path is
    taken and why, and ``self.kind`` is ``"cufile"``, ``"pinned"`` or ``"cpu"``.
    ``threads``: worker threads of ``read_many``/``read_files``. ``buffer_bytes``: each
    thread's pinned host buffer (pinned path; split in two halves that alternate).
    ``direct``: open files with ``O_DIRECT`` (bypass the page cache)."""

    def __init__(
        self,
        device: str | torch.device = "cuda:0",
        backend: str = "auto",
        threads: int = 4,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        direct: bool = False,
        max_open_files: int = MAX_OPEN_FILES,
    ):
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        if buffer_bytes < 4 * ALIGN or buffer_bytes % (2 * ALIGN):
            raise ValueError(f"buffer_bytes must be a multiple of {2 * ALIGN} and at least {4 * ALIGN}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.device = check_device(device)
        self.kind, self.backend, self._driver = choose_backend(backend, self.device)
        self._fallback = backend == "auto"  # files cuFile refuses then go through pinned buffers
        self.cufile_refused: str | None = None  # the first such refusal, if any
        self.threads = threads
        self.buffer_bytes = buffer_bytes
        self.direct = direct
        self.max_open_files = max_open_files
        self._files: OrderedDict[str, _OpenFile] = OrderedDict()
        self._files_lock = threading.Lock()
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"GpuFileReader(device={str(self.device)!r}, backend={self.backend!r}, threads={self.threads})"

    # -- public API -------------------------------------------------------------------

    def read(self, path: PathLike, offset: int, size: int) -> torch.Tensor:
        """``size`` bytes of ``path`` from ``offset``, as a ``uint8`` tensor on the device."""
        return self._read(path, offset, size, self._caller_stream())

    def read_many(self, requests: Iterable[tuple[PathLike, int, int]]) -> list[torch.Tensor]:
        """``read`` for each ``(path, offset, size)``, on the reader's threads; results in the
        order of the requests. The first failure is raised."""
        requests = list(requests)
        stream = self._caller_stream()
        if len(requests) <= 1 or self.threads == 1:
            return [self._read(p, o, s, stream) for p, o, s in requests]
        pool = self._executor()
        futures = [pool.submit(self._read, p, o, s, stream) for p, o, s in requests]
        return [f.result() for f in futures]

    def read_files(self, paths: Sequence[PathLike]) -> list[torch.Tensor]:
        """Each whole file (encoded images, say) as a ``uint8`` tensor on the device."""
        paths = list(paths)
        stream = self._caller_stream()
        if len(paths) <= 1 or self.threads == 1:
            return [self._read(p, 0, None, stream) for p in paths]
        pool = self._executor()
        futures = [pool.submit(self._read, p, 0, None, stream) for p in paths]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop the threads, deregister and close every file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._files_lock:
            for entry in self._files.values():
                self._close_entry(entry)
            self._files.clear()

    def __enter__(self) -> GpuFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------

    def _caller_stream(self) -> Any:
        if self.device.type != "cuda":
            return None
        return torch.cuda.current_stream(self.device)

    def _executor(self) -> ThreadPoolExecutor:
        if self._closed:
            raise GpuIOError("the reader is closed")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tandem-io")
        return self._pool

    def _state(self) -> _ThreadState:
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _ThreadState(self)
        return state

    def _acquire(self, path: PathLike) -> _OpenFile:
        key = os.fspath(path)
        with self._files_lock:
            if self._closed:
                raise GpuIOError("the reader is closed")
            entry = self._files.get(key)
            if entry is not None:
                self._files.move_to_end(key)
                entry.refs += 1
                return entry
        # GPUDirect Storage (not compat mode) needs O_DIRECT descriptors.
        direct = self.direct or (
            self.kind == "cufile" and self._driver is not None and not self._driver.compat
        )
        fd, is_direct = open_for_read(key, direct)  # FileNotFoundError names the path
        entry = _OpenFile(key, fd, os.fstat(fd).st_size, is_direct)
        with self._files_lock:
            existing = self._files.get(key)
            if existing is not None:  # another thread opened it meanwhile
                os.close(fd)
                entry = existing
            else:
                self._files[key] = entry
            entry.refs += 1
            self._evict()
        return entry

    def _release(self, entry: _OpenFile) -> None:
        with self._files_lock:
            entry.refs -= 1
            if entry.refs == 0 and (self._closed or self._files.get(entry.path) is not entry):
                self._close_entry(entry)  # evicted (or closed) while in use
            else:
                self._evict()

    def _evict(self) -> None:
        while len(self._files) > self.max_open_files:
            victim = next((e for e in self._files.values() if e.refs == 0), None)
            if victim is None:
                return
            del self._files[victim.path]
            self._close_entry(victim)

    def _close_entry(self, entry: _OpenFile) -> None:
        if entry.refs > 0 or entry.fd < 0:
            return
        if entry.handle and self._driver is not None:
            self._driver.api.handle_deregister(entry.handle)
            entry.handle = None
        os.close(entry.fd)
        entry.fd = -1

    def _read(self, path: PathLike, offset: int, size: int | None, caller_stream: Any) -> torch.Tensor:
        if self._closed:
            raise GpuIOError("the reader is closed")
        entry = self._acquire(path)
        try:
            if size is None:
                size = entry.size - offset
            if offset < 0 or size < 0:
                raise ValueError(f"offset and size must be non-negative, got {offset} and {size}")
            if offset + size > entry.size:
                raise ReadPastEnd(
                    f"read past the end of {entry.path}: it has {entry.size} bytes, "
                    f"bytes [{offset}, {offset + size}) were asked for"
                )
            if self.kind == "cpu":
                return self._read_cpu(entry, offset, size)
            with torch.cuda.device(self.device):
                if self.kind == "cufile" and self._cufile_handle(entry):
                    out = self._read_cufile(entry, offset, size)
                else:
                    out = self._read_pinned(entry, offset, size)
                if caller_stream is not None and caller_stream != self._state().stream:
                    out.record_stream(caller_stream)
                return out
        finally:
            self._release(entry)

    def _fill(self, entry: _OpenFile, offset: int, size: int, half: torch.Tensor) -> torch.Tensor:
        """Read ``size`` bytes at ``offset`` into the host buffer ``half``; returns the view
        of ``half`` that holds them. With O_DIRECT it reads the aligned blocks around them."""
        if entry.direct:
            start = offset - offset % ALIGN
            end = -(-(offset + size) // ALIGN) * ALIGN
            got = pread_into(entry.fd, half[: end - start], start, direct=True)
            view = half[offset - start : offset - start + size]
            if got < offset - start + size:
                raise GpuIOError(f"short read from {entry.path}: the file shrank while being read?")
            return view
        view = half[:size]
        if pread_into(entry.fd, view, offset) < size:
            raise GpuIOError(f"short read from {entry.path}: the file shrank while being read?")
        return view

    def _chunk_bytes(self, entry: _OpenFile) -> int:
        half = self.buffer_bytes // 2
        return half - ALIGN if entry.direct else half

    def _read_cpu(self, entry: _OpenFile, offset: int, size: int) -> torch.Tensor:
        out = torch.empty(size, dtype=torch.uint8)
        if not entry.direct:
            if pread_into(entry.fd, out, offset) < size:
                raise GpuIOError(f"short read from {entry.path}: the file shrank while being read?")
            return out
        state, chunk, pos = self._state(), self._chunk_bytes(entry), 0
        while pos < size:
            n = min(chunk, size - pos)
            out[pos : pos + n].copy_(self._fill(entry, offset + pos, n, state.halves[0]))
            pos += n
        return out

    def _read_pinned(self, entry: _OpenFile, offset: int, size: int) -> torch.Tensor:
        state, chunk = self._state(), self._chunk_bytes(entry)
        halves = state.halves  # made on first use, with state.events
        with torch.cuda.stream(state.stream):
            out = torch.empty(size, dtype=torch.uint8, device=self.device)
            pos, k = 0, 0
            while pos < size:
                n = min(chunk, size - pos)
                state.events[k].synchronize()  # the last copy out of this half is done
                view = self._fill(entry, offset + pos, n, halves[k])
                out[pos : pos + n].copy_(view, non_blocking=True)
                state.events[k].record(state.stream)
                pos, k = pos + n, 1 - k
        state.stream.synchronize()
        return out

    def _cufile_handle(self, entry: _OpenFile) -> int:
        """The file's cuFile handle, registered on first use; 0 where cuFile refused the
        file and ``backend="auto"`` lets it go through pinned buffers instead."""
        if entry.handle is None:
            assert self._driver is not None
            self._state()  # the device's context current in this thread
            with self._files_lock:
                if entry.handle is None:
                    try:
                        entry.handle = self._driver.api.handle_register(entry.fd)
                    except GpuIOError as exc:
                        why = f"{exc}{self._driver.register_hint()}"
                        if not self._fallback:
                            raise GpuIOError(f"cuFile could not register {entry.path}: {why}") from None
                        entry.handle = 0
                        if self.cufile_refused is None:
                            self.cufile_refused = f"{entry.path}: {why}"
                            self.backend += "; files cuFile refuses are read through pinned buffers"
        return entry.handle

    def _read_cufile(self, entry: _OpenFile, offset: int, size: int) -> torch.Tensor:
        assert self._driver is not None and entry.handle
        api, state = self._driver.api, self._state()
        with torch.cuda.stream(state.stream):
            out = torch.empty(size, dtype=torch.uint8, device=self.device)
        # The side stream has no work queued: the new block is free to be written at once.
        pos, ptr = 0, out.data_ptr()
        while pos < size:
            n = api.read(entry.handle, ptr, size - pos, offset + pos, pos)
            if n <= 0:
                why = "the file shrank while being read?" if n == 0 else f"cuFileRead returned {n}"
                raise GpuIOError(f"short read from {entry.path}: {why}")
            pos += n
        return out


os.register_at_fork(after_in_child=CuFileDriver._forget_after_fork)
