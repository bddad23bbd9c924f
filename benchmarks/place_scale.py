"""The job manager with a sweep's queue, on this machine, with the defaults.

1. A fresh state directory (with ``--history`` ended jobs written through the state module
   first, each with a 20 KB environment as a real shell's is: none by default) and a job
   that holds every core, submitted as a user would (the daemon starts with its defaults).
2. One sweep of ``--queued`` jobs (10,000) in one command: ``tandem submit --grid
   i=1..N -- python -c ...``: wall seconds of that command.
3. ``tandem ls``, ``tandem ls --json`` and ``tandem show ID`` with that queue: wall seconds,
   median of 5, and peak memory.
4. The daemon's CPU over 20 s with that queue and nothing changing (the share of one core).
5. The dashboard (``tandem dashboard --port 0 --no-open``) over that queue: ``/api/jobs``
   and ``/api/queue``, milliseconds, median of 20 after a first request.
6. ``tandem cancel --all``: wall seconds until every job has ended.

    python benchmarks/place_scale.py [--queued 10000] [--history 0] [--out benchmarks/results]

Writes ``place_scale.json`` and ``place_scale.md``. Targets (issue 26): the sweep submitted in
<= 20 s, ``ls`` <= 0.5 s, ``ls --json`` <= 1 s, ``show`` <= 0.3 s, the idle daemon under 1%
of a core, ``/api/jobs`` and ``/api/queue`` <= 50 ms, ``cancel --all`` <= 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent
TANDEM = [sys.executable, "-m", "tandem.cli"]
TARGETS = {
    "submit_sweep_s": 20.0,
    "ls_s": 0.5,
    "ls_json_s": 1.0,
    "show_s": 0.3,
    "daemon_core_share": 0.01,
    "api_jobs_ms": 50.0,
    "api_queue_ms": 50.0,
    "cancel_all_s": 10.0,
}


def tandem(args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run([*TANDEM, *args], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"tandem {' '.join(args)}: {proc.stderr}")
    return proc.stdout


def timed(args: list[str], env: dict[str, str], n: int) -> tuple[float, float]:
    """Median wall seconds of ``n`` runs and the largest peak RSS (MiB) of the command."""
    walls, peak = [], 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        tandem(args, env)
        walls.append(time.perf_counter() - t0)
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    return statistics.median(walls), peak


def fill_history(state_dir: Path, n: int) -> None:
    from tandem.place.model import JobSpec
    from tandem.place.state import State

    state = State(state_dir)
    env = {f"VAR_{i}": "x" * 200 for i in range(100)}  # 20 KB, as a real shell's environment
    specs = [JobSpec(["python", "train.py", f"--seed={i}"], "/tmp", env, name=f"h{i}") for i in range(n)]
    now = time.time()
    for job_id, _ in state.add_jobs(specs, 0, now):
        state.cancel(job_id, "cancelled", "history", now)
    state.close()


def log_in(base: str, runtime_dir: Path) -> str:
    """A session token, as a browser gets one: the one-time code of the 0600 login page
    ``tandem dashboard`` wrote, posted from the dashboard's own origin."""
    parts = urllib.parse.urlsplit(base)
    page = runtime_dir / "dashboard" / f"login-{parts.port}.html"
    deadline = time.monotonic() + 30
    while not page.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    found = re.search(r"#login=([\w-]+)", page.read_text())
    if found is None:
        raise RuntimeError(f"no login code in {page}")
    req = urllib.request.Request(
        base + "api/login",
        data=json.dumps({"code": found.group(1)}).encode(),
        headers={"Origin": base.rstrip("/"), "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["token"]


def get_ms(url: str, token: str) -> float:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    return (time.perf_counter() - t0) * 1000


def core_share(pid: int, seconds: float) -> float:
    proc = psutil.Process(pid)
    t = proc.cpu_times()
    before = t.user + t.system
    time.sleep(seconds)
    t = proc.cpu_times()
    return (t.user + t.system - before) / seconds


def dashboard(env: dict[str, str], results: dict[str, float]) -> None:
    server = subprocess.Popen([*TANDEM, "dashboard", "--port", "0", "--no-open"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        line = server.stdout.readline() if server.stdout else ""
        base = line.split(": ", 1)[1].strip()
        token = log_in(base, Path(env["TANDEM_RUNTIME_DIR"]))
        for name, path in (("api_jobs_ms", "api/jobs"), ("api_queue_ms", "api/queue")):
            get_ms(base + path, token)  # the first request warms the reader
            results[name] = statistics.median(get_ms(base + path, token) for _ in range(20))
    finally:
        server.terminate()
        server.wait(timeout=30)


def wait_all_ended(env: dict[str, str], deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if all(
            j["state"] in ("cancelled", "succeeded", "failed")
            for j in json.loads(tandem(["ls", "--json"], env))
        ):
            return
        time.sleep(0.1)
    raise RuntimeError(f"jobs still not ended {deadline_s:.0f} s after cancel --all")


def write_md(payload: dict, out: Path) -> None:
    r, rows = payload["results"], []
    labels = {
        "submit_sweep_s": ("one `tandem submit --grid` of the sweep", "s"),
        "ls_s": ("`tandem ls`", "s"),
        "ls_json_s": ("`tandem ls --json`", "s"),
        "show_s": ("`tandem show ID`", "s"),
        "daemon_core_share": ("idle daemon, share of one core (20 s)", ""),
        "api_jobs_ms": ("dashboard `/api/jobs`", "ms"),
        "api_queue_ms": ("dashboard `/api/queue`", "ms"),
        "cancel_all_s": ("`tandem cancel --all`, until every job ended", "s"),
    }
    for key, (what, unit) in labels.items():
        value = r[key]
        shown = f"{value:.2%}" if key == "daemon_core_share" else f"{value:.3g} {unit}"
        target = f"{TARGETS[key]:.0%}" if key == "daemon_core_share" else f"{TARGETS[key]:g} {unit}"
        rows.append(f"| {what} | {shown} | <= {target} | {'yes' if value <= TARGETS[key] else '**no**'} |")
    text = (
        f"# place at sweep scale: {payload['queued']:,} queued jobs "
        f"({payload['history']:,} ended before)\n\n"
        f"Command: `{payload['command']}`; measured {payload['when']} on "
        f"{payload['machine']['cores']} cores ({payload['machine']['platform']}), the daemon with its "
        "defaults (started by the first submit).\n\n| | measured | target | met |\n|---|---:|---:|---|\n"
        + "\n".join(rows)
        + f"\n\nPeak memory: `ls` {r['ls_peak_mib']:.0f} MiB, `ls --json` {r['ls_json_peak_mib']:.0f} MiB "
        f"(largest child so far); `ls --json` printed {r['ls_json_bytes'] / 1e6:.1f} MB.\n"
    )
    (out / "place_scale.md").write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--history", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="place-scale-"))
    state_dir = work / "state"
    state_dir.mkdir(mode=0o700)
    env = dict(
        os.environ, TANDEM_STATE_DIR=str(state_dir), TANDEM_RUNTIME_DIR=tempfile.mkdtemp(prefix="tps-")
    )
    results: dict[str, float] = {}
    if args.history:
        t0 = time.perf_counter()
        fill_history(state_dir, args.history)
        print(f"history of {args.history} jobs written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    cores = str(psutil.cpu_count())
    tandem(["submit", "--cpus", cores, "--name", "blocker", "--", "sleep", "3600"], env)
    try:
        t0 = time.perf_counter()
        out = tandem(
            ["submit", "--grid", f"i=1..{args.queued}", "--json", "--", "python", "-c", "print({i})"], env
        )
        results["submit_sweep_s"] = time.perf_counter() - t0
        print(f"{args.queued} jobs submitted in {results['submit_sweep_s']:.1f} s", file=sys.stderr)
        last = json.loads(out)["ids"][-1]
        results["ls_s"], results["ls_peak_mib"] = timed(["ls"], env, 5)
        results["ls_json_s"], results["ls_json_peak_mib"] = timed(["ls", "--json"], env, 5)
        results["ls_json_bytes"] = float(len(tandem(["ls", "--json"], env)))
        results["show_s"], _ = timed(["show", str(last)], env, 5)
        pid = json.loads((state_dir / "daemon.json").read_text())["pid"]
        results["daemon_core_share"] = core_share(pid, 20.0)
        dashboard(env, results)
        t0 = time.perf_counter()
        tandem(["cancel", "--all"], env)
        wait_all_ended(env, 600)
        results["cancel_all_s"] = time.perf_counter() - t0
    finally:
        subprocess.run([*TANDEM, "cancel", "--all"], env=env, capture_output=True)
        subprocess.run([*TANDEM, "daemon", "stop"], env=env, capture_output=True)
    for k, v in results.items():
        met = "" if k not in TARGETS else ("  ok" if v <= TARGETS[k] else "  MISSED")
        print(f"{k:24s} {v:10.3f}{met}")
    payload = {
        "command": "python benchmarks/place_scale.py"
        + (f" --queued {args.queued}" if args.queued != 10_000 else "")
        + (f" --history {args.history}" if args.history else ""),
        "queued": args.queued,
        "history": args.history,
        "machine": {"cores": psutil.cpu_count(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "results": results,
        "targets": TARGETS,
        "met": {k: results[k] <= t for k, t in TARGETS.items() if k in results},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "place_scale.json").write_text(json.dumps(payload, indent=1) + "\n")
    write_md(payload, args.out)
    return 0 if all(payload["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
