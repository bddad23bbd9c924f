"""How many compute threads a job's libraries start: the job's share of the host's cores.

torch, numpy's BLAS and OpenMP start one thread per core they see, each process on its own:
three jobs on two cores then run six busy threads that spin and preempt each other (measured
on this project's 2-core machine: three CPU-bound jobs sharing one producer took 1.3-1.55x
the wall time of private loaders with torch's default threads, 0.84x with one thread each).
A job manager that places several jobs on one host knows what each may use, so it says so
as Ray does for its tasks (``OMP_NUM_THREADS`` set to the task's CPUs, at least 1) and
torchrun for its ranks: a job started by the daemon gets the thread variables below, unless
its own environment (as submitted) already sets any of them, which always wins.

- ``--cpus N`` given: ``ceil(N)`` threads (what it reserved).
- ``--cpus auto``: the host's cores divided among the jobs running on it once the jobs of
  its scheduling pass have started (itself included), rounded down, at least 1: one job
  alone on 16 cores gets 16; the eight points of a sweep on 2 cores get 1 each, the first
  placed as well as the last (measured: three CPU-bound jobs started in one pass, the one
  given 2 threads used 13.5 CPU-s where the others used 8.6). A job on a share counts its
  producer as one more job on the host (the daemon adds it): it decodes beside the job, and
  the first job of a share submitted alone on 2 cores got 2 threads, used 10.7 CPU-s where
  the two that followed used 6.9 and ended 5 s after them.

Pure: the daemon calls it as it starts an attempt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tandem.place.model import THREAD_VARS  # what it sets


def thread_count(given_cpus: float | None, host_cpus: float, jobs_on_host: int) -> int:
    """Threads for a job that reserved ``given_cpus`` (None: auto) on a host of ``host_cpus``
    cores where ``jobs_on_host`` jobs run once its pass's jobs start (itself included)."""
    if given_cpus:
        return max(1, math.ceil(given_cpus - 1e-9))
    return max(1, int(host_cpus // max(1, jobs_on_host)))


def thread_env(
    job_env: Mapping[str, str], given_cpus: float | None, host_cpus: float, jobs_on_host: int
) -> dict[str, str]:
    """The thread variables to add to a job's environment: none where its own environment
    sets any of them (the user's choice), else each of :data:`THREAD_VARS`."""
    if any(v in job_env for v in THREAD_VARS):
        return {}
    n = str(thread_count(given_cpus, host_cpus, jobs_on_host))
    return dict.fromkeys(THREAD_VARS, n)
