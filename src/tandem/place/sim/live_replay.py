"""Replaying a trace through a real daemon: each job submitted at its offset, run, measured.

:func:`replay_live` starts a daemon with the policy in a fresh state directory, submits the
trace's commands at their offsets, waits for every job to end, samples the host's CPU use
meanwhile, stops the daemon and returns the same aggregate figures as the simulator
(:data:`tandem.place.sim.simulate.AGGREGATE_KEYS`), so both are reported alike
(:mod:`tandem.place.sim.replay`). Slowdown is a job's run time (its last attempt) against its
time alone: the trace's ``duration_s``, which a benchmark measures in the same run.
Energy is estimated from the jobs' CPU-seconds (``watch``'s watts per core), and labelled so.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from tandem.place import protocol
from tandem.place.client import request, start_daemon, submit
from tandem.place.config import DaemonConfig
from tandem.place.model import FINAL_STATES
from tandem.place.sim.trace import TraceJob
from tandem.place.state import StateReader, private_dir
from tandem.place.views import job_json


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class _CpuSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.values: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        psutil.cpu_percent()
        while not self.stop.wait(1.0):
            self.values.append(psutil.cpu_percent() / 100.0)


def replay_live(
    trace: list[TraceJob],
    workdir: Path,
    config: DaemonConfig,
    env: dict[str, str] | None = None,
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run ``trace`` through a daemon with ``config`` (in ``workdir/<policy>``); the
    aggregates plus ``jobs`` (each job's JSON)."""
    from tandem.watch.samplers.energy import watts_per_core

    policy = config.policy
    state_dir = private_dir((workdir / policy / "state").resolve())
    env = dict(os.environ if env is None else env, TANDEM_STATE_DIR=str(state_dir))
    config.save(state_dir)
    start_daemon(state_dir, env=env)
    cpu = _CpuSampler()
    cpu.start()
    t0 = time.time()
    ids: dict[int, TraceJob] = {}
    try:
        for job in sorted(trace, key=lambda j: j.offset_s):
            delay = t0 + job.offset_s - time.time()
            if delay > 0:
                time.sleep(delay)
            spec = replace(job.spec, gpus=job.gpus, env=env, cwd=str(workdir))
            ids[submit(state_dir, spec).id] = job
        state = StateReader(state_dir)
        deadline = time.monotonic() + timeout
        while True:
            jobs = [state.job(i) for i in ids]
            if all(j is not None and j.state in FINAL_STATES for j in jobs):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{policy}: jobs still running after {timeout:g} s")
            time.sleep(0.5)
    finally:
        cpu.stop.set()
        try:
            request(state_dir, protocol.Stop())
        except Exception:
            pass
    rows = [job_json(j) for j in jobs if j is not None]
    jct, waits, slow = [], [], []
    for row in rows:
        jct.append(row["ended"] - row["submitted"])
        waits.append(row["wait_s"])
        last = row["attempts"][-1]
        alone = ids[row["id"]].duration_s
        row["slowdown"] = (last["ended"] - last["started"]) / alone if alone else None
        if row["slowdown"] is not None and row["state"] == "succeeded":
            slow.append(row["slowdown"])
    cpu_seconds = sum(a["cpu_seconds"] or 0.0 for r in rows for a in r["attempts"])
    makespan = max(r["ended"] for r in rows) - t0 if rows else 0.0
    return {
        "jobs": len(rows),
        "succeeded": sum(r["state"] == "succeeded" for r in rows),
        "failed": sum(r["state"] != "succeeded" for r in rows),
        "makespan_s": makespan,
        "jct_mean_s": statistics.fmean(jct) if jct else None,
        "jct_p50_s": _percentile(jct, 0.5),
        "jct_p95_s": _percentile(jct, 0.95),
        "wait_mean_s": statistics.fmean(waits) if waits else None,
        "slowdown_mean": statistics.fmean(slow) if slow else None,
        "slowdown_max": max(slow) if slow else None,
        "cpu_util": statistics.fmean(cpu.values) if cpu.values else None,
        "cpu_seconds": cpu_seconds,
        "energy_kwh_estimated": cpu_seconds * watts_per_core() / 3.6e6,
        "oom_crashes": sum(a["state"] == "oom" for r in rows for a in r["attempts"]),
        "retries": sum(len(r["attempts"]) - 1 for r in rows),
        "job_rows": rows,
    }
