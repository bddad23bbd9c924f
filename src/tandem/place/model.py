"""What a job asks for and the words the job manager uses: sizes, requests, job states.

Pure data, no I/O: the daemon, the command line, the simulator and the tests share it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

QUEUED, RUNNING, RETRYING = "queued", "running", "retrying"
SUCCEEDED, FAILED, OOM, CANCELLED = "succeeded", "failed", "oom", "cancelled"
STATES = (QUEUED, RUNNING, RETRYING, SUCCEEDED, FAILED, OOM, CANCELLED)
FINAL_STATES = frozenset({SUCCEEDED, FAILED, OOM, CANCELLED})
WAITING_STATES = frozenset({QUEUED, RETRYING})

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``512M``, ``10G``, ``1.5GiB``, ``4096`` (binary units, as Slurm and Docker
    read them); ValueError naming the accepted forms otherwise."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(
            f"{text!r} is not a size: use a number with an optional unit K, M, G or T (512M, 10G)"
        )
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    return int(math.ceil(value))


def format_size(n: int | float | None) -> str:
    """``1.5G``-style text for a byte count (``-`` for None)."""
    if n is None:
        return "-"
    for unit in ("T", "G", "M", "K"):
        if abs(n) >= _UNITS[unit]:
            value = n / _UNITS[unit]
            return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return f"{int(n)}B"


def parse_cpus(text: str | float) -> float:
    """A core count, fractional allowed (``0.5``); must be positive."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number of cores (e.g. 1, 0.5, 4)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r}: the number of cores must be above 0")
    return value


@dataclass(frozen=True)
class Request:
    """What a job reserves while it runs. ``gpu_mem`` is per GPU; None means ``auto``: the
    peak measured for the same job key before, or, for a job never seen, a probe (the GPU
    with most free memory, which nobody joins until the job's memory has settled)."""

    cpus: float = 1.0
    mem: int = 0  # host RAM reserved, bytes (0: not reserved, only checked against what is free)
    gpus: int = 0
    gpu_mem: int | None = None
    gpu_share: int | None = None  # MPS active thread percentage


@dataclass(frozen=True)
class Capacity:
    """What the daemon may hand out: cores, RAM and GPUs (index, uuid, memory)."""

    cpus: float
    mem: int
    gpus: tuple[GpuInfo, ...] = ()


@dataclass(frozen=True)
class GpuInfo:
    """One GPU the daemon hands out. ``index`` is the daemon's own numbering (all nodes);
    under Ray, ``node`` is the Ray node it is on and ``local`` its index there."""

    index: int
    uuid: str
    mem_total: int
    name: str = ""
    node: str = ""
    local: int | None = None

    @property
    def visible_id(self) -> str:
        """What ``CUDA_VISIBLE_DEVICES`` names it by: the UUID, else its index on its node."""
        return self.uuid if self.local is None else str(self.local)


def job_key(name: str | None, command: list[str]) -> str:
    """What identifies 'the same job' for measured peaks: its name, else its command line."""
    return f"name:{name}" if name else "cmd:" + " ".join(command)
