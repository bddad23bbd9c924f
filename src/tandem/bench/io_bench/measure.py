"""The io benchmark's measurement: timed random reads on threads, per path and block size."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tandem.bench.io_bench.records import GPU_PATH, Cell
from tandem.share import gpu_io

# ---------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------


_SETUP_TIMEOUT_S = 60.0  # a worker's setup (CUDA context, buffers, cuFile registration)


class _Run:
    """``threads`` workers reading random blocks until a shared deadline; the clock and
    the CPU clock start when every worker has set up (barrier) and stop when all joined."""

    def __init__(self, threads: int, seconds: float):
        self.seconds = seconds
        self.deadline = 0.0
        self.t0 = self.cpu0 = 0.0
        self.barrier = threading.Barrier(threads + 1, action=self._start)
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        self.ops = 0
        self.bytes = 0
        self.latencies: list[float] = []
        self.registered = 0

    def _start(self) -> None:
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + self.seconds

    def add(self, ops: int, nbytes: int, latencies: list[float]) -> None:
        with self.lock:
            self.ops += ops
            self.bytes += nbytes
            self.latencies += latencies


def _offsets(file_bytes: int, block: int) -> int:
    return (file_bytes - block) // gpu_io.ALIGN + 1


class DriverCopy:
    """A host-to-device copy and the wait for it, as two CUDA driver calls through ctypes
    (``cuMemcpyHtoDAsync_v2``, ``cuStreamSynchronize``), each releasing the GIL: what a
    CPU-centric loader written in C does, without torch's per-copy bookkeeping (its pinned
    allocator's events and locks), which at 4 KiB costs more than the read itself."""

    name = "cuMemcpyHtoDAsync + cuStreamSynchronize (CUDA driver API, ctypes)"

    def __init__(self) -> None:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        self._copy = lib.cuMemcpyHtoDAsync_v2
        self._copy.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._copy.restype = ctypes.c_int
        self._sync = lib.cuStreamSynchronize
        self._sync.argtypes, self._sync.restype = [ctypes.c_void_p], ctypes.c_int

    def __call__(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        err = self._copy(dst, src, nbytes, stream) or self._sync(stream)
        if err:
            raise gpu_io.GpuIOError(f"host-to-device copy failed: CUresult {err}")


def _copier(how: str) -> tuple[Any, str]:
    """(copy function or None for torch's ``copy_``, its description)."""
    if how == "driver":
        try:
            copy = DriverCopy()
            return copy, copy.name
        except (OSError, AttributeError) as exc:
            return None, f"torch copy_(non_blocking) + stream.synchronize() (driver API unavailable: {exc})"
    return None, "torch copy_(non_blocking) + stream.synchronize()"


def _bind_context(device: torch.device) -> None:
    """Make the device's (primary) context current in this thread, as the driver calls and
    cuFile need: a runtime call that needs a context binds it."""
    torch.cuda.set_device(device)
    torch.cuda.synchronize(device)


def _read_until_deadline(
    run: _Run,
    files: Sequence[Any],
    file_bytes: int,
    block: int,
    seed: int,
    read: Callable[[Any, int], int],
    then: Callable[[], None] | None = None,
) -> None:
    """A worker's timed loop, once every worker is set up: ``read(file, offset)`` of a random
    file at a random aligned offset (one ``block``), then ``then()`` (a copy to the GPU),
    until the run's deadline; the counts and latencies go to ``run``."""
    rng, slots, lat = random.Random(seed), _offsets(file_bytes, block), []
    ops = nbytes = 0
    run.barrier.wait(timeout=_SETUP_TIMEOUT_S)
    deadline, clock = run.deadline, time.perf_counter
    while (t := clock()) < deadline:
        f = files[rng.randrange(len(files))]
        n = read(f, rng.randrange(slots) * gpu_io.ALIGN)
        if n != block:
            raise gpu_io.GpuIOError(f"short read: {n} of {block} bytes")
        if then is not None:
            then()
        lat.append(clock() - t)
        ops += 1
        nbytes += n
    run.add(ops, nbytes, lat)


def _cpu_worker(
    run: _Run,
    fds: list[int],
    file_bytes: int,
    block: int,
    device: torch.device,
    copy: bool,
    driver_copy: DriverCopy | None,
    seed: int,
) -> None:
    try:
        cuda = copy and device.type == "cuda"
        if cuda:
            _bind_context(device)
            stream = torch.cuda.Stream(device)
            dev_buf = torch.empty(block, dtype=torch.uint8, device=device)
            dst, stream_handle = dev_buf.data_ptr(), stream.cuda_stream
        host = gpu_io.aligned_host_buffer(block, pin=cuda)
        src = host.data_ptr()
        view = memoryview(host.numpy()).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ from 3.12

        def to_device() -> None:
            if driver_copy is not None:
                driver_copy(dst, src, block, stream_handle)
            else:
                with torch.cuda.stream(stream):
                    dev_buf.copy_(host, non_blocking=True)
                stream.synchronize()

        _read_until_deadline(
            run,
            fds,
            file_bytes,
            block,
            seed,
            lambda fd, offset: os.preadv(fd, [view], offset),
            to_device if cuda else None,
        )
    except BaseException as exc:  # reported by the caller; the barrier must not hang
        run.errors.append(exc)
        run.barrier.abort()


def _gpu_worker(
    run: _Run,
    driver: gpu_io.CuFileDriver,
    handles: list[int],
    file_bytes: int,
    block: int,
    device: torch.device,
    register: bool,
    seed: int,
) -> None:
    api, registered = driver.api, False
    try:
        _bind_context(device)
        dev_buf = torch.empty(block, dtype=torch.uint8, device=device)
        ptr = dev_buf.data_ptr()
        if register:
            try:
                api.buf_register(ptr, block)
                registered = True
                with run.lock:
                    run.registered += 1
            except gpu_io.GpuIOError:
                pass  # cuFile then uses its internal buffers; the result notes it
        _read_until_deadline(
            run, handles, file_bytes, block, seed, lambda h, offset: api.read(h, ptr, block, offset, 0)
        )
    except BaseException as exc:
        run.errors.append(exc)
        run.barrier.abort()
    finally:
        if registered:
            api.buf_deregister(ptr)


def _measure(
    path: str, threads: int, seconds: float, block: int, target: Callable[..., None], args: tuple
) -> Cell:
    run = _Run(threads, seconds)
    workers = [
        threading.Thread(target=target, args=(run, *args, 1000 + i), name=f"io-bench-{i}", daemon=True)
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    try:
        run.barrier.wait(timeout=_SETUP_TIMEOUT_S)  # a worker stuck setting up breaks the barrier
    except threading.BrokenBarrierError:
        pass
    for w in workers:
        w.join(timeout=seconds + _SETUP_TIMEOUT_S)
        if w.is_alive():
            raise TimeoutError(f"an I/O worker did not finish within {seconds + _SETUP_TIMEOUT_S:g} s")
    wall = time.perf_counter() - run.t0
    cpu = time.process_time() - run.cpu0
    if run.errors:
        raise run.errors[0]
    gbps = run.bytes / wall / 1e9
    cores = cpu / wall
    lat = sorted(run.latencies) or [0.0]
    return Cell(
        path=path,
        block_bytes=block,
        threads=threads,
        ops=run.ops,
        bytes=run.bytes,
        wall_s=round(wall, 4),
        cpu_s=round(cpu, 4),
        gb_per_s=round(gbps, 4),
        iops=round(run.ops / wall, 1),
        cpu_cores_busy=round(cores, 3),
        cpu_cores_per_gb_per_s=round(cores / gbps, 3) if gbps > 0 else None,
        lat_p50_us=round(lat[len(lat) // 2] * 1e6, 1),
        lat_p99_us=round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6, 1),
        cufile_buffers_registered=run.registered if path == GPU_PATH else None,
    )
