"""A drop-in loader's data served by a producer outside the job manager (issue 47): a
hand-started run of the same script claimed the share's name before the manager's producer
job could. That producer job ends as not needed (succeeded, saying so), never failed; the
job reads the live producer, every epoch exact; a job of the share submitted next starts
with no producer job of its own; ``ls`` and ``show`` name the producer that serves. A real
daemon, jobs and hand-started run.

Which of the two claims the name first is a race between two processes; here the manager's
producer is held (a ``sitecustomize`` on the job's ``PYTHONPATH``, which its producer job
inherits) until the hand-started run serves, so that the race always ends the same way."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tandem.share._registry import _is_live, _read_pid
from tests.place.conftest import Cli, attempt_dir
from tests.place.test_auto_share import _outcome, _producers, _succeeded
from tests.timing import until

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.warm]  # Python jobs start warm

# One script for the hand-started run and the jobs: its loader's fingerprint (its dataset,
# pickled by value from __main__) names their share. Arguments: batch size, a pause after each
# batch, epochs (the hand-started run: slow, until stopped).
SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from tandem.share import DataLoader

    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 60
        def __getitem__(self, i):
            return torch.tensor([float(i * i)]), i

    def epoch(loader, pause):
        seen = []
        for x, idx in loader:
            assert torch.equal(x[:, 0], (idx * idx).float())
            seen += idx.tolist()
            time.sleep(pause)
        return sorted(seen) == list(range(60))

    if __name__ == "__main__":
        size, pause, epochs = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
        train = DataLoader(Squares(), batch_size=size, shuffle=True)
        exact = [epoch(train, pause) for _ in range(epochs)]
        print(json.dumps({"exact": exact, "producer": train._consumer.producer_pid}))
    """
)
HOLD = textwrap.dedent(
    """
    import os, time
    if b"serve-spec" in open("/proc/self/cmdline", "rb").read().split(b"\\0"):
        open(os.environ["HELD_AT"], "w").close()
        deadline = time.monotonic() + 600
        while not os.path.exists(os.environ["HOLD_UNTIL"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    """
)


def test_a_producer_job_for_data_a_hand_started_run_serves_ends_not_needed(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD)
    held, go = tmp_path / "held", tmp_path / "go"
    runtime = Path(cli.env["TANDEM_RUNTIME_DIR"])
    cli("daemon", "start", "--no-track", "--settle", "0.3", "--grace", "1", "--producer-linger", "120")
    job = cli.submit(
        "--env", f"PYTHONPATH={hook}", "--env", f"HELD_AT={held}", "--env", f"HOLD_UNTIL={go}",
        "--", sys.executable, "train.py", "6", "0", "2",
    )  # fmt: skip
    until(held.exists, 120, "the manager's producer job started (its loader asked for it)")
    (producer,) = _producers(cli)
    # The script run by hand meanwhile: its loader starts a producer of its own, which serves.
    said = tmp_path / "hand.log"
    hand = subprocess.Popen(
        [sys.executable, "train.py", "6", "0.2", "100000"], cwd=tmp_path,
        env={**cli.env, "TANDEM_SHARE_LINGER_S": "5"}, stdout=said.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        lock = runtime / f"{producer['share']}.lock"
        until(lambda: _is_live(lock) or hand.poll() is not None, 120, "the hand-started run serves")
        assert hand.poll() is None, said.read_text()
        outside = _read_pid(lock)
        go.touch()  # the manager's producer goes on: it finds the name served
        _succeeded(cli, job)
        assert _outcome(cli, job)["exact"] == [True, True]
        assert _outcome(cli, job)["producer"] == outside, "the job read the producer that serves"
        _succeeded(cli, producer["id"], timeout=120)
        cause = cli.job(producer["id"])["cause"]
        assert cause.startswith("not needed") and f"pid {outside}" in cause, cause
        assert "not needed" in cli("show", str(producer["id"])).stdout

        # The share's next job reads the producer that serves: no producer job is made for it.
        again = cli.submit("--share", producer["share"], "--", sys.executable, "train.py", "4", "0", "2")
        _succeeded(cli, again)
        assert _outcome(cli, again)["exact"] == [True, True] and _outcome(cli, again)["producer"] == outside
        assert [p["id"] for p in _producers(cli)] == [producer["id"]]

        rows = json.loads(cli("ls", "--json").stdout)
        assert not [r for r in rows if r["state"] == "failed"], rows
        listed = cli("ls").stdout
        line = next(line for line in listed.splitlines() if line.startswith(f"share {producer['share']}"))
        assert f"served by a producer outside the manager (pid {outside})" in line, listed
        log = attempt_dir(cli.state, producer["id"]) / "output.log"
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        go.touch()
        hand.terminate()
        hand.wait(timeout=30)
