"""The simulator's models and what it reports: how collocated jobs slow each other, the GPU
power estimate, and the per-job and aggregate results (:class:`SimResult`), which the live
replay reports alike (:data:`AGGREGATE_KEYS`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tandem.place.model import OOM, SUCCEEDED

REFUSED = "refused"  # never fits this machine (the daemon refuses it at submission)
UNPLACED = "unplaced"  # still waiting when nothing else could happen (no placement would ever come)

# Estimated power of an H100-class GPU: ~100 W idle, 700 W at full SM activity (the SXM
# part's TDP), linear in between. An estimate for comparing policies, not a measurement.
GPU_IDLE_W = 100.0
GPU_MAX_W = 700.0


@dataclass(frozen=True)
class SlowdownModel:
    """How collocated jobs slow each other down. A job on a GPU progresses at ``1 /
    slowdown`` of its speed alone, with, over the jobs on that GPU,

        slowdown = max(1, sum of compute) ** alpha * (1 + beta * (n_jobs - 1))

    A job on several GPUs goes at the pace of its slowest GPU. While the jobs together
    ask for less than the whole GPU they share it almost free, paying only ``beta`` per
    extra job (context switches, cache and memory-bandwidth contention): two light jobs
    (0.3 each) co-run at 1.05. Past the whole GPU they slow about in proportion to the
    oversubscription: a heavy job (0.9) with anything of 0.3 runs at 1.2 * 1.05. This is
    the shape the collocation research reports; ``alpha`` (1.0) and ``beta`` (0.05) are
    assumptions to override, not fitted constants. CPU-only jobs slow only when the host's
    cores are oversubscribed: ``max(1, busy cores / cores) ** alpha``.

    ``oom_after_s``: how long after its start a job that does not fit in its GPU's memory
    crashes (it allocates as it builds its model and first batches)."""

    alpha: float = 1.0
    beta: float = 0.05
    oom_after_s: float = 10.0

    def gpu(self, compute: float, n_jobs: int) -> float:
        if n_jobs <= 0:
            return 1.0
        return max(1.0, compute) ** self.alpha * (1.0 + self.beta * (n_jobs - 1))

    def host(self, busy_cores: float, cores: float) -> float:
        return max(1.0, busy_cores / cores) ** self.alpha if cores > 0 else 1.0


@dataclass
class JobResult:
    """One job as the simulation ended it. Times are seconds from the first submission.
    ``wait_s``: time spent queued (all attempts); ``jct_s``: submission to end; ``slowdown``:
    the last attempt's run time over the run time alone."""

    id: int
    name: str
    kind: str
    state: str
    submit: float
    start: float | None
    end: float | None
    wait_s: float | None
    jct_s: float | None
    run_s: float | None
    slowdown: float | None
    attempts: int
    gpus: list[int] = field(default_factory=list)  # of the last attempt


AGGREGATE_KEYS = (
    "jobs",
    "succeeded",
    "failed",
    "refused",
    "unplaced",
    "makespan_s",
    "jct_mean_s",
    "jct_p50_s",
    "jct_p95_s",
    "wait_mean_s",
    "slowdown_mean",
    "slowdown_max",
    "gpu_util",
    "sm_activity_mean",
    "energy_kwh_estimated",
    "oom_crashes",
    "retries",
)


@dataclass
class SimResult:
    """What a simulation gives: each job, and the aggregates (:data:`AGGREGATE_KEYS`).

    ``makespan_s``: first submission to last end. JCT, wait and slowdown figures are over
    the jobs that succeeded. ``gpu_util``: GPU-seconds with at least one job over ``gpus *
    makespan``. ``sm_activity_mean``: the modelled SM activity, averaged over GPUs and the
    makespan. ``energy_kwh_estimated``: ``GPU_IDLE_W + (GPU_MAX_W - GPU_IDLE_W) * activity``
    per GPU over the makespan, an estimate. ``oom_crashes``: attempts ended by GPU OOM;
    ``retries``: those retried."""

    policy: str
    machine: dict[str, Any]
    limits: dict[str, Any]
    model: dict[str, Any]
    jobs: list[JobResult]
    makespan_s: float
    jct_mean_s: float
    jct_p50_s: float
    jct_p95_s: float
    wait_mean_s: float
    slowdown_mean: float
    slowdown_max: float
    gpu_util: float
    sm_activity_mean: float
    energy_kwh_estimated: float
    oom_crashes: int
    retries: int
    wall_s: float = 0.0  # how long the simulation itself took

    def count(self, state: str) -> int:
        return sum(1 for j in self.jobs if j.state == state)

    def aggregates(self) -> dict[str, Any]:
        counts = {
            "jobs": len(self.jobs),
            "succeeded": self.count(SUCCEEDED),
            "failed": self.count(OOM),
            "refused": self.count(REFUSED),
            "unplaced": self.count(UNPLACED),
        }
        return {k: counts[k] if k in counts else getattr(self, k) for k in AGGREGATE_KEYS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "machine": self.machine,
            "limits": self.limits,
            "model": self.model,
            "power_w_estimated": {"gpu_idle": GPU_IDLE_W, "gpu_max": GPU_MAX_W},
            "aggregates": self.aggregates(),
            "wall_s": self.wall_s,
            "jobs": [asdict(j) for j in self.jobs],
        }
