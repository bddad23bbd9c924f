"""examples/optuna_sweep.py as the README shows it: an Optuna study (and a random search)
whose trials are tandem jobs reading one share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import scaled

pytestmark = pytest.mark.warm  # Python jobs start warm, as a user's do

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "optuna_sweep.py"


@pytest.mark.parametrize("tuner", ["optuna", "random"])
def test_a_study_runs_its_trials_as_jobs_of_one_share_group(cli, tuner):
    if tuner == "optuna":
        pytest.importorskip("optuna")
    cli("daemon", "start", "--cpus", "2")
    cli(
        "share",
        "define",
        "blobs",
        "--dataset",
        f"{EXAMPLE}:train_set",
        "--batch-size",
        "64",
        "--shuffle",
        "--cpus",
        "0.5",
    )
    # The random search is the same jobs without Optuna's sampler: two trials show its path.
    trials = 4 if tuner == "optuna" else 2
    args = ["--trials", str(trials), "--parallel", "2"] + (["--random"] if tuner == "random" else [])
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        env=cli.env,
        cwd=cli.tmp,
        capture_output=True,
        text=True,
        timeout=scaled(240),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "best loss" in run.stdout
    name = "optuna-blobs" if tuner == "optuna" else "random-blobs"
    assert f"tandem report group:{name}" in run.stdout
    group = [j for j in cli.json("ls", "--all") if j["group"] == name]
    jobs = [j for j in group if j["role"] == "job"]  # beside them, their share's producer
    # One producer for the whole study: it serves on (the daemon's producer linger) while the
    # study tells a trial's result and asks for the next; stopped as succeeded after the last
    # (it may still be lingering as the study returns).
    producers = [j for j in group if j["role"] == "producer"]
    assert len(producers) == 1 and producers[0]["name"] == "producer blobs", producers
    assert producers[0]["state"] in ("succeeded", "running"), producers
    assert len(jobs) == trials
    assert all(j["state"] == "succeeded" for j in jobs), jobs
    assert all(j["share"] == "blobs" and set(j["params"]) == {"lr", "weight_decay"} for j in jobs)
