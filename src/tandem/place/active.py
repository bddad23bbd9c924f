"""What the daemon knows of a running attempt (:class:`Active`), how one ended once recorded
(:class:`AttemptEnd`), and what programs use as they start (:class:`Startup`): the records
:mod:`tandem.place.attempts` follows and :mod:`tandem.place.admission` counts."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tandem.place import clock
from tandem.place.records import Attempt, AttemptPlacement, Job
from tandem.place.reserve import AUTO_CPUS, MEM_MARGIN, PROBE_CORES, Learned, Measuring
from tandem.place.resources import GIVEN, PROBE, Reservation, Resources

STARTUP_SAMPLES = 3  # a job's first samples (one a second; the first has no rate yet) are its start-up
# A program never seen starting is counted at a core while it starts: an interpreter that
# imports its framework takes one, and jobs that all start at once would otherwise crowd out
# a running CPU-bound job (the first sample of the program says what it really takes).
UNSEEN_STARTUP_CORES = 1.0


class Startup:
    """What programs use at start, as measured: the cores of a job's first samples, per
    program (its command's first three words: ``python -m pkg.train``, ``python train.py
    --lr``), the newest weighing most. A job of a program seen before is counted at that
    until its own first samples are in: an import of torch takes a whole core for seconds
    whatever the job declared, and jobs that start together would otherwise all take it. A
    program never seen is counted at :data:`UNSEEN_STARTUP_CORES`."""

    def __init__(self, learned: Learned | None = None) -> None:
        self._cores: dict[tuple[str, ...], float] = {}
        # What each learning key used (reservations of --cpus auto), kept in the state.
        self.learned = learned if learned is not None else Learned()

    @staticmethod
    def program(command: list[str]) -> tuple[str, ...]:
        return tuple(command[:3])

    def seen(self, command: list[str], cores: float) -> None:
        key = self.program(command)
        old = self._cores.get(key)
        self._cores[key] = cores if old is None else max(cores, 0.5 * old + 0.5 * cores)

    def cores(self, command: list[str]) -> float:
        return self._cores.get(self.program(command), UNSEEN_STARTUP_CORES)


@dataclass
class AttemptEnd:
    """How an attempt ended, as recorded by its transition (retry or finish)."""

    state: str
    cause: str | None
    retried: bool
    ended: float
    peak_mem: int | None
    peak_gpu_mem: int | None
    energy: float | None
    wait_s: float
    pruned_rung: int | None = None  # the rung its --prune rule stopped it at


@dataclass
class Active:
    """A running attempt as the daemon follows it. What it reserves is its record's
    (:attr:`placed`, an :class:`~tandem.place.records.AttemptPlacement` whose
    :class:`~tandem.place.resources.Reservation` is the pass's, then what it is measured to
    use): the daemon holds the record it writes, so that no write reads the stored one back."""

    job: Job
    n: int
    placed: AttemptPlacement
    dir: Path
    started: float  # wall clock
    shim_pid: int | None = None
    shim_ctime: float | None = None
    pids: tuple[int, ...] = ()
    peak_mem: int = 0
    peak_gpu_mem: int = 0
    last_growth: float = field(default_factory=clock.now)
    usage_t: float = 0.0
    heard: float = field(default_factory=clock.now)  # when its supervisor's usage last changed
    cut_off_said: bool = False  # its node's loss to Ray was said while its supervisor still wrote
    lost_seen: float = 0.0  # when its node was first seen gone to Ray (0: never)
    energy_start: dict[str, int] = field(default_factory=dict)
    remote: bool = False  # its supervisor runs on another machine (a Ray node): no pid checks
    cpus_used: float | None = None  # cores its processes used over the last sample
    samples: int = 0  # usage samples seen (a job is "starting" until STARTUP_SAMPLES)
    fail_cause: str | None = None  # the daemon stopped it for this (its share's producer died)
    stop_cause: str | None = None  # the daemon stopped it as done (a producer after its group): succeeded
    ending: AttemptEnd | None = None  # its end, once recorded (a later write that fails is retried alone)
    cpu: Measuring | None = None  # its reservation of cores as it is learnt (None: its job's --cpus)
    lost_before: int = 0  # its job's attempts before it that were lost, not its failures (a dead node)

    @property
    def reservation(self) -> Reservation:
        """What it reserves now (its record's)."""
        assert self.placed.reservation is not None, "a running attempt's record has its reservation"
        return self.placed.reservation

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.placed.gpus

    @property
    def uuids(self) -> tuple[str, ...]:
        return self.placed.uuids

    @property
    def alone(self) -> bool:
        return self.placed.alone

    @property
    def gpu_probing(self) -> bool:
        """Placed as a probe of GPU memory and not settled yet."""
        return self.placed.probe and not self.placed.settled

    @property
    def probing(self) -> bool:
        """A job of --cpus auto never seen before, not yet measured."""
        return self.cpu is not None and self.cpu.probe

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def node(self) -> str:
        """The Ray node it runs on ("" on one server)."""
        return self.placed.node or ""

    def ram_grown(self) -> Reservation | None:
        """Its reservation with RAM raised to its peak plus the margin, where it is ``--mem
        auto`` and its peak passed what it reserves (by 10%: not a write per sample); else None."""
        r = self.reservation
        wanted = int(self.peak_mem * (1 + MEM_MARGIN))
        if self.job.mem or wanted <= r.resources.ram * 1.1:
            return None
        return r.measured(ram=wanted, why="measured, this run")

    @classmethod
    def adopted(cls, job: Job, att: Attempt, adir: Path, learned: Learned) -> Active:
        """A running attempt as a previous daemon recorded it, taken up after a restart: its
        reservation as recorded (cores of --cpus auto followed on from there, not probed again)."""
        pl = att.placement
        if pl.reservation is None:  # an earlier tandem's record without its figures: given, else a probe's
            auto, gpu_unknown = job.cpus == AUTO_CPUS, bool(job.gpus) and job.gpu_mem is None
            need = Resources(PROBE_CORES if auto else job.cpus, job.mem, job.gpus or 0, job.gpu_mem or 0)
            kinds = (PROBE if auto else GIVEN, GIVEN if job.mem else PROBE, PROBE if gpu_unknown else GIVEN)
            pl = replace(pl, reservation=Reservation(need, *kinds, cores_why=kinds[0], ram_why=kinds[1]))
        a = cls(job, att.n, pl, adir, att.started, att.shim_pid, att.shim_ctime)
        a.cpu = Measuring(job, learned, start=a.reservation)
        a.peak_gpu_mem, a.peak_mem = att.peak_gpu_mem or 0, att.peak_mem or 0
        return a

    def settled(self, now: float, settle_s: float) -> bool:
        return now - self.started >= settle_s and now - self.last_growth >= settle_s


def energy_of(a: Active, running: Iterable[Active], energy_mj: Callable[[str], int | None]) -> float | None:
    """Joules of ``a``'s GPUs over the attempt (shared among collocated jobs: the whole
    device's counter, ``energy_mj`` by uuid, split by how many of ``running`` were on it at
    the end)."""
    if not a.energy_start:
        return None
    running = list(running)
    total = 0.0
    for uuid, start in a.energy_start.items():
        end = energy_mj(uuid)
        if end is None:
            return None
        sharers = sum(1 for o in running if uuid in o.uuids)
        total += (end - start) / 1000.0 / max(1, sharers)
    return total
