"""What a job reserves, or a host has, as one typed value: :class:`Resources` (cores, RAM,
GPUs, GPU memory per GPU, GPU share) with the arithmetic the scheduler needs (add,
subtract, fits in, what is short and by how much, in the words of ``tandem ls``), and
:class:`Reservation`: a job's resources with where each figure came from (given, learnt,
probe, share).

Pure data, no I/O: the daemon, the simulator and the tests share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from tandem.units import format_cores, format_size

# Where a reserved figure came from.
GIVEN = "given"  # the job's request (--cpus 2, --mem 4G, --gpu-mem 10G)
LEARNT = "learnt"  # measured on earlier runs of its job key
PROBE = "probe"  # never measured: a small start, raised to its measurement as it runs
SHARE = "share"  # its share's producer's, which it starts with it
SOURCES = (GIVEN, LEARNT, PROBE, SHARE)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One figure that does not fit: what is needed, what there is, and the words for it."""

    figure: str  # a field of Resources: "cores", "ram", "gpus", "gpu_mem", "gpu_share"
    needed: float
    free: float

    @property
    def by(self) -> float:
        return self.needed - self.free

    def __str__(self) -> str:
        label, show = _WORDS[self.figure]
        return f"{label}: needs {show(self.needed)}, {show(max(self.free, 0))} free ({show(self.by)} short)"


def _bytes(value: float) -> str:
    return format_size(int(value))


def _count(value: float) -> str:
    return str(int(value))


def _percent(value: float) -> str:
    return f"{int(value)}%"


_WORDS = {
    "cores": ("cores", format_cores),
    "ram": ("RAM", _bytes),
    "gpus": ("GPUs", _count),
    "gpu_mem": ("GPU memory", _bytes),
    "gpu_share": ("GPU compute", _percent),
}


@dataclass(frozen=True, slots=True)
class Resources:
    """Cores (fractional), RAM (bytes), GPUs (a count), GPU memory per GPU (bytes) and the
    share of a GPU's compute (percent, MPS). A job's need, a host's capacity, or what is
    free: arithmetic is figure by figure (two jobs on one GPU add their GPU memory), and a
    difference may go below zero (reservations over what is there, measured busier)."""

    cores: float = 0.0
    ram: int = 0
    gpus: int = 0
    gpu_mem: int = 0
    gpu_share: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"Resources.{f.name}: {value!r} is not a finite number")

    def __add__(self, other: Resources) -> Resources:
        return Resources(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: Resources) -> Resources:
        return Resources(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def fits_in(self, other: Resources) -> bool:
        """Is every figure of this at most ``other``'s (what is free)?"""
        return all(getattr(self, f.name) <= getattr(other, f.name) for f in fields(self))

    def short_of(self, other: Resources) -> list[Shortfall]:
        """The figures of this that ``other`` (what is free) cannot give, in field order;
        empty where it fits. ``str()`` of each is a reason ``tandem ls`` shows."""
        return [
            Shortfall(f.name, getattr(self, f.name), getattr(other, f.name))
            for f in fields(self)
            if getattr(self, f.name) > getattr(other, f.name)
        ]

    def __str__(self) -> str:
        parts = [f"{format_cores(self.cores)} cores", f"{format_size(self.ram)} RAM"]
        if self.gpus:
            parts.append(f"{self.gpus} GPU(s) with {format_size(self.gpu_mem)} each")
        if self.gpu_share:
            parts.append(f"{self.gpu_share}% of a GPU's compute")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a job reserves (:class:`Resources`) and where each figure came from
    (:data:`SOURCES`): cores, RAM and GPU memory each have their own; the GPU count and
    share are always given. ``with_producer`` adds its share's producer's figures."""

    resources: Resources
    cores_from: str = GIVEN
    ram_from: str = GIVEN
    gpu_mem_from: str = GIVEN

    def __post_init__(self) -> None:
        for name in ("cores_from", "ram_from", "gpu_mem_from"):
            source = getattr(self, name)
            if not set(source.split("+")) <= set(SOURCES):
                raise ValueError(f"Reservation.{name}: {source!r}; one of {', '.join(SOURCES)}")

    def with_producer(self, producer: Resources) -> Reservation:
        """This plus its share's producer's cores and RAM (reserved with the job, which
        starts it); a figure the producer adds to says so (``learnt+share``)."""

        def source(own: str, added: float) -> str:
            return f"{own}+{SHARE}" if added and SHARE not in own.split("+") else own

        return replace(
            self,
            resources=self.resources + Resources(cores=producer.cores, ram=producer.ram),
            cores_from=source(self.cores_from, producer.cores),
            ram_from=source(self.ram_from, producer.ram),
        )

    def __str__(self) -> str:
        r = self.resources
        parts = [
            f"{format_cores(r.cores)} cores ({self.cores_from})",
            f"{format_size(r.ram)} RAM ({self.ram_from})",
        ]
        if r.gpus:
            parts.append(f"{r.gpus} GPU(s) with {format_size(r.gpu_mem)} each ({self.gpu_mem_from})")
        if r.gpu_share:
            parts.append(f"{r.gpu_share}% of a GPU's compute")
        return ", ".join(parts)
