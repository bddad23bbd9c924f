"""The io benchmark's run: every path at every block size, with what the machine is."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import torch

from tandem.bench.io_bench.fileset import drop_caches, ensure_file_set, page_cache_plan
from tandem.bench.io_bench.measure import _copier, _cpu_worker, _gpu_worker, _measure
from tandem.bench.io_bench.records import BLOCK_SIZES, CPU_PATH, GPU_PATH, HOST_PATH, Cell, human
from tandem.bench.io_bench.report import markdown, print_table
from tandem.share import gpu_io
from tandem.units import GiB

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
                target: Callable[..., None]  # the path's worker, with its arguments
                args: tuple[Any, ...]
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
