"""What a job reserves, or a host has, as one typed value: :class:`Resources` (cores, RAM,
GPUs, GPU memory per GPU, GPU share) with the arithmetic the scheduler needs (add,
subtract, fits in, what is short and by how much, in the words of ``tandem ls``),
:class:`Reservation`: a job's resources with where each figure came from (given, learnt,
probe, share), and :class:`Cap`: a bound on cores and RAM that may be absent (what the
daemon was told to hand out, what a cgroup allows).

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
    """One figure that does not fit: what is needed, what is free of what total, and the
    words ``tandem ls`` gives for it (the only place a shortfall is worded):
    ``cores: needs 2 with its share's producer, 1 of 2 free``,
    ``GPU 0 memory: needs 10.0G, 4.0G of 16.0G unreserved``."""

    figure: str  # a field of Resources: "cores", "ram", "gpus", "gpu_mem", "gpu_share"
    needed: float
    free: float
    total: float | None = None  # of what (the capacity), where said
    suffix: str = ""  # after the need: " with its share's producer"
    where: str = ""  # whose: "GPU 0"

    @property
    def by(self) -> float:
        return self.needed - self.free

    def __str__(self) -> str:
        label, show, free_word = _WORDS[self.figure]
        if self.where:
            label = f"{self.where} memory" if self.figure == "gpu_mem" else f"{self.where} {label}"
        of = "" if self.total is None else f" of {show(self.total)}"
        return f"{label}: needs {show(self.needed)}{self.suffix}, {show(max(self.free, 0))}{of} {free_word}"


def _bytes(value: float) -> str:
    return format_size(int(value))


def _count(value: float) -> str:
    return str(int(value))


def _percent(value: float) -> str:
    return f"{int(value)}%"


_WORDS = {  # a figure's label, how its values are written, and what its free part is called
    "cores": ("cores", format_cores, "free"),
    "ram": ("RAM", _bytes, "unreserved"),
    "gpus": ("GPUs", _count, "free"),
    "gpu_mem": ("GPU memory", _bytes, "unreserved"),
    "gpu_share": ("GPU compute", _percent, "free"),
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

    def short_of(
        self, free: Resources, total: Resources | None = None, *, suffix: str = "", where: str = ""
    ) -> list[Shortfall]:
        """The figures of this that ``free`` cannot give (of ``total``, where said), in field
        order; empty where it fits. ``str()`` of each is a reason ``tandem ls`` shows."""
        return [
            Shortfall(
                f.name,
                getattr(self, f.name),
                getattr(free, f.name),
                None if total is None else getattr(total, f.name),
                suffix,
                where,
            )
            for f in fields(self)
            if getattr(self, f.name) > getattr(free, f.name) + (1e-9 if f.name == "cores" else 0)
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
    (:data:`SOURCES`): cores, RAM and GPU memory each have their own kind and the words
    ``tandem ls``/``show`` give for it (``cores_why``, ``ram_why``); the GPU count and
    share are always given. One value from the decision of a pass (:func:`tandem.place.
    decide.reserve`) through the scheduler and the start to the attempt's record, where it
    follows what the attempt is measured to use (:meth:`measured`).

    A figure of kind :data:`PROBE` is not known yet: cores are a probe's few, RAM is 0 (the
    host's measured free memory decides), GPU memory is 0 and the GPU it goes to takes no
    other job until it has settled (:attr:`gpu_probe`)."""

    resources: Resources
    cores_from: str = GIVEN
    ram_from: str = GIVEN
    gpu_mem_from: str = GIVEN
    cores_why: str = GIVEN
    ram_why: str = GIVEN

    def __post_init__(self) -> None:
        for name in ("cores_from", "ram_from", "gpu_mem_from"):
            source = getattr(self, name)
            if not set(source.split("+")) <= set(SOURCES):
                raise ValueError(f"Reservation.{name}: {source!r}; one of {', '.join(SOURCES)}")

    @property
    def gpu_mem(self) -> int | None:
        """GPU memory per GPU; None where it is not known yet (a GPU probe)."""
        return None if self.gpu_probe else self.resources.gpu_mem

    @property
    def probe(self) -> bool:
        """Its cores were never measured for its job key (a job of ``--cpus auto``)."""
        return PROBE in self.cores_from.split("+")

    @property
    def gpu_probe(self) -> bool:
        """It asks for GPUs of memory not known yet: measured as it runs."""
        return bool(self.resources.gpus) and PROBE in self.gpu_mem_from.split("+")

    @property
    def with_share(self) -> bool:
        """Its figures include its share's producer's (the submit check's, which starts it)."""
        return SHARE in self.cores_from.split("+") or SHARE in self.ram_from.split("+")

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

    def measured(
        self, *, cores: float | None = None, ram: int | None = None, gpu_mem: int | None = None, why: str
    ) -> Reservation:
        """This with the figures given replaced by what its attempt was measured to use
        (``why``: the words for them, e.g. ``measured, this run``)."""
        r = self.resources
        return replace(
            self,
            resources=replace(
                r,
                cores=r.cores if cores is None else cores,
                ram=r.ram if ram is None else ram,
                gpu_mem=r.gpu_mem if gpu_mem is None else gpu_mem,
            ),
            cores_from=self.cores_from if cores is None else LEARNT,
            cores_why=self.cores_why if cores is None else why,
            ram_from=self.ram_from if ram is None else LEARNT,
            ram_why=self.ram_why if ram is None else why,
            gpu_mem_from=self.gpu_mem_from if gpu_mem is None else LEARNT,
        )

    def to_dict(self) -> dict[str, object]:
        """Its figures and sources by name (an attempt record's JSON)."""
        return {
            **{f.name: getattr(self.resources, f.name) for f in fields(Resources)},
            **{name: getattr(self, name) for name in _SOURCE_NAMES},
        }

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> Reservation:
        """What :meth:`to_dict` wrote."""
        figures = {f.name: values[f.name] for f in fields(Resources) if f.name in values}
        return cls(Resources(**figures), **{k: str(values[k]) for k in _SOURCE_NAMES if k in values})  # type: ignore[arg-type]

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


_SOURCE_NAMES = ("cores_from", "ram_from", "gpu_mem_from", "cores_why", "ram_why")


@dataclass(frozen=True, slots=True)
class Cap:
    """At most this many cores and this much RAM (bytes); None where nothing bounds that
    figure. The daemon's configured limits (``--cpus``, ``--mem``) and a cgroup's (its CPU
    quota, its memory limit) are each one."""

    cores: float | None = None
    ram: int | None = None

    def __post_init__(self) -> None:
        for name in ("cores", "ram"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"Cap.{name}: {value!r} is not a positive number")

    def of(self, have: Resources) -> Resources:
        """What ``have`` gives within this cap: each bounded figure no more than its bound."""
        return replace(
            have,
            cores=have.cores if self.cores is None else min(have.cores, self.cores),
            ram=have.ram if self.ram is None else min(have.ram, self.ram),
        )
