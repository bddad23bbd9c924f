"""Benchmark: random reads from storage to the GPU, CPU-centric against GPU-centric.

Random reads of 4 KiB, 64 KiB, 1 MiB and 4 MiB (4 KiB-aligned offsets, uniformly over a set
of files) for a fixed time per block size, on ``threads`` threads each keeping one read in
flight (queue depth = threads), along each path available here:

``cpu-centric``           ``pread`` into a pinned host buffer, then a copy to the GPU on the
                          thread's stream, waited for (each read ends in GPU memory); the
                          copy and the wait are CUDA driver calls through ctypes
                          (:class:`DriverCopy`; ``run(copy="torch")`` uses torch's
                          ``copy_``). On a machine without CUDA: ``pread`` into host memory
                          only, labelled so.
``gpu-centric (cuFile)``  ``cuFileRead`` into a GPU buffer registered with cuFile: GPUDirect
                          Storage where nvidia-fs is loaded, cuFile's compatibility mode
                          where not (the label says which).
``pread only (reference)`` on a GPU machine: ``pread`` into host memory and nothing more,
                          what the storage gives with no copy to the GPU.

Reported per path and block size: GB/s (1e9 bytes), IOPS, CPU cores busy (this process's
CPU time over wall time: the reading threads, cuFile's own threads, the kernel work done
on their behalf) and CPU cores per GB/s, the comparison the research made between
CPU-centric I/O and SPDK, GPUDirect Storage and BaM. Interrupt handling and other
processes' work are not counted.

The file set should not be served from the page cache. Reads are opened with ``O_DIRECT``
(where the file system accepts it) and, when running as root, the page cache is dropped
(``/proc/sys/vm/drop_caches``) before each measurement; the output says which was used,
and whether the file set is larger than the machine's memory.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from tandem import units
from tandem.share import gpu_io
from tandem.units import GiB, KiB, MiB

BLOCK_SIZES = (4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB)
MANIFEST = "io-bench.json"
_WRITE_CHUNK = 64 * MiB
CPU_PATH, GPU_PATH, HOST_PATH = "cpu-centric", "gpu-centric (cuFile)", "pread only (reference)"


@dataclass
class Cell:
    path: str
    block_bytes: int
    threads: int
    ops: int
    bytes: int
    wall_s: float
    cpu_s: float
    gb_per_s: float
    iops: float
    cpu_cores_busy: float
    cpu_cores_per_gb_per_s: float | None
    lat_p50_us: float
    lat_p99_us: float
    cufile_buffers_registered: int | None = None  # of `threads`, on the cuFile path


@dataclass
class FileSet:
    folder: str
    files: list[str]
    file_bytes: int
    created: bool
    create_s: float = 0.0

    @property
    def total_bytes(self) -> int:
        return self.file_bytes * len(self.files)


@dataclass
class PageCache:
    o_direct: bool
    drop_caches: bool
    method: str
    ram_bytes: int
    file_set_bytes: int
    notes: list[str] = field(default_factory=list)


def parse_size(text: str) -> int:
    """A block size (``4K``, ``64KiB``, ``1M``): :func:`tandem.units.parse_size`, above 0."""
    value = units.parse_size(text)
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


human = units.exact_size


# ---------------------------------------------------------------------------------------
# The file set
# ---------------------------------------------------------------------------------------


def _layout(total_bytes: int, max_block: int) -> tuple[int, int]:
    """(files, bytes per file): up to 1 GiB files, at least 8 files where the size allows,
    each a multiple of 4 MiB and at least the largest block."""
    unit = 4 * MiB
    per_file = min(GiB, max(unit, (total_bytes // 8) // unit * unit), max(unit, total_bytes // unit * unit))
    per_file = max(per_file, -(-max_block // unit) * unit)
    return max(1, math.ceil(total_bytes / per_file)), per_file


def ensure_file_set(folder: Path, total_bytes: int, max_block: int, log: Callable[[str], None]) -> FileSet:
    """Create (or reuse, if its manifest matches) ``folder``'s files of random bytes."""
    count, per_file = _layout(total_bytes, max_block)
    folder.mkdir(parents=True, exist_ok=True)
    names = [str(folder / f"io-bench-{i:04d}.bin") for i in range(count)]
    manifest = folder / MANIFEST
    want = {"version": 1, "files": count, "file_bytes": per_file}
    try:
        have = json.loads(manifest.read_text())
    except (OSError, ValueError):
        have = None
    if have == want and all(os.path.isfile(n) and os.path.getsize(n) == per_file for n in names):
        return FileSet(str(folder), names, per_file, created=False)
    manifest.unlink(missing_ok=True)
    log(f"writing {count} files of {human(per_file)} ({count * per_file / GiB:.2f} GiB) in {folder} ...")
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    for name in names:
        with open(name, "wb") as f:
            left = per_file
            while left:
                n = min(_WRITE_CHUNK, left)
                f.write(rng.bytes(n))
                left -= n
            f.flush()
            os.fsync(f.fileno())
    manifest.write_text(json.dumps(want))
    return FileSet(str(folder), names, per_file, created=True, create_s=time.perf_counter() - t0)


def _can_drop_caches() -> bool:
    return (
        sys.platform.startswith("linux")
        and os.geteuid() == 0
        and os.access("/proc/sys/vm/drop_caches", os.W_OK)
    )


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _o_direct_works(path: str) -> tuple[bool, str]:
    try:
        fd, direct = gpu_io.open_for_read(path, direct=True)
    except OSError as exc:
        return False, f"O_DIRECT open failed: {exc}"
    try:
        if not direct:
            return False, "O_DIRECT refused by the file system (EINVAL)"
        buf = gpu_io.aligned_host_buffer(gpu_io.ALIGN)
        gpu_io.pread_into(fd, buf, 0)
        return True, ""
    except OSError as exc:
        return False, f"O_DIRECT read failed: {exc}"
    finally:
        os.close(fd)


def page_cache_plan(files: FileSet, want_direct: bool, want_drop: bool) -> PageCache:
    ram = psutil.virtual_memory().total
    notes: list[str] = []
    o_direct = False
    if want_direct:
        o_direct, why = _o_direct_works(files.files[0])
        if not o_direct:
            notes.append(why)
    drop = want_drop and _can_drop_caches()
    if want_drop and not drop:
        notes.append("drop_caches not used: needs root on Linux")
    if o_direct and drop:
        method = "O_DIRECT (+ drop_caches before each measurement)"
    elif o_direct:
        method = "O_DIRECT"
    elif drop:
        method = "drop_caches before each measurement (buffered reads fill the cache again as they run)"
    else:
        method = "none: reads may be served from the page cache"
    bigger = files.total_bytes > ram
    notes.append(
        f"file set {files.total_bytes / GiB:.2f} GiB {'>' if bigger else '<='} RAM {ram / GiB:.1f} GiB"
        + ("" if bigger or o_direct else ": the page cache can hold it, so these are memory reads")
    )
    return PageCache(o_direct, drop, method, ram, files.total_bytes, notes)


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
        view = memoryview(host.numpy()).cast("B")

        def to_device() -> None:
            if driver_copy is not None:
                driver_copy(dst, src, block, stream_handle)
            else:
                with torch.cuda.stream(stream):
                    dev_buf.copy_(host, non_blocking=True)
                stream.synchronize()

        _read_until_deadline(run, fds, file_bytes, block, seed,
                             lambda fd, offset: os.preadv(fd, [view], offset),
                             to_device if cuda else None)  # fmt: skip
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
        _read_until_deadline(run, handles, file_bytes, block, seed,
                             lambda h, offset: api.read(h, ptr, block, offset, 0))  # fmt: skip
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


# ---------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------


def _resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    return gpu_io.check_device(device)


def _filesystem(folder: str) -> str:
    best, fstype = "", "?"
    real = os.path.realpath(folder)
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
            best, fstype = mp, f"{part.fstype} ({part.device} on {mp})"
    return fstype


def run(
    folder: Path = Path("data/io-bench"),
    size_gib: float = 8.0,
    seconds: float = 5.0,
    threads: int = 8,
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
    device: str | None = None,
    direct: bool = True,
    drop: bool = True,
    register: bool = True,
    copy: str = "driver",
    out: Path | None = Path("benchmarks/results/gpu_io.json"),
    quiet: bool = False,
) -> dict[str, Any]:
    """Run every available path at every block size; print a table and write ``out``
    (JSON) and the same name with ``.md``. Returns the results as written."""

    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    dev = _resolve_device(device)
    if not block_sizes:
        raise ValueError("no block sizes given")
    files = ensure_file_set(Path(folder), int(size_gib * GiB), max(block_sizes), log)
    too_big = [b for b in block_sizes if b > files.file_bytes or b % gpu_io.ALIGN]
    if too_big:
        raise ValueError(
            f"block sizes must be multiples of 4 KiB and at most {human(files.file_bytes)}: {too_big}"
        )
    cache = page_cache_plan(files, direct, drop)
    log(f"page cache: {cache.method}; " + "; ".join(cache.notes))

    paths: list[str] = []
    skipped: dict[str, str] = {}
    labels: dict[str, str] = {}
    driver_copy, copy_how = _copier(copy) if dev.type == "cuda" else (None, "none")
    if dev.type == "cuda":
        labels[CPU_PATH] = f"pread into pinned host memory, then a copy to the GPU: {copy_how}"
    else:
        labels[CPU_PATH] = "pread into host memory only (no GPU: CPU-only run)"
    paths.append(CPU_PATH)
    if dev.type == "cuda":  # what the storage gives without any copy, to read the two against
        labels[HOST_PATH] = "pread into host memory only, no copy to the GPU (reference)"
        paths.append(HOST_PATH)
    driver: gpu_io.CuFileDriver | None = None
    if dev.type == "cuda":
        try:
            driver = gpu_io.CuFileDriver.get()
            labels[GPU_PATH] = f"cuFileRead into GPU memory: {driver.mode} ({driver.library})"
            paths.append(GPU_PATH)
        except gpu_io.GpuIOError as exc:
            skipped[GPU_PATH] = str(exc)
    else:
        skipped[GPU_PATH] = "no CUDA device"

    cells: list[Cell] = []
    errors: dict[str, str] = {}
    fds: list[int] = []
    handles: list[int] = []
    try:
        fds = [gpu_io.open_for_read(f, direct=cache.o_direct)[0] for f in files.files]
        for path in paths:
            if path == GPU_PATH:
                assert driver is not None
                try:
                    with torch.cuda.device(dev):
                        torch.empty(1, device=dev)  # the context current in this thread
                        for fd in fds:
                            handles.append(driver.api.handle_register(fd))
                except gpu_io.GpuIOError as exc:
                    errors[path] = f"cuFile could not register the files: {exc}{driver.register_hint()}"
                    continue
            for block in block_sizes:
                if cache.drop_caches:
                    drop_caches()
                if path in (CPU_PATH, HOST_PATH):
                    target = _cpu_worker
                    args = (fds, files.file_bytes, block, dev, path == CPU_PATH, driver_copy)
                else:
                    target, args = _gpu_worker, (driver, handles, files.file_bytes, block, dev, register)
                try:
                    cell = _measure(path, threads, seconds, block, target, args)
                except Exception as exc:  # noqa: BLE001 - recorded in the results; the rest go on
                    errors[path] = f"at {human(block)}: {type(exc).__name__}: {exc}"
                    break
                cells.append(cell)
                log(
                    f"{path:>22} {human(block):>8}: {cell.gb_per_s:7.3f} GB/s {cell.iops:10.0f} IOPS "
                    f"{cell.cpu_cores_busy:5.2f} cores busy"
                )
    finally:
        if driver is not None:
            for h in handles:
                driver.api.handle_deregister(h)
        for fd in fds:
            os.close(fd)

    result = {
        "benchmark": "gpu_io",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": _host(dev),
        "config": {
            "folder": files.folder,
            "filesystem": _filesystem(files.folder),
            "files": len(files.files),
            "file_bytes": files.file_bytes,
            "file_set_bytes": files.total_bytes,
            "file_set_created": files.created,
            "file_set_create_s": round(files.create_s, 2),
            "threads": threads,
            "queue_depth": threads,
            "seconds_per_cell": seconds,
            "block_bytes": list(block_sizes),
            "device": str(dev),
            "cufile_buf_register": register,
            "cpu_centric_copy": copy_how,
        },
        "page_cache": asdict(cache),
        "paths": {p: labels[p] for p in paths},
        "skipped": skipped,
        "errors": errors,
        "results": [asdict(c) for c in cells],
    }
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown(result))
        log(f"wrote {out} and {out.with_suffix('.md')}")
    if not quiet:
        print_table(result)
    return result


def _host(dev: torch.device) -> dict[str, Any]:
    host: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "nvidia_fs_loaded": gpu_io.nvidia_fs_loaded(),
        "cufile_library": gpu_io.find_cufile_library(),
        "udev_database": os.path.isdir("/run/udev/data"),  # cuFile reads block devices' attributes there
    }
    if dev.type == "cuda":
        host["gpu"] = torch.cuda.get_device_name(dev)
        host["cuda"] = torch.version.cuda
    return host


def _rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in result["results"]:
        per = c["cpu_cores_per_gb_per_s"]
        rows.append(
            [
                c["path"],
                human(c["block_bytes"]),
                f"{c['gb_per_s']:.3f}",
                f"{c['iops']:,.0f}",
                f"{c['cpu_cores_busy']:.2f}",
                "-" if per is None else f"{per:.2f}",
                f"{c['lat_p50_us']:,.0f}",
                f"{c['lat_p99_us']:,.0f}",
            ]
        )
    return rows


_HEADER = ["path", "block", "GB/s", "IOPS", "CPU cores busy", "cores per GB/s", "p50 µs", "p99 µs"]


def markdown(result: dict[str, Any]) -> str:
    cfg, host, cache = result["config"], result["host"], result["page_cache"]
    lines = [
        "# Storage to GPU: random reads, CPU-centric against GPU-centric",
        "",
        f"{result['created']}; {host.get('gpu', 'no GPU')}, {host['cpu_cores']} CPU cores, "
        f"{host['ram_bytes'] / GiB:.0f} GiB RAM, torch {host['torch']}.",
        f"File set: {cfg['files']} files of {human(cfg['file_bytes'])} "
        f"({cfg['file_set_bytes'] / GiB:.2f} GiB) on {cfg['filesystem']}; {cfg['threads']} threads "
        f"(queue depth {cfg['queue_depth']}), {cfg['seconds_per_cell']} s per cell, "
        "4 KiB-aligned random offsets.",
        f"Page cache bypass: **{cache['method']}** ({'; '.join(cache['notes'])}).",
        "",
    ]
    for name, label in result["paths"].items():
        lines.append(f"- `{name}`: {label}")
    for name, why in result["skipped"].items():
        lines.append(f"- `{name}`: not run: {why}")
    for name, why in result["errors"].items():
        lines.append(f"- `{name}`: failed: {why}")
    lines += ["", "| " + " | ".join(_HEADER) + " |", "|" + " --- |" * len(_HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(result)]
    lines += [
        "",
        "CPU cores busy: this process's CPU time (user + system, every thread) over wall time; "
        "cores per GB/s: that over the throughput.",
        "",
    ]
    return "\n".join(lines)


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg, cache = result["config"], result["page_cache"]
    table = Table(
        title=f"storage to {cfg['device']}: {cfg['files']} x {human(cfg['file_bytes'])}, "
        f"{cfg['threads']} threads, page cache bypass: {cache['method']}"
    )
    for i, h in enumerate(_HEADER):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in _rows(result):
        table.add_row(*row)
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    for name, label in result["paths"].items():
        console.print(f"{name}: {label}", markup=False, highlight=False)
    for name, why in {**result["skipped"], **result["errors"]}.items():
        console.print(f"{name}: not measured: {why}", markup=False, highlight=False)
