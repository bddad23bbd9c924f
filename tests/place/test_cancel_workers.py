"""A cancel ends a job's main process before its other processes: a training script (or a
share's producer) that handles SIGTERM ends its own DataLoader workers, with no traceback."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil

from tests.place.conftest import attempt_dir
from tests.timing import scaled

# As a Lightning script or a share's producer does: SIGTERM ends the run cleanly (here: exit
# 0 from the loop), and the DataLoader iterator shuts its workers down on the way out.
TRAIN = """
import signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.01)
        return i  # no tensor: batches travel whole through the pipe, no shared-memory fds

def as_list(items):
    return items

def stop(*_):
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
loader = DataLoader(Slow(), batch_size=4, num_workers=2, collate_fn=as_list)
for n, batch in enumerate(loader):
    if n == 3:
        print("training", flush=True)
"""


def test_a_cancel_lets_the_main_process_end_its_dataloader_workers(cli, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    cli("daemon", "start", "--cpus", "2", "--no-track", "--settle", "0.3", "--grace", "20")
    job_id = cli.submit("--", sys.executable, str(script))
    cli.wait_state(job_id, {"running"})
    attempt = attempt_dir(cli.state, job_id)
    output = attempt / "output.log"  # read as its supervisor writes it: no CLI started per poll
    deadline = time.monotonic() + scaled(60)
    while not (output.exists() and "training" in output.read_text()):
        assert time.monotonic() < deadline, "the job never trained"
        time.sleep(0.1)
    pid = json.loads((attempt / "started.json").read_text())["pid"]
    workers = psutil.Process(pid).children()
    assert len(workers) == 2, "two DataLoader workers"
    cli("cancel", str(job_id))
    ended = cli.wait_state(job_id, {"cancelled"}, timeout=scaled(60))
    log = cli("logs", str(job_id)).stdout
    assert "killed by signal" not in log and "Traceback" not in log, log
    assert ended["exit_code"] == 0, "its own SIGTERM handler ended it, before the grace ran out"
    _, alive = psutil.wait_procs(workers, timeout=scaled(10))
    assert not alive, "its workers are gone"
