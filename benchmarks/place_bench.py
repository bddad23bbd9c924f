"""Job manager benchmark: ``exclusive`` FIFO against ``packing`` on this machine, measured.

A trace of 16 real small trainings (``tandem.bench.place_job``) arriving one a second:

- 9 ``wait`` jobs: a tiny CNN that mostly waits on a (simulated) accelerator; declare 0.25 cores;
- 4 ``cpu`` jobs: a small ResNet training on one core; declare 1 core;
- 2 over-declared ``wait`` jobs: declare 1 core, use a fraction of one;
- 1 ``wait`` job that runs out of (GPU) memory once: prints PyTorch's CUDA OOM error and
  exits 1 on its first attempt; the manager must classify it, retry it, and it succeeds.

Each kind's time alone is measured first, in the same run, so slowdowns are ratios taken
on the same machine at the same time. Then the trace is replayed through a real daemon
under each policy (``tandem.place.sim.live_replay``), and simulated (``tandem.place.sim.simulate``, the
same scheduler code) on a 2-core model of this machine with the measured durations, to
check that the simulator orders the policies as the real replay does. Last, the shipped
60-job sample trace is simulated on 3 GPUs under all five policies.

    python benchmarks/place_bench.py [--quick] [--out benchmarks/results]

Writes ``place_bench.json`` and ``place_bench.md`` (and the plots) to ``--out``.
Targets (issue 9): packing makespan <= 0.6x exclusive, no job slowed more than 1.5x
against running alone, no unhandled failure; the simulator's ordering matches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tandem.place.config import DaemonConfig
from tandem.place.sim.live_replay import replay_live
from tandem.place.sim.replay import compare, run_simulations, write_report
from tandem.place.sim.trace import TraceJob, read_trace, trace_job

ROOT = Path(__file__).resolve().parent
JOB = [sys.executable, "-m", "tandem.bench.place_job"]
MiB = 1 << 20


def kinds(quick: bool) -> dict[str, list[str]]:
    wait_steps, cpu_steps = (30, 150) if quick else (90, 700)
    return {
        "wait": ["--kind", "wait", "--steps", str(wait_steps)],
        "cpu": ["--kind", "cpu", "--steps", str(cpu_steps)],
    }


def time_alone(args: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU-seconds of one job run alone."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([*JOB, *args], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def build_trace(quick: bool, workdir: Path) -> list[TraceJob]:
    args = kinds(quick)
    alone: dict[str, float] = {}
    share: dict[str, float] = {}
    for kind, a in args.items():
        wall, cpu_s = time_alone(a)
        alone[kind] = wall
        share[kind] = min(1.0, cpu_s / wall)
        print(f"alone: {kind} {wall:.1f} s, {share[kind]:.2f} cores busy", file=sys.stderr)
    plan = ["wait"] * 9 + ["cpu"] * 4 + ["over"] * 2 + ["oom"]
    order = [0, 9, 1, 2, 13, 10, 3, 4, 14, 11, 5, 15, 6, 12, 7, 8]  # kinds interleaved, fixed
    jobs = []
    for slot, i in enumerate(order):
        kind = plan[i]
        base = "cpu" if kind == "cpu" else "wait"
        cmd = [*JOB, *args[base]]
        if kind == "oom":
            cmd += ["--oom-once", str(workdir / "oom-marker-{policy}")]
        cpus = {"wait": 0.25, "cpu": 1.0, "over": 1.0, "oom": 0.25}[kind]
        jobs.append(
            trace_job(
                offset_s=float(slot),
                name=f"{kind}-{slot:02d}",
                command=shlex.join(cmd),
                cpus=cpus,
                mem=400 * MiB,
                gpus=0,
                gpu_mem=None,
                duration_s=alone[base],
                compute=share[base] / cpus if cpus else 1.0,
                kind=kind,
            )
        )
    return jobs


def with_policy(jobs: list[TraceJob], policy: str) -> list[TraceJob]:
    import dataclasses

    return [
        dataclasses.replace(
            j,
            spec=dataclasses.replace(j.spec, command=[a.replace("{policy}", policy) for a in j.spec.command]),
        )
        for j in jobs
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shorter jobs (a smoke run)")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="place-bench-"))
    os.environ.setdefault("TANDEM_RUNTIME_DIR", tempfile.mkdtemp(prefix="tpb-"))
    jobs = build_trace(args.quick, work)
    # The daemon's defaults, as a user gets them (only the policy differs).
    live = {}
    for policy in ("exclusive", "packing"):
        print(f"replaying {len(jobs)} jobs under {policy} ...", file=sys.stderr)
        live[policy] = replay_live(with_policy(jobs, policy), work, DaemonConfig(policy=policy))
    from rich.console import Console

    console = Console(width=200)
    console.print(compare(live, title="16 real jobs on this machine (measured)"))
    # The same trace, simulated on a model of this machine (2 cores, no GPU), same scheduler.
    from tandem.place.policies import Limits

    limits = Limits()
    sim = run_simulations(
        jobs,
        ["exclusive", "packing"],
        gpus=0,
        cpus=psutil.cpu_count(),
        mem=psutil.virtual_memory().total,
        limits=limits,
    )
    console.print(compare(sim, title="the same trace, simulated"))
    sample = read_trace(ROOT / "traces" / "sample-60.csv")
    sample_sim = run_simulations(sample, None, gpus=3)
    console.print(compare(sample_sim, title="sample-60 on 3 GPUs (simulated)"))

    ex, pk = live["exclusive"], live["packing"]
    checks = {
        "makespan_ratio": pk["makespan_s"] / ex["makespan_s"],
        "makespan_ratio_target": 0.6,
        "max_slowdown_packing": pk["slowdown_max"],
        "max_slowdown_target": 1.5,
        "unhandled_failures": ex["failed"] + pk["failed"],
        "oom_retried": {p: live[p]["oom_crashes"] for p in live},
        "simulated_order_matches": (
            sim["packing"].aggregates()["makespan_s"] < sim["exclusive"].aggregates()["makespan_s"]
        )
        == (pk["makespan_s"] < ex["makespan_s"]),
    }
    print(json.dumps(checks, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(live, args.out, "place_bench_live")
    write_report(sample_sim, args.out, "place_bench_sample60")
    payload = {
        "command": "python benchmarks/place_bench.py" + (" --quick" if args.quick else ""),
        "machine": {
            "cores": psutil.cpu_count(),
            "logical": psutil.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "trace": [j.__dict__ for j in jobs],
        "live": {p: {k: v for k, v in r.items() if k != "job_rows"} for p, r in live.items()},
        "live_jobs": {
            p: [
                {k: row[k] for k in ("id", "name", "state", "wait_s", "run_s", "slowdown")}
                | {"attempts": len(row["attempts"])}
                for row in r["job_rows"]
            ]
            for p, r in live.items()
        },
        "simulated_same_trace": {p: r.aggregates() for p, r in sim.items()},
        "simulated_sample60_3gpus": {p: r.aggregates() for p, r in sample_sim.items()},
        "checks": checks,
    }
    (args.out / "place_bench.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {args.out / 'place_bench.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
