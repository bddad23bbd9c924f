"""``tandem replay``: a trace through a real daemon per policy, and simulated."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tandem.place.sim.trace import trace_job, write_trace


def test_replay_live_and_simulated(cli, tmp_path: Path) -> None:
    job = f"{sys.executable} -c 'import time; time.sleep(1)'"
    trace = [
        trace_job(
            offset_s=i * 0.2,
            name=f"j{i}",
            command=job,
            cpus=1,
            mem=0,
            gpus=0,
            gpu_mem=None,
            duration_s=1.0,
            compute=0.05,
            kind="light",
        )
        for i in range(3)
    ]
    path = tmp_path / "tiny.csv"
    write_trace(trace, path)
    out = tmp_path / "out"
    r = cli(
        "replay",
        str(path),
        "--policy",
        "exclusive",
        "--policy",
        "first-fit",
        "--cpus",
        "2",
        "--settle",
        "0.3",
        "--window",
        "2",
        "--out",
        str(out),
        timeout=180,
    )
    assert "exclusive" in r.stdout and "first-fit" in r.stdout
    report = json.loads((out / "replay-tiny.json").read_text())
    ex, ff = report["exclusive"]["aggregates"], report["first-fit"]["aggregates"]
    assert ex["succeeded"] == ff["succeeded"] == 3
    # One at a time against two at a time on two cores, read off the attempts' own times (a
    # makespan compared across the two is a race on a loaded machine: each job is 1 s of sleep).
    assert _most_at_once(ex["job_rows"]) == 1 and _most_at_once(ff["job_rows"]) >= 2
    assert (out / "replay-tiny.png").stat().st_size > 0
    sim = cli("replay", str(path), "--simulate", "--gpus", "0", "--cpus", "2", "--out", str(out))
    assert "simulated" in sim.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("offset_s,name\n0,x\n")
    r = cli("replay", str(bad), "--simulate", check=False)
    assert r.returncode == 2 and "bad.csv" in r.stderr
    r = cli("replay", str(path.with_name("missing.csv")), check=False)
    assert r.returncode == 2


def _most_at_once(rows: list[dict]) -> int:
    """The most attempts running at one instant, from their start and end times."""
    edges = sorted(
        (t, step) for r in rows for a in r["attempts"] for t, step in ((a["started"], 1), (a["ended"], -1))
    )
    running = most = 0
    for _, step in edges:  # at a tie an end (-1) sorts before a start: touching is not overlapping
        running += step
        most = max(most, running)
    return most
