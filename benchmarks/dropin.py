"""Three processes of one plain PyTorch script started at once: with torch's ``DataLoader``
and with ``tandem.share.DataLoader`` (the one line that differs), in one run: wall time and
CPU-seconds of each arm.

The script is ``benchmarks/dropin_trial.py`` (CPU-costly items, exact epochs checked). Each
arm runs in a fresh runtime directory (``XDG_RUNTIME_DIR``: no producer from before) and in
a cgroup of its own (``sweep_vs.CpuGroup``): its CPU-s are the kernel's total of every
process that ran in it, the producer the first tandem process started included (it is in
the arm's cgroup, started from it; it is stopped with SIGTERM once the three have ended,
rather than after its minute of lingering, and counted after it has gone).

    python benchmarks/dropin.py [--quick] [--procs 3]

Writes ``benchmarks/results/dropin.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sweep_vs import CpuGroup  # noqa: E402

TRIAL = ROOT / "dropin_trial.py"


def producers_of(runtime: Path) -> list[int]:
    """The pids of the producers serving in ``runtime`` (their lock files name them)."""
    pids = []
    for lock in (runtime / "tandem").glob("*.lock") if (runtime / "tandem").is_dir() else []:
        try:
            pids.append(int(lock.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def run_arm(loader: str, procs: int, env: dict[str, str]) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"dropin-{loader}-"))
    runtime = work / "run"
    runtime.mkdir(mode=0o700)
    out = work / "out"
    arm_env = {**env, "XDG_RUNTIME_DIR": str(runtime), "DROPIN_OUT": str(out)}
    group = CpuGroup(f"tandem-dropin-{loader}-{os.getpid()}")
    began = time.time()
    children = [
        subprocess.Popen([sys.executable, str(TRIAL), "--loader", loader], env=arm_env, preexec_fn=group.join)
        for _ in range(procs)
    ]
    codes = [c.wait() for c in children]
    trials_done = time.time()
    stopped = producers_of(runtime)
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 30
    while any(_alive(p) for p in stopped) and time.time() < deadline:
        time.sleep(0.1)
    cpu = group.cpu_s()
    group.remove()
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))] if out.is_dir() else []
    return {
        "loader": loader,
        "exit_codes": codes,
        "exact": sum(1 for r in records if r["samples_per_epoch"]),
        "wall_s": max((r["end"] for r in records), default=trials_done) - began,
        "cpu_s": cpu,
        "cgroup": group.kind,
        "trial_cpu_s": [round(r["cpu_s"], 2) for r in records],
        "producers_stopped": len(stopped),
        "is_dataloader": all(r["is_dataloader"] for r in records),
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 items, 1 epoch: a check that it runs")
    parser.add_argument("--procs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.quick:
        env.update(DROPIN_ITEMS="500", DROPIN_EPOCHS="1")
    arms = [run_arm(loader, args.procs, env) for loader in ("torch", "tandem")]
    base = arms[0]
    for arm in arms:
        arm["cpu_vs_torch"] = arm["cpu_s"] / base["cpu_s"] if arm["cpu_s"] and base["cpu_s"] else None
        arm["wall_vs_torch"] = arm["wall_s"] / base["wall_s"]
    result = {
        "command": "python benchmarks/dropin.py" + (" --quick" if args.quick else ""),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}",
        "workload": {k: env.get(k) for k in ("DROPIN_ITEMS", "DROPIN_COST", "DROPIN_EPOCHS")},
        "procs": args.procs,
        "arms": arms,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    label = "-quick" if args.quick else ""
    (args.out / f"dropin{label}.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# {args.procs} processes of one script: torch's DataLoader vs tandem.share.DataLoader "
        f"({result['when']})",
        "",
        f"`{result['command']}`; {result['machine']}.",
        "",
        "| loader | wall s | vs torch | CPU-s, all | vs torch | trials exact | each trial's CPU-s |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for a in arms:
        lines.append(
            f"| {a['loader']} | {a['wall_s']:.1f} | {a['wall_vs_torch']:.2f}x | {a['cpu_s']:.1f} | "
            f"{a['cpu_vs_torch']:.2f}x | {a['exact']}/{args.procs} | "
            f"{', '.join(map(str, a['trial_cpu_s']))} |"
        )
    lines += ["", f"CPU-s counted by cgroup: {arms[0]['cgroup']} (the tandem arm's producer included)."]
    (args.out / f"dropin{label}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if any(any(a["exit_codes"]) or a["exact"] != args.procs for a in arms):
        raise SystemExit("a trial failed")


if __name__ == "__main__":
    main()
