"""The io benchmark's file set: written once, reused, kept out of the page cache."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil

from tandem.bench.io_bench.records import _WRITE_CHUNK, MANIFEST, FileSet, PageCache, human
from tandem.share import gpu_io
from tandem.units import GiB, MiB

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
