"""A drop-in loader under the job manager (issue 34, point 4): ``tandem submit --grid`` of a
script that uses ``tandem.share.DataLoader``, with no ``--share`` and no definition, reads
one producer job of the daemon's, every epoch of every job exact; the sweep's waiting jobs
are bound to its share; a job's second loader (other data) gets a producer of its own; the
producers are stopped, as succeeded, after the group's last job. A real daemon and jobs."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.place.conftest import Cli, attempt_dir
from tests.timing import scaled

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.warm]  # Python jobs start warm

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from tandem.share import DataLoader

    class Squares(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return torch.tensor([float(i * i)]), i

    def epoch(loader, n):
        seen = []
        for x, idx in loader:
            assert torch.equal(x[:, 0], (idx * idx).float())  # each item with its own index
            seen += idx.tolist()
        return len(seen) == n and sorted(seen) == list(range(n))

    if __name__ == "__main__":
        train = DataLoader(Squares(60), batch_size=int(sys.argv[1]), shuffle=True)
        val = DataLoader(Squares(25), batch_size=5) if "--val" in sys.argv else None
        exact = []
        for _ in range(2):
            exact.append(epoch(train, 60))
            if val is not None:
                exact.append(epoch(val, 25))
        print(json.dumps({"exact": exact, "shared": train._consumer is not None,
                          "producer": train._consumer.producer_pid if train._consumer else None,
                          "val_producer": val._consumer.producer_pid if val is not None else None}))
    """
)


def _succeeded(cli: Cli, job_id: int, timeout: float = 240) -> None:
    state = cli.wait_state(job_id, {"succeeded", "failed", "cancelled"}, timeout=timeout)["state"]
    log = attempt_dir(cli.state, job_id) / "output.log"
    assert state == "succeeded", f"job {job_id} {state}: {log.read_text() if log.exists() else ''}"


def _outcome(cli: Cli, job_id: int) -> dict:
    out = (attempt_dir(cli.state, job_id) / "output.log").read_text()
    return json.loads(out.strip().splitlines()[-1])


def _producers(cli: Cli) -> list[dict]:
    return [row for row in cli.rows() if row["role"] == "producer"]


def test_a_sweep_of_a_dropin_script_reads_one_producer_job_every_epoch_exact(
    cli: Cli, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    cli("submit", "--grid", "bs=4,6,9", "--", sys.executable, "train.py", "{bs}")
    jobs = [row["id"] for row in cli.rows()]
    assert len(jobs) == 3
    for job_id in jobs:
        _succeeded(cli, job_id)
    outcomes = [_outcome(cli, j) for j in jobs]
    assert all(o["shared"] and o["exact"] == [True, True] for o in outcomes), outcomes
    (producer,) = _producers(cli)  # one producer job for the sweep, no definition given
    assert producer["share"].startswith("auto-") and producer["group"] == cli.rows()[0]["group"]
    assert len({o["producer"] for o in outcomes}) == 1  # all three read the one process
    # The first point reads it, and the others were bound to it as the first one asked for it.
    assert sum(1 for row in cli.rows() if row["role"] == "job" and row["share"] == producer["share"]) == 3
    _succeeded(cli, producer["id"], timeout=60)  # stopped after the group's last job
    share = cli._read(lambda reader: reader.share(producer["share"]).spec.source)
    assert share == "auto"  # defined by the daemon, as the loader asked


def test_a_jobs_second_loader_of_other_data_gets_a_producer_of_its_own(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    cli("daemon", "start", "--no-track")  # producers are the point here, not MLflow runs
    job_id = cli.submit("--", sys.executable, "train.py", "6", "--val")
    _succeeded(cli, job_id)
    outcome = _outcome(cli, job_id)
    assert outcome["exact"] == [True] * 4 and outcome["producer"] != outcome["val_producer"]
    producers = _producers(cli)
    assert len(producers) == 2 and len({p["share"] for p in producers}) == 2
    # The job had no group: it joined its first share's, where its producers are counted.
    assert {p["group"] for p in producers} == {cli.job(job_id)["group"]}
    for p in producers:
        _succeeded(cli, p["id"], timeout=60)


def test_the_same_script_submitted_three_times_reads_one_producer(cli: Cli, tmp_path: Path) -> None:
    """No sweep, no group: the same command submitted again is bound to the first's share."""
    (tmp_path / "train.py").write_text(SCRIPT)
    cli("daemon", "start", "--no-track")  # producers are the point here, not MLflow runs
    jobs = [cli.submit("--", sys.executable, "train.py", "6") for _ in range(3)]
    for job_id in jobs:
        _succeeded(cli, job_id)
    outcomes = [_outcome(cli, j) for j in jobs]
    assert all(o["exact"] == [True, True] for o in outcomes) and len({o["producer"] for o in outcomes}) == 1
    (producer,) = _producers(cli)
    assert {cli.job(j)["group"] for j in jobs} == {producer["group"]} == {producer["share"]}


def test_a_stopped_daemon_leaves_no_producer_lingering(cli: Cli, tmp_path: Path) -> None:
    """After its group's last job a producer serves on for the daemon's producer linger (a
    tuner's next trials find it). ``tandem daemon stop`` then stops it: no daemon would stop
    it later. The next daemon records it as stopped, succeeded."""
    (tmp_path / "train.py").write_text(SCRIPT)
    cli("daemon", "start", "--no-track")  # the next start keeps it
    job_id = cli.submit("--", sys.executable, "train.py", "6")
    _succeeded(cli, job_id)
    (producer,) = _producers(cli)
    pid = _outcome(cli, job_id)["producer"]
    assert producer["state"] == "running" and _alive(pid), "it lingers for the next job"
    cli("daemon", "stop")
    deadline = time.monotonic() + scaled(60)
    while _alive(pid):
        assert time.monotonic() < deadline, "the lingering producer outlived its daemon"
        time.sleep(0.1)
    cli("daemon", "start")
    _succeeded(cli, producer["id"], timeout=60)
    assert "its group's last job ended" in cli.job(producer["id"])["cause"]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
