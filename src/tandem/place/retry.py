"""How an out-of-memory ending is retried: pure, the same for the daemon and the simulator.

An attempt that ran out of GPU or host memory is retried while ``retries`` last, each time
escalated: first onto the GPU with the most free memory, then alone (on a GPU, or on the
host for a host OOM), reserving what was measured plus a margin, capped at what the machine
has so that the retry can still be placed. Every other ending is final.
"""

from __future__ import annotations

from dataclasses import dataclass

OOM_KINDS = ("gpu_oom", "host_oom")
HOST_MEM_GROWTH = 1.2  # a host OOM retry reserves its measured peak plus this much


@dataclass(frozen=True)
class Retry:
    """The retried job's new request."""

    escalation: int  # 1: the GPU with most free memory; 2: alone
    gpu_mem: int | None  # per GPU
    mem: int  # host RAM


def retry(
    kind: str,
    attempt: int,
    retries: int,
    escalation: int,
    gpu_mem: int | None,
    mem: int,
    peak_gpu_mem: int | None,
    peak_mem: int | None,
    margin: float,
    largest_gpu: int | None = None,
    usable_mem: int | None = None,
) -> Retry | None:
    """The retry of attempt ``attempt`` (1-based) that ended ``kind``, or None when it is
    final (not an out-of-memory ending, or its retries are spent)."""
    if kind not in OOM_KINDS or attempt > retries:
        return None
    new_gpu_mem = gpu_mem
    if kind == "gpu_oom" and peak_gpu_mem:
        wanted = max(gpu_mem or 0, int(peak_gpu_mem * (1 + margin)))
        new_gpu_mem = min(largest_gpu, wanted) if largest_gpu else wanted
    new_mem = mem
    if kind == "host_oom" and peak_mem:
        wanted_mem = max(mem, int(peak_mem * HOST_MEM_GROWTH))
        new_mem = min(usable_mem, wanted_mem) if usable_mem else wanted_mem
    return Retry(min(2, escalation + 1), new_gpu_mem, new_mem)
