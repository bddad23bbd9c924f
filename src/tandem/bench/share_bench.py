"""Benchmark: N training jobs on one image folder, private DataLoaders vs tandem vs TensorSocket.

Every job reads the same generated JPEG folder (decode, resize, random crop, flip, normalise)
for a fixed number of epochs, then does one *step* per batch:

``sleep``  a simulated accelerator: a fixed sleep per batch (the GPU works, the CPU is free);
``cnn``    real CPU training of a small CNN (one torch thread per job).

Modes: ``private`` (each job its own DataLoader), ``tandem`` (one producer process, N
consumers), ``tensorsocket`` (its producer and consumers, when the package is installed).
Measured for each run: aggregate and per-job samples/s, CPU-seconds per 1,000 samples over
every process of the run (the runner's waited-for children: jobs, producers, loader workers),
each job's data-stall time (time blocked waiting for a batch), and peak memory (the largest
sum of PSS over all processes of the run, so shared pages are not counted twice).

A separate hand-off measurement times ``next()`` on a consumer whose producer is ahead, for
batches of 1 MB, 38.5 MB (64x3x224x224 float32) and 100 MB (:mod:`tandem.bench.handoff`).
The job processes themselves are :mod:`tandem.bench._share_jobs`; this module runs them,
measures them and writes the results.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from tandem.bench._share_jobs import (
    JobSpec,
    ShareBenchConfig,
    private_job,
    tandem_job,
    tandem_producer,
    tensorsocket_job,
    tensorsocket_producer,
)
from tandem.bench.handoff import SHAPES as HANDOFF_SHAPES
from tandem.bench.handoff import measure as measure_handoff
from tandem.bench.harness import (
    Every,
    JobProcesses,
    JobResult,
    free_ports,
    tensorsocket_available,
)
from tandem.bench.images import make_image_folder
from tandem.watch.samplers.process_tree import pss_bytes

CTX = mp.get_context("spawn")


@dataclass
class RunResult:
    mode: str
    jobs: int
    step: str
    wall_s: float = 0.0
    samples: int = 0
    samples_per_s: float = 0.0
    cpu_s: float = 0.0
    cpu_s_per_1k: float = 0.0
    peak_pss_mib: float = 0.0
    per_job: list[JobResult] = field(default_factory=list)
    note: str = ""


# --------------------------------------------------------------------------- measurement
class PssSampler(Every):
    """Peak of the summed PSS of this process's descendants, sampled every 0.2 s."""

    def __init__(self) -> None:
        super().__init__(0.2)
        self.peak = 0
        self._me = psutil.Process()

    def tick(self) -> None:
        total = sum(pss_bytes(p.pid) or 0 for p in self._me.children(recursive=True))
        self.peak = max(self.peak, total)


def _track(pid: int, name: str, group: str, mode: str) -> Any:
    from tandem.watch import Run

    tags = {"group": group, "tandem.mode": mode}
    if name == "producer":  # tagged as the manager tags its own: `tandem report` draws it apart
        tags["tandem.role"] = "producer"
    return Run(
        pid=pid,
        name=name,
        tags=tags,
        interval=1.0,
        quiet=True,
        writer="thread",
        cpu_since_start=True,
    ).start()


STALL_KEY = "train/stall_seconds"
CLOCK = "clock_start"
CLOCK_MARK = f"tandem.mark.{CLOCK}"  # `tandem report` draws a dotted line there


class StallLogger(Every):
    """Logs each job's data stall (its time blocked in ``next()``, counted by the job
    itself) to its tracked run every ``interval`` s and at the end, as a running total.
    Tandem consumers' stall is logged by ``tandem.watch`` from their producer's statistics;
    private loaders and TensorSocket consumers report nothing, so without this their stall
    would be missing from the figure while the table shows it."""

    def __init__(self, tracked: list[tuple[Any, int | None]], progress: list, interval: float = 1.0):
        super().__init__(interval)
        self._jobs = [(run, progress[i]) for run, i in tracked if i is not None]

    def tick(self) -> None:
        for run, pr in self._jobs:
            if pr[1]:  # the job's clock has started
                run.log_metrics({STALL_KEY: pr[3]})


def run_one(
    mode: str,
    jobs: int | list[JobSpec],
    step: str,
    cfg: ShareBenchConfig,
    root: str,
    track_group: str | None = None,
) -> RunResult:
    """Run ``jobs`` (a count of identical ``step`` jobs, or their specs) in one ``mode``.

    With ``track_group``, each job (and the producer) is tracked by ``tandem.watch`` as its
    own run with that group tag, from this process (so the tracking is in no job's tree)."""
    specs = [JobSpec(step)] * jobs if isinstance(jobs, int) else list(jobs)
    jobs = len(specs)
    run = JobProcesses(CTX)
    q, built, ready = run.results, run.built, run.ready
    progress = [CTX.Array("d", 4, lock=False) for _ in specs]  # (samples, start, pid, stall s) per job
    result = RunResult(mode, jobs, step)
    producer_cpu = 0.0
    got = 0

    def on_result(item: Any) -> None:
        nonlocal producer_cpu, got
        got += 1
        if isinstance(item, tuple) and item[0] == "producer":
            producer_cpu = item[1]
        else:
            result.per_job.append(item)

    tracked: list[tuple[Any, int | None]] = []  # (run, job index or None for the producer)
    clock_ms = time.time() * 1000  # where the figures' clock starts (start-up is before it)
    targets: list[tuple[Callable[..., Any], tuple[Any, ...]]]  # each job's function and arguments
    with PssSampler() as pss:
        try:
            if mode == "private":
                targets = [
                    (private_job, (q, cfg, job, root, built, ready, pr)) for job, pr in zip(specs, progress)
                ]
            elif mode == "tandem":
                name = f"bench-{os.getpid()}-{time.monotonic_ns()}"
                producer = run.start(tandem_producer, q, cfg, root, name, ready)
                targets = [
                    (tandem_job, (q, cfg, job, name, built, ready, pr)) for job, pr in zip(specs, progress)
                ]
            else:
                ports = free_ports(4)
                producer = run.start(tensorsocket_producer, q, cfg, root, ports, built, ready)
                targets = [
                    (tensorsocket_job, (q, cfg, job, ports, built, ready, pr))
                    for job, pr in zip(specs, progress)
                ]
            if mode != "private" and track_group:
                tracked.append((_track(producer.pid, "producer", track_group, mode), None))
            if mode == "tensorsocket":
                # its consumers must connect to a live producer (ZeroMQ subscribers that come
                # first miss its messages and it never sees them)
                run.wait_built(1, 120, on_result)
            for i, (target, args) in enumerate(targets):
                p = run.start(target, *args)
                if track_group:
                    tracked.append((_track(p.pid, specs[i].label(cfg), track_group, mode), i))
            # Start the clock when every job has built its loader or attached its consumer.
            deadline = time.monotonic() + cfg.run_timeout_s
            run.wait_built(jobs, cfg.run_timeout_s, on_result)
            ready.set()
            clock_ms = time.time() * 1000
            expected = jobs + (mode != "private")
            # Private and TensorSocket jobs' stall is logged here (tandem's comes from its producer).
            with StallLogger(tracked if mode != "tandem" else [], progress):
                run.gather(deadline - time.monotonic(), on_result, lambda: got >= expected)
            if len(result.per_job) < jobs:
                killed_at = time.monotonic()
                result.note = (
                    f"{jobs - len(result.per_job)} job(s) did not finish within "
                    f"{cfg.run_timeout_s:g} s (hung or too slow): killed; figures up "
                    "to the kill"
                )
                finished = {j.job for j in result.per_job}
                for job, pr in zip(specs, progress):
                    label = job.label(cfg)
                    if pr[2] and int(pr[2]) in finished:
                        continue
                    start = pr[1] or killed_at
                    wall = killed_at - start
                    result.per_job.append(
                        JobResult(
                            job=int(pr[2]),
                            label=label,
                            samples=int(pr[0]),
                            wall_s=wall,
                            start=start,
                            end=killed_at,
                            partial=True,
                            samples_per_s=pr[0] / wall if wall > 0 else 0.0,
                        )
                    )
            run.reap(grace_s=15 if not result.note else 0.5)
        finally:
            run.close()
        by_label = {j.label: j for j in result.per_job}
        for tracked_run, index in tracked:
            ran = by_label.get(specs[index].label(cfg)) if index is not None else None
            if ran is not None and ran.samples:
                tracked_run.log_step(samples=ran.samples)
            status = "FINISHED" if ran is None or not ran.error else "FAILED"
            tracked_run.stop(status, tags={CLOCK_MARK: f"{clock_ms:.0f}"})
    result.peak_pss_mib = pss.peak / 2**20
    errors = [j.error for j in result.per_job if j.error]
    if errors:
        result.note = (result.note + " " if result.note else "") + "; ".join(errors)[:300]
    done = [j for j in result.per_job if not j.error and j.wall_s]
    result.samples = sum(j.samples for j in done)
    if done:
        result.wall_s = max(j.end for j in done) - min(j.start for j in done)
    # aggregate: samples of all jobs over the span from the first start to the last end
    result.samples_per_s = result.samples / result.wall_s if result.wall_s else 0.0
    result.cpu_s = sum(j.cpu_s for j in done) + producer_cpu
    result.cpu_s_per_1k = 1000 * result.cpu_s / result.samples if result.samples else 0.0
    return result


# --------------------------------------------------------------------------- driver
def run(
    jobs: list[int],
    quick: bool = False,
    out: Path = Path("benchmarks/results"),
    steps: tuple[str, ...] = ("sleep", "cnn"),
    modes: tuple[str, ...] | None = None,
) -> dict:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    cfg = ShareBenchConfig(images=128, epochs=1, run_timeout_s=60) if quick else ShareBenchConfig()
    root = str(make_image_folder(Path(cfg.data_dir) / f"n{cfg.images}", images=cfg.images))
    if modes is None:
        modes = ("private", "tandem") + (("tensorsocket",) if tensorsocket_available() else ())
    results: list[RunResult] = []
    for step in steps:
        for n in jobs:
            for mode in modes:
                console.print(f"[dim]running {mode} x{n} ({step})...[/]")
                results.append(run_one(mode, n, step, cfg, root))
    handoff = [measure_handoff(s, steps=15 if quick else 40) for s in HANDOFF_SHAPES]

    table = Table(
        title=f"tandem share benchmark ({os.cpu_count()} cores, {cfg.images} JPEGs, "
        f"{cfg.epochs} epoch(s), batch {cfg.batch_size})"
    )
    for col in (
        "step",
        "jobs",
        "mode",
        "samples/s (sum)",
        "per job",
        "CPU s / 1k samples",
        "stall s / job",
        "peak PSS MiB",
        "note",
    ):
        table.add_column(col)
    for r in results:
        per_job = ", ".join(f"{j.samples_per_s:.0f}" for j in r.per_job if not j.error)
        stall = statistics.mean([j.stall_s for j in r.per_job]) if r.per_job else 0.0
        table.add_row(
            r.step,
            str(r.jobs),
            r.mode,
            f"{r.samples_per_s:.0f}",
            per_job,
            f"{r.cpu_s_per_1k:.2f}",
            f"{stall:.1f}",
            f"{r.peak_pss_mib:.0f}",
            r.note,
        )
    console.print(table)
    ho = Table(title="hand-off: consumer next() with the producer ahead")
    for col in ("batch", "MB", "median ms", "p90 ms"):
        ho.add_column(col)
    for h in handoff:
        ho.add_row(
            "x".join(map(str, h["shape"])),
            f"{h['mbytes']:.1f}",
            f"{h['median_ms']:.3f}",
            f"{h['p90_ms']:.3f}",
        )
    console.print(ho)

    targets = _targets(results, handoff, max(jobs))
    for t in targets:
        colour = "green" if t["met"] else "red"
        console.print(
            f"[{colour}]{'met' if t['met'] else 'NOT met'}[/]: {t['target']} (measured {t['measured']})"
        )
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "config": asdict(cfg),
        "command": "python benchmarks/share_bench.py" + (" --quick" if quick else ""),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": [asdict(r) for r in results],
        "handoff": handoff,
        "targets": targets,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("share-quick.json" if quick else "share.json")
    path.write_text(json.dumps(report, indent=2))
    write_markdown(report, path.with_suffix(".md"))
    console.print(f"results written to {path} and {path.with_suffix('.md')}")
    return report


def write_markdown(report: dict, path: Path) -> None:
    """The results as markdown tables (what benchmarks/README.md quotes)."""
    m, c = report["machine"], report["config"]
    lines = [
        f"# tandem share benchmark: results of {report['when']}",
        "",
        f"Command: `{report['command']}`. Machine: {m['cpus']} cores, {m['platform']}, "
        f"Python {m['python']}, torch {m['torch']}. Workload: {c['images']} generated JPEGs, "
        f"{c['epochs']} epoch(s) per job, batch {c['batch_size']}, crop {c['crop']}, "
        f"{c['workers']} loader workers per private job and per producer, simulated "
        f"accelerator step {c['sleep_ms']:g} ms per batch, CPU training model {c['model']}.",
        "",
        "| step | jobs | mode | samples/s, all jobs | samples/s per job | CPU-s per 1k samples "
        "| data stall s per job (mean) | peak PSS MiB | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        per_job = ", ".join(f"{j['samples_per_s']:.0f}" for j in r["per_job"] if not j["error"])
        stalls = [j["stall_s"] for j in r["per_job"] if not j["partial"]]
        stall = f"{statistics.mean(stalls):.1f}" if stalls else "-"
        cpu = f"{r['cpu_s_per_1k']:.2f}" if r["cpu_s_per_1k"] else "-"
        lines.append(
            f"| {r['step']} | {r['jobs']} | {r['mode']} | {r['samples_per_s']:.0f} | {per_job} "
            f"| {cpu} | {stall} | {r['peak_pss_mib']:.0f} | {r['note']} |"
        )
    lines += [
        "",
        "Hand-off: time of a consumer's `next()` while the producer is ahead "
        "(each step touches every page of the batch, then waits for the producer to refill).",
        "",
        "| batch | MB | median ms | p90 ms |",
        "|---|---|---|---|",
    ]
    for h in report["handoff"]:
        lines.append(
            f"| {'x'.join(map(str, h['shape']))} float32 | {h['mbytes']:.1f} "
            f"| {h['median_ms']:.3f} | {h['p90_ms']:.3f} |"
        )
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |")
    path.write_text("\n".join(lines) + "\n")


def _targets(results: list[RunResult], handoff: list[dict], n: int) -> list[dict]:
    def find(mode: str) -> RunResult | None:
        return next((r for r in results if r.mode == mode and r.jobs == n and r.step == "sleep"), None)

    out = []
    private, shared = find("private"), find("tandem")
    if private and shared and private.samples_per_s and shared.cpu_s_per_1k:
        ratio = shared.samples_per_s / private.samples_per_s
        out.append(
            {
                "target": f"N={n} simulated accelerator: shared samples/s >= 1.8x private",
                "measured": f"{ratio:.2f}x",
                "value": ratio,
                "met": ratio >= 1.8,
            }
        )
        cpu = shared.cpu_s_per_1k / private.cpu_s_per_1k
        out.append(
            {
                "target": f"N={n}: shared CPU-s per sample <= 0.35x private",
                "measured": f"{cpu:.2f}x",
                "value": cpu,
                "met": cpu <= 0.35,
            }
        )
    mid = next((h for h in handoff if h["shape"] == [64, 3, 224, 224]), None)
    if mid:
        out.append(
            {
                "target": "hand-off of a 64x3x224x224 float32 batch: median <= 0.3 ms",
                "measured": f"{mid['median_ms']:.3f} ms",
                "value": mid["median_ms"],
                "met": mid["median_ms"] <= 0.3,
            }
        )
    if len(handoff) >= 2:
        small, large = handoff[0], handoff[-1]
        growth = large["median_ms"] / small["median_ms"]
        out.append(
            {
                "target": f"hand-off does not grow with bytes ({small['mbytes']:.0f} MB vs "
                f"{large['mbytes']:.0f} MB: ratio <= 1.5)",
                "measured": f"{growth:.2f}x",
                "value": growth,
                "met": growth <= 1.5,
            }
        )
    return out
