"""``tandem select`` as a user runs it: run (then the stored copy), ls, show, report, rm,
and bad input as exit 2 with what was wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tandem(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TANDEM_STATE_DIR=str(state), PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "tandem.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=180)  # fmt: skip


def test_run_ls_show_report_rm(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ["select", "run", "--dataset", "tandem.bench.select_data:noisy", "--method", "small-loss",
            "--budget", "0.3", "--model", "tandem.bench.select_data:mlp"]  # fmt: skip
    first = tandem(state, *args, "--json")
    assert first.returncode == 0, first.stderr
    made = json.loads(first.stdout)
    assert made["size"] == 450 and not made["cached"] and made["cost"]["mlflow_run_id"]
    again = tandem(state, *args)
    assert again.returncode == 0 and again.stdout.strip() == made["id"] and "not scored again" in again.stderr
    listed = json.loads(tandem(state, "select", "ls", "--json").stdout)
    assert [s["id"] for s in listed] == [made["id"]]
    shown = json.loads(tandem(state, "select", "show", made["id"], "--json").stdout)
    assert shown["method"] == "small-loss" and shown["keep"] == "low" and shown["uses"] == []
    report = json.loads(tandem(state, "select", "report", made["id"], "--json").stdout)
    assert report["jobs"] == [] and report["break_even"]["wall_s"]["selection"] == made["cost"]["wall_s"]
    assert tandem(state, "select", "rm", made["id"], "nope").returncode == 2  # one unknown: nothing removed
    assert json.loads(tandem(state, "select", "rm", made["id"], "--json").stdout) == {"removed": [made["id"]]}
    assert json.loads(tandem(state, "select", "ls", "--json").stdout) == []


def test_bad_input_exits_2_saying_what_was_wrong(tmp_path: Path) -> None:
    state = tmp_path / "state"
    base = ["select", "run", "--dataset", "tandem.bench.select_data:noisy", "--budget", "0.3"]
    r = tandem(state, *base, "--method", "lesss")
    assert r.returncode == 2 and "unknown method 'lesss'" in r.stderr
    r = tandem(
        state,
        "select",
        "run",
        "--dataset",
        "tandem.bench.select_data:nope",
        "--method",
        "random",
        "--budget",
        "5",
    )
    assert r.returncode == 2 and "has no attribute 'nope'" in r.stderr
    r = tandem(state, *base[:-1], "0", "--method", "random")
    assert r.returncode == 2 and "above 0" in r.stderr
    r = tandem(state, "select", "show", "0123456789abcdef")
    assert r.returncode == 2 and "no selection 0123456789abcdef" in r.stderr
    r = tandem(
        state,
        "share",
        "define",
        "picked",
        "--dataset",
        "tandem.bench.select_data:noisy",
        "--selection",
        "feed",
    )
    assert r.returncode == 2 and "--selection: no selection feed" in r.stderr
