"""The job manager's stored records: a job (its request and what happened to it), each of
its attempts, and a defined share with its running producer. Plain data: the SQL that
reads and writes them is :mod:`tandem.place.state`'s alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.place.model import QUEUED, JobSpec
from tandem.share.spec import ShareSpec


@dataclass
class Attempt:
    job_id: int
    n: int
    state: str
    placement: dict[str, Any]
    started: float
    ended: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    cause: str | None = None
    cause_line: str | None = None
    shim_pid: int | None = None
    shim_ctime: float | None = None
    pid: int | None = None
    pid_ctime: float | None = None
    peak_mem: int | None = None
    peak_gpu_mem: int | None = None
    cpu_seconds: float | None = None
    mlflow_run_id: str | None = None


@dataclass
class Job(JobSpec):
    """A job as stored: its request (:class:`~tandem.place.model.JobSpec`, ``gpus`` resolved)
    and what happened to it."""

    id: int = 0
    job_key: str = ""
    state: str = QUEUED
    submitted: float = 0.0
    cause: str | None = None
    cause_line: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    started: float | None = None
    ended: float | None = None
    cancel_requested: bool = False
    queued_at: float | None = None  # when it last became able to start (submitted, requeued)
    escalation: int = 0
    peak_mem: int | None = None
    peak_gpu_mem: int | None = None
    energy_joules: float | None = None
    mlflow_run_id: str | None = None
    reason: str | None = None  # why it waits, as the daemon's last pass saw it
    updated: float | None = None  # when its row last changed (what a live view asks for)
    attempts: list[Attempt] = field(default_factory=list)


@dataclass
class Share:
    """A dataset defined with ``tandem share define`` (its :class:`ShareSpec`) and the
    producer now running for it, if any: pid, start time and the cores reserved for it."""

    name: str
    spec: ShareSpec
    defined: float
    pid: int | None = None
    ctime: float | None = None
    started: float | None = None
    cpus: float | None = None  # reserved by the running producer
    error: str | None = None  # how its last producer died, if it died
