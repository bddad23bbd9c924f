"""Reservations that learn: the cores a job of ``--cpus auto`` reserves.

A job submitted without ``--cpus`` (stored as :data:`AUTO_CPUS`) reserves what jobs of its
learning key (:attr:`tandem.place.records.Job.learning_key`: its ``--name``, else its command
line; a sweep's point, its template's, so the points of a sweep are alike) were
measured to use: the 95th percentile of its process tree's cores over a run (its own
processes: a share's producer is supervised and charged apart), times 1.2 plus 0.05, at
least 0.1. A key with no run of its own takes what its script's other commands were
measured at (:func:`script_key`: ``python train.py --lr 0.1`` and ``--lr 0.01`` submitted
apart, or each point with a ``--name`` of its own). A job never seen before is a *probe*:
it reserves :data:`PROBE_CORES`, and once it has :data:`PROBE_SAMPLES` samples past its
start-up its reservation becomes its measurement (a CPU-bound job reserves about a core
within seconds). No job waits for another's measurement: probes start side by side where
the host's measured load leaves room, each counted meanwhile at what its program used at
start (a whole core for one never seen: :class:`tandem.place.active.Startup`). A running
job's reservation then follows its use over its last :data:`FOLLOW_SAMPLES` samples, down
as well as up. The samples of its start-up burst (imports) are not counted: while it lasts,
what the job uses beyond its reservation holds other jobs back, and once it is over the
job's measurement is what it goes on to use (see :data:`STARTUP_MAX_SAMPLES`). Jobs alike to
a running one that was measured start at once at that figure (:func:`running_figures`:
each follows its own use up from there). What was learnt is kept in the state
(``peaks.cpu_runs``): a restarted daemon knows it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from tandem.place.model import AUTO_CPUS, python_code
from tandem.place.records import Job
from tandem.place.resources import Reservation

PROBE_CORES = 0.25
SYSTEM_PROBE_CORES = 1.0  # a system manager's (tandem daemon start --system): see Learned
PROBE_SAMPLES = 2  # samples (one a second) past start-up before a probe counts as measured
# A start-up burst (importing torch, MLflow, Lightning: a whole core for seconds) is not what
# a job goes on to use: a job of --cpus auto is starting while its use stays at least half its
# start-up peak (and above a probe's cores), for at most this many samples. Meanwhile what it
# uses beyond its reservation holds other jobs back (tandem.place.admission).
STARTUP_MAX_SAMPLES = 20
KEEP_RUNS = 5  # the recent runs of a key that decide its reservation
# A running job's reservation follows its use over its last samples (one a second), down as
# well as up, and is written only when it moves by more than this (not every second).
FOLLOW_SAMPLES = 45
FOLLOW_STEP = 0.1  # cores, or this share of the reservation where that is more


def margin(cores: float) -> float:
    """A measured use of cores plus the margin a reservation keeps (x1.2 + 0.05, at least
    0.1), never more than the whole cores it was seen to keep busy: a job that keeps one
    core busy reserves one, so two of them still fit on two cores."""
    return max(0.1, min(cores * 1.2 + 0.05, max(1.0, math.ceil(cores - 0.02))))


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


MEM_MARGIN = 0.1  # a learnt RAM reservation: the peak measured, plus this share of it


def mem_reservation(given: int, learned_peak: int | None, key: str) -> tuple[int, str]:
    """The RAM a job reserves as it starts and where that comes from: ``--mem`` given, else
    (auto) the peak measured for its job key before plus :data:`MEM_MARGIN`, else none yet
    (a job never seen: the host's measured available memory decides, and its own peak is
    reserved as it grows)."""
    if given:
        return given, "given"
    if learned_peak:
        return int(learned_peak * (1 + MEM_MARGIN)), f"measured, job key {key_words(key)}"
    return 0, "auto: none until measured"


SCRIPT_PREFIX = "script:"
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "env", "nohup", "time", "xargs"})


def script_key(command: list[str]) -> str | None:
    """The key a job's script is learnt under beside its own: ``python train.py`` (the
    interpreter's name and the script), ``python -m pkg.train``, or a program's name; None
    where the command does not say which code runs (``python -c``, a shell, ``env``)."""
    if not command:
        return None
    program = os.path.basename(command[0])
    if program in _SHELLS:
        return None
    if program.startswith("python"):
        code = python_code(command)
        return None if code is None else f"{SCRIPT_PREFIX}{program} {' '.join(filter(None, code))}"
    return f"{SCRIPT_PREFIX}{program}"


def key_words(key: str) -> str:
    """A job key as a person reads it (its name, else its command)."""
    return key.split(":", 1)[1] if ":" in key else key


class Learned:
    """The cores each learning key was measured to use, over its recent successful runs:
    ``stored`` (what the state kept) to begin with, each new run written through ``write``
    (the daemon's state) before it counts."""

    def __init__(
        self,
        stored: dict[str, list[float]] | None = None,
        write: Callable[[str, list[float]], None] | None = None,
        probe_cores: float = PROBE_CORES,
    ) -> None:
        self._runs: dict[str, list[float]] = {k: v[-KEEP_RUNS:] for k, v in (stored or {}).items()}
        self._write = write
        # What a job of cores never measured reserves, and whether it may start on measured room
        # beyond that: a system manager's (every user's) a core, and no, so that no user's
        # unmeasured jobs crowd the host (before the host's measurement shows them) ahead of
        # another user's.
        self.probe_cores = probe_cores
        self.probes_elastic = probe_cores == PROBE_CORES

    def seen(self, key: str, cores: float) -> None:
        runs = [*self._runs.get(key, ()), cores][-KEEP_RUNS:]
        if self._write is not None:  # a write that fails leaves it unlearnt (the caller retries)
            self._write(key, runs)
        self._runs[key] = runs

    def seen_job(self, job: Job, cores: float) -> None:
        """A successful run of ``job`` used ``cores``: learnt for its key and its script's."""
        self.seen(job.learning_key, cores)
        script = script_key(job.command)
        if script is not None and script != job.learning_key:
            self.seen(script, cores)

    def runs(self, key: str) -> list[float]:
        return list(self._runs.get(key, ()))

    def reserve(
        self, job: Job, running: Mapping[str, tuple[float, int]] | None = None
    ) -> tuple[float, str, bool]:
        """What ``job`` reserves, where that comes from, and whether it is a probe.
        ``running``: what running jobs of each key were measured at (:func:`running_figures`),
        for a key with no run learnt yet."""
        if job.cpus != AUTO_CPUS:
            return job.cpus, "given", False
        key = job.learning_key
        runs = self._runs.get(key)
        if runs:
            n = len(runs)
            source = f"measured, job key {key_words(key)}, {n} run{'s' * (n != 1)}"
            return margin(max(runs)), source, False
        alike = (running or {}).get(key)
        if alike is not None:
            return alike[0], f"measured, job key {key_words(key)}, job {alike[1]} running", False
        script = script_key(job.command)
        runs = self._runs.get(script) if script is not None else None
        if runs:
            n = len(runs)
            source = f"measured, script {key_words(script or '')}, {n} run{'s' * (n != 1)}"
            return margin(max(runs)), source, False
        return self.probe_cores, "probe", True


class Running(Protocol):
    """A running attempt as these functions read it (:class:`tandem.place.active.Active`)."""

    job: Job
    cpu: Measuring | None


def running_figures(running: Iterable[Running]) -> dict[str, tuple[float, int]]:
    """Per learning key, the most cores a running job of ``--cpus auto`` reserves that is not
    a probe (measured this run, or started at such a figure), and which job: what a waiting
    job alike to it starts at."""
    out: dict[str, tuple[float, int]] = {}
    for r in running:
        if r.cpu is not None and r.cpu.auto and not r.cpu.probe:
            key = r.job.learning_key
            if key not in out or r.cpu.cores > out[key][0]:
                out[key] = (r.cpu.cores, r.job.id)
    return out


def producer_key(share: str) -> str:
    """The key under which a share's producer's use is learnt (beside the jobs' keys)."""
    return f"share:{share}"


def producer_reservation(defined: float, given: bool, learned: Learned, share: str) -> tuple[float, str]:
    """The cores a share's producer reserves and why: its definition's ``--cpus`` (``given``:
    a hard reservation), else what its earlier producers used (mean cores over a run, with
    the margin), never more than the definition gives it, else the definition's. Its loader
    workers always come from the definition: a learnt reservation never limits what it can
    use, so a producer that needs more is measured at more."""
    runs = learned.runs(producer_key(share))
    if given or not runs:
        return defined, "defined"
    n = len(runs)
    return min(defined, margin(max(runs))), f"measured, {n} producer run{'s' * (n != 1)}"


class Measuring:
    """One running attempt's reservation of cores and the samples behind it."""

    def __init__(
        self,
        job: Job,
        learned: Learned,
        running: Mapping[str, tuple[float, int]] | None = None,
        start: Reservation | None = None,
    ) -> None:
        # ``start``: the reservation decided already (tandem.place.decide.reserve), or recorded
        if start is not None:
            self.cores, self.source, self.probe = start.resources.cores, start.cores_why, start.probe
        else:
            self.cores, self.source, self.probe = learned.reserve(job, running)
        self.auto = job.cpus == AUTO_CPUS
        self.samples: list[float] = []
        self.starting = True
        self._startup_peak = 0.0
        self._startup_samples = 0

    def _still_starting(self, cores: float) -> bool:
        self._startup_peak = max(self._startup_peak, cores)
        self._startup_samples += 1
        self.starting = (
            cores > PROBE_CORES
            and cores >= 0.5 * self._startup_peak
            and self._startup_samples < STARTUP_MAX_SAMPLES
        )
        return self.starting

    def sample(self, cores: float) -> bool:
        """A sample after the first few; True when the reservation changed (to be written).
        Samples of a start-up burst are not measurements (see STARTUP_MAX_SAMPLES)."""
        if not self.auto or (self.starting and self._still_starting(cores)):
            return False
        self.samples.append(cores)
        if len(self.samples) < PROBE_SAMPLES:
            return False
        recent = self.samples[-FOLLOW_SAMPLES:]
        measured = margin(p95(recent))
        if self.probe:
            self.cores, self.source, self.probe = measured, "measured, this run", False
            return True
        # Up at once where it uses more than its key did before; down only once a whole
        # window says so (a figure lent or learnt is not dropped on a few quiet seconds).
        step = max(FOLLOW_STEP, FOLLOW_STEP * self.cores)
        down = len(recent) >= FOLLOW_SAMPLES and measured < self.cores - step
        if measured > self.cores + 0.05 or down:
            self.cores, self.source = measured, "measured, this run"
            return True
        return False

    def measured(self) -> float | None:
        """Its run's use of cores (95th percentile), where it has enough samples."""
        return p95(self.samples) if len(self.samples) >= PROBE_SAMPLES else None
