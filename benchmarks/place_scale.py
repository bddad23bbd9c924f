"""The job manager over a long history and a long queue, on this machine, with the defaults.

1. A state directory with ``--history`` ended jobs (10,000 by default, each with a 20 KB
   environment, as a real shell's is) written through the state module, plus a daemon
   with ``--queued`` jobs waiting (5,000) behind one that holds every core.
2. ``tandem ls`` and ``tandem ls --json`` (the active jobs and the last 10 ended), and one
   page of ``tandem ls --all``: wall seconds, median of 5, and peak memory.
3. The daemon's CPU use over 20 s with that queue (the share of one core).
4. ``tandem submit`` into that queue: wall seconds, median of 10, against an empty daemon.

    python benchmarks/place_scale.py [--history 10000] [--queued 5000] [--out benchmarks/results]

Writes ``place_scale.json``. Targets (issue 16): ``ls`` and ``ls --json`` under 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent
TANDEM = [sys.executable, "-m", "tandem.cli"]


def timed(args: list[str], env: dict[str, str], n: int) -> tuple[float, float]:
    """Median wall seconds of ``n`` runs and the largest peak RSS (MiB) of the command."""
    walls, peak = [], 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        proc = subprocess.run([*TANDEM, *args], env=env, capture_output=True, text=True, timeout=300)
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"tandem {' '.join(args)}: {proc.stderr}")
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    return statistics.median(walls), peak


def fill_history(state_dir: Path, n: int) -> None:
    from tandem.place.model import SUCCEEDED, JobSpec
    from tandem.place.state import State

    state = State(state_dir)
    env = {f"VAR_{i}": "x" * 200 for i in range(100)}  # 20 KB, as a real shell's environment
    now = time.time()
    for i in range(n):
        spec = JobSpec(["python", "train.py", f"--seed={i}"], "/tmp", env, name=f"h{i}")
        job_id, _ = state.add_job(spec, 0, now)
        state.update_job(job_id, state=SUCCEEDED, started=now, ended=now + 1, cause=SUCCEEDED, exit_code=0)
    state.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history", type=int, default=10_000)
    ap.add_argument("--queued", type=int, default=5_000)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="place-scale-"))
    state_dir = work / "state"
    state_dir.mkdir(mode=0o700)
    runtime = tempfile.mkdtemp(prefix="tps-")
    env = dict(os.environ, TANDEM_STATE_DIR=str(state_dir), TANDEM_RUNTIME_DIR=runtime)
    results: dict[str, float] = {}
    t0 = time.perf_counter()
    fill_history(state_dir, args.history)
    print(f"history of {args.history} jobs written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    subprocess.run([*TANDEM, "daemon", "start", "--no-track"], env=env, check=True, capture_output=True)
    try:
        results["submit_empty_s"], _ = timed(["submit", "--", "true"], env, 10)
        cores = str(psutil.cpu_count())
        subprocess.run([*TANDEM, "submit", "--cpus", cores, "--", "sleep", "600"], env=env, check=True,
                       capture_output=True)  # fmt: skip
        from tandem.place.client import submit
        from tandem.place.model import JobSpec

        big_env = dict(os.environ)
        t0 = time.perf_counter()
        for i in range(args.queued):
            submit(state_dir, JobSpec(["true"], "/tmp", big_env, name=f"q{i}"))
        print(f"{args.queued} jobs queued in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        results["ls_s"], results["ls_peak_mib"] = timed(["ls"], env, 5)
        results["ls_json_s"], results["ls_json_peak_mib"] = timed(["ls", "--json"], env, 5)
        results["ls_all_page_s"], _ = timed(["ls", "--all", "--json"], env, 3)
        results["submit_queued_s"], _ = timed(["submit", "--", "true"], env, 10)
        daemon = psutil.Process(json.loads((state_dir / "daemon.json").read_text())["pid"])
        before = daemon.cpu_times()
        time.sleep(20)
        after = daemon.cpu_times()
        busy = (after.user + after.system) - (before.user + before.system)
        results["daemon_core_share"] = busy / 20
    finally:
        subprocess.run([*TANDEM, "cancel", *map(str, range(1, args.history + args.queued + 20))], env=env,
                       capture_output=True)  # fmt: skip
        subprocess.run([*TANDEM, "daemon", "stop"], env=env, capture_output=True)
    for k, v in results.items():
        print(f"{k:24s} {v:8.3f}")
    payload = {
        "command": "python benchmarks/place_scale.py",
        "history": args.history,
        "queued": args.queued,
        "machine": {"cores": psutil.cpu_count(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "results": results,
        "targets": {"ls_s": 0.5, "ls_json_s": 0.5},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "place_scale.json").write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
