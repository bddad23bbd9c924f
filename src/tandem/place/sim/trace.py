"""Job traces for the simulator (and a later live replay): read them, and model a sample.

A trace is a list of :class:`TraceJob`: when each job arrives (seconds after the first),
what it reserves, how long it runs alone and how much of a GPU it keeps busy alone. Three
sources:

- tandem's own CSV (:func:`read_trace`, :func:`write_trace`): one row per job, columns
  ``offset_s,name,command,cpus,mem,gpus,gpu_mem,duration_s,compute,kind`` and, optionally,
  ``priority``, ``peak_gpu_mem`` (the GPU memory the job really reaches, when it is not
  what it declares: an under-declared job, or an ``auto`` one) and ``gpu_share`` (its
  ``--gpu-share``, percent). ``cpus`` 0 is ``auto``, as for ``tandem submit``.
- Microsoft's Philly trace (:func:`read_philly`, msr-fiddle/philly-traces, CC-BY-4.0, not
  shipped): arrivals, run times and GPU counts; memory and compute are not in it and are
  drawn from the job mix below.
- Alibaba's GPU-sharing trace 2023 (:func:`read_alibaba`, alibaba/clusterdata
  ``cluster-trace-gpu-v2023``, not shipped): cores, RAM, GPUs, the GPU share each pod asked
  for and its times; GPU memory is modelled from the share.

The job mix (:data:`KINDS`) is a modelled assumption after the collocation research behind
tandem, not a measurement: 30% light (ResNet-26-like), 60% medium (ResNet-50-like), 10%
heavy (ResNet-152/DLRM-like). :func:`sample_trace` draws a trace from it; the shipped
``benchmarks/traces/sample-60.csv`` is ``sample_trace(60, seed=0)``.
"""

from __future__ import annotations

import csv
import json
import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from tandem.place.model import JobSpec, parse_size
from tandem.place.resources import Resources
from tandem.units import GiB, MiB, exact_size

COLUMNS = ("offset_s", "name", "command", "cpus", "mem", "gpus", "gpu_mem", "duration_s", "compute", "kind")
OPTIONAL_COLUMNS = ("priority", "peak_gpu_mem", "gpu_share")

# Philly: 117,325 jobs submitted between 2017-08-07 and 2017-12-22 (its README), one every
# ~101 s on average over the whole cluster. The sample's arrivals are exponential gaps with
# that mean: a modelled stand-in, not Philly's own arrival process.
PHILLY_MEAN_GAP_S = 100.0


@dataclass(frozen=True)
class Kind:
    """One class of the modelled job mix: its share and the uniform ranges a job of it is
    drawn from (GPU memory in GiB, compute as the fraction of a GPU's SMs it keeps busy
    alone, run time alone in seconds), and the cores and RAM it reserves a GPU."""

    name: str
    share: float
    gpu_mem_gib: tuple[float, float]
    compute: tuple[float, float]
    duration_s: tuple[float, float]
    reserves: Resources

    def typical_gpu_mem(self) -> int:
        """The middle of the memory range: what an ``auto`` job of this kind is taken to
        reach when its trace does not say."""
        return int(sum(self.gpu_mem_gib) / 2 * GiB)


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("light", 0.30, (2.0, 4.0), (0.25, 0.35), (300.0, 600.0), reserves=Resources(2.0, 8 * GiB)),
        Kind("medium", 0.60, (6.0, 10.0), (0.50, 0.65), (600.0, 1800.0), reserves=Resources(4.0, 16 * GiB)),
        Kind("heavy", 0.10, (20.0, 30.0), (0.85, 0.95), (1800.0, 3600.0), reserves=Resources(8.0, 32 * GiB)),
    )
}


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: when it arrives (``offset_s``, seconds after the first), what is
    submitted (``spec``: its command, name and request, the one record ``tandem submit``
    makes: ``cpus`` 0 and ``gpu_mem`` None are ``auto``, sizes are bytes, GPU memory per
    GPU), and how it behaves: ``duration_s`` its run time alone, ``compute`` the fraction of
    a GPU's SMs it keeps busy alone (for a CPU-only job, the fraction of each of its cores),
    ``peak_gpu_mem`` what it really reaches per GPU when that is not what it asks for."""

    offset_s: float
    spec: JobSpec
    duration_s: float
    compute: float
    kind: str = ""
    peak_gpu_mem: int | None = None

    @property
    def name(self) -> str:
        return self.spec.name or ""

    @property
    def gpus(self) -> int:
        return self.spec.gpus or 0

    @property
    def cores_used(self) -> float:
        """The cores it keeps busy, as the daemon's sampler would measure them: a CPU-only
        job ``compute`` of each core it asks for (of its kind's cores where it asks for
        ``auto``, 0); a GPU job's own CPU use (data loading) is not modelled."""
        if self.gpus:
            return 0.0
        cores = self.spec.cpus or (KINDS[self.kind].reserves.cores if self.kind in KINDS else 1.0)
        return cores * self.compute

    @property
    def true_gpu_mem(self) -> int:
        """The GPU memory the job really reaches, per GPU: its ``peak_gpu_mem``, else what
        it declares, else (``auto`` with no peak given) the typical size of its kind."""
        if self.peak_gpu_mem is not None:
            return self.peak_gpu_mem
        if self.spec.gpu_mem is not None:
            return self.spec.gpu_mem
        return KINDS.get(self.kind, KINDS["medium"]).typical_gpu_mem()


def trace_job(
    offset_s: float,
    name: str,
    command: str,
    cpus: float,
    mem: int,
    gpus: int,
    gpu_mem: int | None,
    duration_s: float,
    compute: float,
    kind: str = "",
    priority: int = 0,
    peak_gpu_mem: int | None = None,
    gpu_share: int | None = None,
) -> TraceJob:
    """A trace's job from its CSV columns, in their order (:data:`COLUMNS`, then
    :data:`OPTIONAL_COLUMNS`): the command as one shell line, ``cpus`` 0 for ``auto``."""
    spec = JobSpec(
        shlex.split(command),
        name=name or None,
        cpus=cpus,
        mem=mem,
        gpus=gpus,
        gpu_mem=gpu_mem,
        gpu_share=gpu_share,
        priority=priority,
    )
    return TraceJob(offset_s, spec, duration_s, compute, kind, peak_gpu_mem)


# --- tandem's CSV ---------------------------------------------------------------------------------


def read_trace(path: str | Path) -> list[TraceJob]:
    """The jobs of a tandem trace CSV, in file order. ValueError naming the line and column
    of the first bad value (missing columns, a bad size, a negative offset...)."""
    path = Path(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(
                f"{path}: missing column(s) {', '.join(missing)}; a trace has the columns "
                f"{','.join(COLUMNS)} (and optionally {','.join(OPTIONAL_COLUMNS)})"
            )
        jobs = []
        for row in reader:
            if None in row:  # more fields than the header names
                raise ValueError(f"{path}, line {reader.line_num}: more fields than the header has columns")
            jobs.append(_row(row, f"{path}, line {reader.line_num}"))
    return jobs


def _row(row: dict[str, Any], where: str) -> TraceJob:
    def field(col: str, parse: Any, *, empty: Any = ...) -> Any:
        text = (row.get(col) or "").strip()
        if not text:
            if empty is not ...:
                return empty
            raise ValueError(f"{where}, column {col!r}: empty")
        try:
            return parse(text)
        except ValueError as exc:
            raise ValueError(f"{where}, column {col!r}: {exc}") from None

    def number(low: float, high: float = math.inf, integer: bool = False) -> Any:
        def parse(text: str) -> float | int:
            try:
                value: float | int = int(text) if integer else float(text)
            except ValueError:
                raise ValueError(f"{text!r} is not {'an integer' if integer else 'a number'}") from None
            if not (low <= value <= high):
                bounds = f"at least {low:g}" if high == math.inf else f"between {low:g} and {high:g}"
                raise ValueError(f"{text!r} must be {bounds}")
            return value

        return parse

    def size(text: str) -> int | None:
        return None if text.lower() == "auto" else parse_size(text)

    gpus = field("gpus", number(0, integer=True))
    gpu_mem = field("gpu_mem", size) if gpus else None  # a CPU-only job's gpu_mem means nothing
    mem = field("mem", parse_size)
    duration = field("duration_s", number(0))
    if duration <= 0:
        raise ValueError(f"{where}, column 'duration_s': the run time must be above 0")
    return trace_job(
        offset_s=field("offset_s", number(0)),
        name=(row.get("name") or "").strip(),
        command=(row.get("command") or "").strip(),
        cpus=field("cpus", number(0)),
        mem=mem,
        gpus=gpus,
        gpu_mem=gpu_mem,
        duration_s=duration,
        compute=field("compute", number(0, 1)),
        kind=(row.get("kind") or "").strip(),
        priority=field("priority", number(-math.inf, integer=True), empty=0),
        peak_gpu_mem=field("peak_gpu_mem", parse_size, empty=None),
        gpu_share=field("gpu_share", number(1, 100, integer=True), empty=None),
    )


def write_trace(jobs: Iterable[TraceJob], path: str | Path) -> None:
    """Write ``jobs`` as a tandem trace CSV (:func:`read_trace` reads it back unchanged)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMNS + OPTIONAL_COLUMNS)
        for j in jobs:
            writer.writerow(
                [
                    _num(j.offset_s),
                    j.name,
                    shlex.join(j.spec.command),
                    _num(j.spec.cpus),
                    exact_size(j.spec.mem),
                    j.gpus,
                    "auto" if j.spec.gpu_mem is None else exact_size(j.spec.gpu_mem),
                    _num(j.duration_s),
                    _num(j.compute),
                    j.kind,
                    j.spec.priority,
                    "" if j.peak_gpu_mem is None else exact_size(j.peak_gpu_mem),
                    "" if j.spec.gpu_share is None else j.spec.gpu_share,
                ]
            )


def _num(x: float) -> str:
    # Shortest text that reads back as the same float (``:g`` would round to 6 digits).
    return str(int(x)) if float(x).is_integer() else repr(float(x))


# --- the modelled mix -----------------------------------------------------------------------------


def _draw(kind: Kind, rng: np.random.Generator) -> dict[str, Any]:
    """Memory, compute, run time and reservations of one job of ``kind``. GPU and host
    memory are whole MiB, so that the CSV holds them exactly."""
    gpu_mem = int(rng.uniform(*kind.gpu_mem_gib) * 1024) * MiB
    return {
        "gpu_mem": gpu_mem,
        "compute": round(float(rng.uniform(*kind.compute)), 3),
        "duration_s": float(round(rng.uniform(*kind.duration_s))),
        "cpus": kind.reserves.cores,
        "mem": kind.reserves.ram,
        "kind": kind.name,
    }


def _kinds_for(n: int, rng: np.random.Generator) -> list[Kind]:
    # The mix exactly (largest remainders), shuffled: a small sample keeps its 30/60/10.
    shares = [(k, k.share * n) for k in KINDS.values()]
    counts = {k.name: int(s) for k, s in shares}
    by_remainder = sorted(shares, key=lambda ks: ks[1] - int(ks[1]), reverse=True)
    for k, _ in by_remainder[: n - sum(counts.values())]:
        counts[k.name] += 1
    kinds = [KINDS[name] for name, c in counts.items() for _ in range(c)]
    rng.shuffle(kinds)  # type: ignore[arg-type]
    return kinds


def sample_trace(n: int = 60, seed: int = 0, mean_gap_s: float = PHILLY_MEAN_GAP_S) -> list[TraceJob]:
    """``n`` single-GPU jobs drawn from the modelled mix (:data:`KINDS`, shares kept
    exactly), arriving with exponential gaps of mean ``mean_gap_s`` (the first at 0).
    Commands are empty: a trace to simulate, not to run."""
    rng = np.random.default_rng(seed)
    kinds = _kinds_for(n, rng)
    gaps = rng.exponential(mean_gap_s, size=n)
    offset = 0.0
    jobs = []
    for i, kind in enumerate(kinds):
        if i:
            offset += round(float(gaps[i]), 1)
        drawn = _draw(kind, rng)
        jobs.append(
            trace_job(offset_s=round(offset, 1), name=f"{kind.name}-{i:03d}", command="", gpus=1, **drawn)
        )
    return jobs


# --- Philly ---------------------------------------------------------------------------------------


def _philly_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S")
    except ValueError:  # "None" and other logging errors the trace's README warns of
        return None


def read_philly(path: str | Path, limit: int | None = None, seed: int = 0) -> list[TraceJob]:
    """Jobs of Philly's ``cluster_job_log`` (a JSON list), in submission order: the offset
    from the first submission, the run time of the last attempt (start to end), and the
    number of GPUs in its detail. Jobs with no attempt, no GPU or an unreadable time are
    skipped. Philly records neither memory nor compute: each job draws a kind from the
    modelled mix (:data:`KINDS`, seeded) and takes its memory, compute and reservations from
    it. ``limit``: the first that many usable jobs."""
    with open(path) as f:
        entries = json.load(f)
    if not isinstance(entries, list):
        raise ValueError(f"{path}: not a Philly cluster_job_log (a JSON list of jobs)")
    usable: list[tuple[datetime, float, int, str]] = []
    for entry in entries:
        submitted = _philly_time(entry.get("submitted_time"))
        attempts = entry.get("attempts") or []
        if submitted is None or not attempts:
            continue
        last = attempts[-1]
        start, end = _philly_time(last.get("start_time")), _philly_time(last.get("end_time"))
        gpus = sum(len(d.get("gpus") or []) for d in last.get("detail") or [])
        if start is None or end is None or end <= start or gpus == 0:
            continue
        usable.append((submitted, (end - start).total_seconds(), gpus, str(entry.get("jobid", ""))))
    usable.sort(key=lambda u: u[0])
    if limit is not None:
        usable = usable[:limit]
    if not usable:
        return []
    rng = np.random.default_rng(seed)
    kinds = list(KINDS.values())
    first = usable[0][0]
    jobs = []
    for submitted, duration, gpus, jobid in usable:
        kind = kinds[rng.choice(len(kinds), p=[k.share for k in kinds])]
        drawn = _draw(kind, rng)
        drawn.update(duration_s=duration, cpus=kind.reserves.cores * gpus, mem=drawn["mem"] * gpus)
        offset = (submitted - first).total_seconds()
        jobs.append(trace_job(offset_s=offset, name=jobid, command="", gpus=gpus, **drawn))
    return jobs


# --- Alibaba GPU-sharing trace 2023 ---------------------------------------------------------------

ALIBABA_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
# The cluster's largest GPUs are 32 GB V100s; a pod asking for gpu_milli/1000 of a GPU is
# taken to use that share of such a GPU's memory (at least 1 GiB). A modelled assumption:
# the trace records the share asked for, not the memory used.
ALIBABA_GPU_MEM = 32 * GiB


def kind_of(compute: float) -> str:
    """The mix's kind a job of this compute fraction resembles (for traces without one)."""
    return "light" if compute < 0.45 else "medium" if compute < 0.8 else "heavy"


def read_alibaba(
    path: str | Path, limit: int | None = None, gpu_mem_per_gpu: int = ALIBABA_GPU_MEM
) -> list[TraceJob]:
    """Pods of Alibaba's ``openb_pod_list_*.csv``, in creation order: cores from
    ``cpu_milli``, RAM from ``memory_mib``, GPUs from ``num_gpu``, compute from ``gpu_milli``
    (a CPU-only pod keeps its cores busy: compute 1), run time from scheduled to deleted,
    and GPU memory as the same share of ``gpu_mem_per_gpu``. Pods never scheduled (no
    ``scheduled_time``) or without a deletion time are skipped. ``limit``: the first that
    many usable pods."""
    path = Path(path)
    rows: list[tuple[float, TraceJob]] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ALIBABA_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} of an Alibaba openb_pod_list")
        for row in reader:
            where = f"{path}, line {reader.line_num}"
            if not (row["scheduled_time"] or "").strip() or not (row["deletion_time"] or "").strip():
                continue
            try:
                values = {c: float(row[c]) for c in ALIBABA_COLUMNS[1:5] + ALIBABA_COLUMNS[8:]}
            except ValueError:
                bad = next(c for c in ALIBABA_COLUMNS[1:5] + ALIBABA_COLUMNS[8:] if not _is_number(row[c]))
                raise ValueError(f"{where}, column {bad!r}: {row[bad]!r} is not a number") from None
            duration = values["deletion_time"] - values["scheduled_time"]
            if duration <= 0:
                continue
            gpus = int(values["num_gpu"])
            compute = min(1.0, values["gpu_milli"] / 1000) if gpus else 1.0
            gpu_mem = max(GiB, int(gpu_mem_per_gpu * compute)) if gpus else None
            job = trace_job(
                offset_s=values["creation_time"],  # made relative below
                name=row["name"],
                command="",
                cpus=values["cpu_milli"] / 1000,
                mem=int(values["memory_mib"]) * MiB,
                gpus=gpus,
                gpu_mem=gpu_mem,
                duration_s=duration,
                compute=compute,
                kind=kind_of(compute) if gpus else "cpu",
            )
            rows.append((values["creation_time"], job))
    rows.sort(key=lambda r: r[0])
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        return []
    first = rows[0][0]
    return [_shifted(job, created - first) for created, job in rows]


def _is_number(text: Any) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def _shifted(job: TraceJob, offset: float) -> TraceJob:
    return replace(job, offset_s=offset)


def command_args(job: TraceJob) -> list[str]:
    """The job's command line as arguments (empty for a simulate-only trace)."""
    return list(job.spec.command)
