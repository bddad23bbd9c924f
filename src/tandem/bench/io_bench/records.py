"""The io benchmark's records: block sizes, a cell's figures, the file set, the page cache plan."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem import units
from tandem.units import KiB, MiB

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
