"""The dashboard over a big history, on this machine, with the defaults.

1. A state directory with ``--jobs`` jobs (10,000: most ended, 100 queued, 20 running, each
   with a 20 KB environment) and ``--events`` events (30,000), written through the state
   module; no daemon (the dashboard works without one).
2. ``tandem dashboard --port 0 --no-open`` serves it. The first API page (``/api/jobs``,
   100 jobs) and one job: wall milliseconds of the first request and the median of 20.
3. The distribution's headless Chromium (Playwright) loads the overview: milliseconds from
   navigation to the page drawn (``body[data-ready]``), and the bytes transferred.
4. Updates: a writer changes a listed job's state in the state file 20 times; the time
   until the page shows it (p50, p95).
5. The server idle (no page) and with a page open and nothing changing: share of one core
   over 20 s each.
6. Memory over ``--soak`` seconds (600) with a page open and a job changing every 2 s:
   the server's RSS at the start, the end and its largest.

    python benchmarks/dashboard_bench.py [--jobs 10000] [--events 30000] [--soak 600]

Writes ``dashboard_bench.json`` and ``dashboard_bench.md``. Targets (issue 17): first API
page <= 50 ms, overview drawn <= 1 s, first transfer <= 300 KB, updates within 1 s at p95,
the idle server under 1% of a core, memory flat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent
TANDEM = [sys.executable, "-m", "tandem.cli"]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def fill(state_dir: Path, jobs: int, events: int) -> list[int]:
    """The history; returns the ids of the running jobs (what the writer changes)."""
    from tandem.place.model import QUEUED, RUNNING, SUCCEEDED, JobSpec
    from tandem.place.records import Attempt
    from tandem.place.state import State

    state = State(state_dir)
    env = {f"VAR_{i}": "x" * 200 for i in range(100)}
    now = time.time()
    running = []
    per_job = max(0, events // jobs - 1)  # add_job writes one ("submitted")
    for i in range(jobs):
        spec = JobSpec(
            ["python", "train.py", f"--lr={i}"], "/tmp", env, name=f"h{i}", group=f"sweep{i // 500}"
        )
        job_id, _ = state.add_job(spec, 0, now - (jobs - i))
        left = jobs - i
        if left <= 100:
            state.update_job(job_id, state=QUEUED, reason="cores: needs 1, 0 of 16 free")
            continue
        started = now - (jobs - i) + 1
        state.add_attempt(Attempt(job_id, 1, RUNNING, {"device": "cpu"}, started))
        if left <= 120:
            state.update_job(job_id, state=RUNNING, started=started)
            running.append(job_id)
        else:
            state.update_attempt(job_id, 1, state=SUCCEEDED, ended=started + 30, cause=SUCCEEDED, exit_code=0)
            state.update_job(job_id, state=SUCCEEDED, started=started, ended=started + 30, cause=SUCCEEDED)
        for k in range(per_job):
            state.event(job_id, "note", f"event {k}")
    state.close()
    return running


def get(url: str, token: str) -> tuple[float, int]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return (time.perf_counter() - t0) * 1000, len(body)


def core_share(proc: psutil.Process, seconds: float) -> float:
    t = proc.cpu_times()
    before = t.user + t.system
    time.sleep(seconds)
    t = proc.cpu_times()
    return (t.user + t.system - before) / seconds


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--soak", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from tandem.place.model import QUEUED, RUNNING
    from tandem.place.state import State

    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("needs the distribution's Chromium: apt-get install chromium")
    work = Path(tempfile.mkdtemp(prefix="dash-bench-"))
    state_dir = work / "state"
    state_dir.mkdir(mode=0o700)
    env = dict(
        os.environ, TANDEM_STATE_DIR=str(state_dir), TANDEM_RUNTIME_DIR=tempfile.mkdtemp(prefix="tdb-")
    )
    t0 = time.perf_counter()
    running = fill(state_dir, args.jobs, args.events)
    print(
        f"{args.jobs} jobs, {args.events} events written in {time.perf_counter() - t0:.0f} s", file=sys.stderr
    )
    server = subprocess.Popen([*TANDEM, "dashboard", "--port", "0", "--no-open"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    r: dict[str, float] = {}
    try:
        line = server.stdout.readline() if server.stdout else ""
        base, token = line.split(": ", 1)[1].strip().split("?token=")
        proc = psutil.Process(server.pid)
        r["api_jobs_first_ms"], r["api_jobs_bytes"] = get(f"{base}api/jobs", token)
        r["api_jobs_median_ms"] = statistics.median(get(f"{base}api/jobs", token)[0] for _ in range(20))
        r["api_job_median_ms"] = statistics.median(
            get(f"{base}api/jobs/{running[0]}", token)[0] for _ in range(20)
        )
        r["server_idle_no_page_core_share"] = core_share(proc, 20)
        writer = State(state_dir)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            t0 = time.perf_counter()
            page.goto(f"{base}?token={token}")
            page.wait_for_selector("body[data-ready='/']", timeout=30_000)
            r["overview_drawn_ms"] = (time.perf_counter() - t0) * 1000
            page.wait_for_timeout(500)
            transfer = page.evaluate(
                "performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))"
                ".reduce((s, e) => s + (e.transferSize || 0), 0)"
            )
            r["first_transfer_kb"] = transfer / 1024
            lags = []
            for k in range(20):
                job = running[k % len(running)]
                new = QUEUED if k % 2 == 0 else RUNNING
                t1 = time.perf_counter()
                writer.update_job(job, state=new)
                page.wait_for_selector(f"#jobs tr[data-job-id='{job}'][data-state='{new}']", timeout=10_000)
                lags.append(time.perf_counter() - t1)
                page.wait_for_timeout(300)
            lags.sort()
            r["update_p50_s"] = statistics.median(lags)
            r["update_p95_s"] = lags[int(0.95 * (len(lags) - 1))]
            r["server_page_open_idle_core_share"] = core_share(proc, 20)
            rss = [proc.memory_info().rss]
            end = time.monotonic() + args.soak
            k = 0
            while time.monotonic() < end:
                writer.update_job(running[k % len(running)], state=QUEUED if k % 2 else RUNNING)
                k += 1
                page.wait_for_timeout(2000)
                rss.append(proc.memory_info().rss)
            r["soak_s"] = args.soak
            r["rss_start_mib"], r["rss_end_mib"] = rss[0] / 2**20, rss[-1] / 2**20
            r["rss_max_mib"] = max(rss) / 2**20
            r["soak_page_alive"] = float(
                page.evaluate("document.getElementById('live').dataset.live === 'live'")
            )
            browser.close()
    finally:
        server.terminate()
        server.wait(10)
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "jobs": args.jobs, "events": args.events, "results": r,
           "command": f"python benchmarks/dashboard_bench.py --jobs {args.jobs} --events {args.events} "
                      f"--soak {args.soak:g}"}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dashboard_bench.json").write_text(json.dumps(out, indent=2) + "\n")
    targets = [
        ("first API page (/api/jobs: 100 jobs), first", f"{r['api_jobs_first_ms']:.1f} ms", "<= 50 ms"),
        ("first API page, median of 20", f"{r['api_jobs_median_ms']:.1f} ms", "<= 50 ms"),
        ("one job (/api/jobs/ID), median of 20", f"{r['api_job_median_ms']:.1f} ms", ""),
        ("overview drawn in Chromium", f"{r['overview_drawn_ms']:.0f} ms", "<= 1,000 ms"),
        ("first transfer", f"{r['first_transfer_kb']:.0f} KB", "<= 300 KB"),
        ("update shown, p50 / p95", f"{r['update_p50_s']:.2f} / {r['update_p95_s']:.2f} s", "p95 <= 1 s"),
        ("server idle, no page", f"{100 * r['server_idle_no_page_core_share']:.2f}% of a core", "< 1%"),
        ("server idle, a page open", f"{100 * r['server_page_open_idle_core_share']:.2f}% of a core", "< 1%"),
        (f"server RSS over {args.soak:g} s: start / end / max",
         f"{r['rss_start_mib']:.0f} / {r['rss_end_mib']:.0f} / {r['rss_max_mib']:.0f} MiB", "flat"),
    ]  # fmt: skip
    lines = ["| measure | this machine | target |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in targets]
    head = f"{args.jobs:,} jobs and {args.events:,} events in the state, {os.cpu_count()} cores, no daemon."
    md = f"# Dashboard benchmark\n\n{head}\n\n`{out['command']}`\n\n" + "\n".join(lines) + "\n"
    (args.out / "dashboard_bench.md").write_text(md)
    print(md)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
