"""``benchmarks/sweep_vs.py`` on a tiny sweep: its trial checks its epochs, and a whole arm
runs, is accounted and written (figures are not asserted: they are the benchmark's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    e = dict(os.environ, SWEEPVS_ITEMS="40", SWEEPVS_CLIP_S="0.1", SWEEPVS_EPOCHS="2")
    e.update(SWEEPVS_OUT=str(tmp_path / "trials"), **extra)
    e.pop("TANDEM_SHARE", None)
    return e


def test_the_trial_reads_every_item_once_an_epoch(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / "sweep_vs_trial.py"), "--lr", "0.1"],
                          env=env(tmp_path), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "trials" / "trial-private-lr0.1.json").read_text())
    assert result["samples_per_epoch"] == [40, 40] and result["exact"] == [True, True]
    assert result["end"] > result["start"] and result["loop_cpu_s"] > 0


def test_an_arm_runs_every_trial_and_counts_its_cpu(tmp_path):
    pytest.importorskip("submitit")
    tiny = ["--items", "40", "--clip-s", "0.1", "--epochs", "2", "--out", str(tmp_path), "--label", "t"]
    cmd = [sys.executable, str(BENCH / "sweep_vs.py"), "--arms", "submitit", "--lrs", "0.1,0.01", *tiny]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (r,) = json.loads((tmp_path / "sweep_vs-t.json").read_text())["results"]
    assert r["ok"] and r["trials_finished_exact"] == 2 and not r["leftovers_killed"]
    assert sorted(t["lr"] for t in r["per_trial"]) == [0.01, 0.1]
    # Every process's CPU: the trials' loops and, beyond them, two submitit controllers and
    # interpreters that import torch.
    assert r["cpu_s"] > r["trial_loops_cpu_s"] + 1.0 > 1.0
    assert 0 < r["makespan_s"] <= r["arm_wall_s"]
    assert "| submitit |" in (tmp_path / "sweep_vs-t.md").read_text()


def test_the_tandem_arm_is_attributed_by_role_and_held_to_its_trials_outside_the_manager(tmp_path):
    """The tandem arm under its defaults (a real daemon, supervisors, MLflow helper and
    producer): every CPU-second reaped is given to one role, and the table says so; the plain
    arm (the share's producer and the trials, by hand) gives a trial's own cost outside it."""
    tiny = ["--items", "40", "--clip-s", "0.1", "--epochs", "2", "--out", str(tmp_path), "--label", "t"]
    cmd = [sys.executable, str(BENCH / "sweep_vs.py"), "--arms", "tandem,plain", "--lrs", "0.1,0.01", *tiny]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    r, plain = json.loads((tmp_path / "sweep_vs-t.json").read_text())["results"]
    assert r["arm"] == "tandem" and r["ok"] and r["trials_finished_exact"] == 2, r
    assert plain["arm"] == "plain" and plain["ok"] and plain["trials_finished_exact"] == 2, plain
    assert plain["by_role"] is None and all(t["process_cpu_s"] > t["loop_cpu_s"] for t in plain["per_trial"])
    assert r["trial_process_cpu_s"] > 0 and plain["trial_process_cpu_s"] > 0
    assert "A trial's own process under the manager" in (tmp_path / "sweep_vs-t.md").read_text()
    roles = r["by_role"]
    assert roles["trials_n"] == 2 and roles["supervisors_n"] == 3  # two trials and their producer
    assert roles["trials"] > roles["trial_loops"] > 0 and roles["producer"] > 0
    assert roles["daemon"] > 0 and roles["mlflow_helper"] > 0 and roles["commands"] > 0
    # Figures read two ways agree: each job's tree from /proc and from its supervisor's
    # result.json; the supervisors as what is left and as read; all that was reaped here, each
    # read as a zombie, and the arm's CPU as getrusage counts it.
    for job in roles["jobs"]:
        assert job["tree_cpu_s"] is not None and job["result_json_cpu_s"] is not None, job
        assert abs(job["tree_cpu_s"] - job["result_json_cpu_s"]) < 0.1, job
    read = sum(j["supervisor_cpu_s"] for j in roles["jobs"])
    assert abs(roles["supervisors"] - read) < 0.5, (roles["supervisors"], read)
    assert abs(roles["all"] - r["cpu_s_reaped_children"]) < 0.5, (roles["all"], r)
    assert "| tandem arm, by role |" in (tmp_path / "sweep_vs-t.md").read_text()
