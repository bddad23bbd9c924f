"""How long ``pytest tests/place`` takes at an older commit and at this one, in one run.

Issue 33 asks that the job manager's tests take at most half the time they took before it
(point 6: the daemon in-process where the behaviour is the scheduler's, the state's or a
handler's). Each commit is exported (``git archive``) into a fresh folder and its
``tests/place`` run there with this interpreter and its packages, ``src/`` of that tree
first on ``PYTHONPATH`` (so that the daemons, supervisors and CLIs the tests start are that
tree's), one after the other, the older first. Wall time from pytest's start to its end;
CPU-s of pytest and every process it reaped (``RUSAGE_CHILDREN``; daemons that outlive their
parent escape it, so the CPU figure is a lower bound); pytest's own summary line.

    python benchmarks/suite_time.py [--before 3c6e078] [--after HEAD] [--tests tests/place]

Writes ``benchmarks/results/suite_time.json`` and ``.md``. ``3c6e078`` is main just before
issue 33's first merge.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export(commit: str, into: Path) -> str:
    """The tree of ``commit`` in ``into``; its full hash."""
    full = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True, check=True)
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "archive", full.stdout.strip()], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {commit} failed")
    return full.stdout.strip()


def run_suite(tree: Path, tests: str, timeout: float) -> dict:
    env = dict(os.environ)
    env.pop("TANDEM_STATE_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), str(tree)])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    return {
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "cpu_s_reaped": round(cpu, 1),
        "summary": lines[-1].strip("= ") if lines else proc.stdout[-500:],
        "tail": "" if proc.returncode == 0 else proc.stdout[-3000:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="3c6e078", help="the older commit (default: before issue 33)")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--tests", default="tests/place")
    ap.add_argument("--timeout", type=float, default=5400)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="suite-time-"))
    results = []
    try:
        for label, commit in (("before", args.before), ("after", args.after)):
            tree = work / label
            full = export(commit, tree)
            print(f"{label} ({full[:9]}): pytest {args.tests} ...", flush=True)
            r = {"label": label, "commit": full, "load_before": os.getloadavg()}
            r.update(run_suite(tree, args.tests, args.timeout))
            print(f"{label}: {r['wall_s']} s, {r['cpu_s_reaped']} CPU-s, {r['summary']}", flush=True)
            results.append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = results[1]["wall_s"] / results[0]["wall_s"]
    report = {
        "command": "python " + " ".join([Path(__file__).relative_to(ROOT).as_posix(), *sys.argv[1:]]),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "tests": args.tests,
        "results": results,
        "after_vs_before_wall": round(ratio, 3),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite_time.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = [
        f"| {r['label']} | `{r['commit'][:9]}` | {r['wall_s']} | {r['cpu_s_reaped']} | {r['summary']} |"
        for r in results
    ]
    md = [
        f"# `pytest {args.tests}` before and after, in one run ({report['when']})",
        "",
        f"`{report['command']}`; {os.cpu_count()} cores. After/before wall time: **{ratio:.2f}x**.",
        "",
        "| tree | commit | wall, s | CPU-s (reaped) | pytest says |",
        "|---|---|---:|---:|---|",
        *rows,
        "",
    ]
    (args.out / "suite_time.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
