"""No reader holds the others: one that takes no batch for the producer's ``aside_after_s``
while others wait is set aside; they go on, and it continues its epoch exactly when it is
back (the drop-in loader on a new reader; a plain consumer is told how)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tandem.share import Consumer, Producer
from tandem.share.errors import ReaderSetAside
from tests.timing import scaled

READER = textwrap.dedent(
    """
    import json, sys, time, torch
    from tandem.share import DataLoader

    class Costly(torch.utils.data.Dataset):
        def __len__(self):
            return 400
        def __getitem__(self, i):
            return torch.full((64,), float(i)), i

    loader = DataLoader(Costly(), batch_size=8, shuffle=True)
    epochs, times = [], []
    for epoch in range(3):
        seen = []
        for x, i in loader:
            assert torch.equal(x[:, 0], i.float())  # each item is its own
            seen += i.tolist()
            times.append(time.monotonic())
            if len(times) == 3 and sys.argv[1:] == ["pause"]:
                # Stays at this batch until told (it is stopped meanwhile): on a busy
                # machine it could otherwise read all its epochs before the stop lands.
                print("reading", flush=True)
                sys.stdin.readline()
        epochs.append(seen)
    print(json.dumps({"epochs": epochs, "times": times}), flush=True)
    """
)

STOP_S = 20.0  # the stopped reader's pause; the others may wait a fraction of it
ASIDE_S = 3.0


@pytest.fixture(autouse=True)
def _producers_end(drop_in_producers_end):
    """The producers the readers start go with the test."""


def _exact(epoch: list[int], n: int) -> bool:
    return sorted(epoch) == list(range(n))


def test_a_stopped_reader_holds_the_others_only_until_it_is_set_aside(tmp_path: Path) -> None:
    script = tmp_path / "reader.py"
    script.write_text(READER)
    env = {**os.environ, "TANDEM_SHARE_ASIDE_S": str(ASIDE_S)}

    def reader(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE if args else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    stopped = reader("pause")
    readers = [stopped]
    try:
        assert stopped.stdout is not None and stopped.stdin is not None
        line = stopped.stdout.readline()  # blocks until it has read a few batches
        assert line.strip() == "reading", stopped.stderr.read() if stopped.stderr else ""
        stopped.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        stopped.stdin.write("go\n")  # read once it is continued
        stopped.stdin.flush()
        # The others start now: had they started with it, they could have been past the
        # window it holds (and finished unheld) by the time it took its third batch.
        readers += [reader(), reader()]
        others = [r.communicate(timeout=scaled(120)) for r in readers[1:]]
        others_done = time.monotonic()
    finally:
        stopped.send_signal(signal.SIGCONT)
    out, err = stopped.communicate(timeout=scaled(120))
    assert stopped.returncode == 0, err
    for proc, (_, e) in zip(readers[1:], others, strict=True):
        assert proc.returncode == 0, e
    results = [json.loads(o.strip().splitlines()[-1]) for o, _ in others]
    results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:  # every epoch of every reader exact, the stopped one's too
        assert len(r["epochs"]) == 3 and all(_exact(e, 400) for e in r["epochs"]), r["epochs"]
    # The others finished while it was stopped, waiting for it at most a fraction of its pause.
    assert others_done - stopped_at < STOP_S or all(
        max(b - a for a, b in zip(r["times"], r["times"][1:], strict=False)) < STOP_S - 2 for r in results[:2]
    )
    for r in results[:2]:
        gaps = [b - a for a, b in zip(r["times"], r["times"][1:], strict=False)]
        assert max(gaps) < min(STOP_S - 2, ASIDE_S + scaled(4)), f"a reader waited {max(gaps):.1f} s"
    assert "continuing its epoch on a new reader" in err


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i)]), i


def test_a_consumer_set_aside_is_told_and_resumes_its_epoch_exactly(runtime_dir: str) -> None:
    """A consumer that keeps its batch and takes nothing while another reads: set aside,
    the other reads on, and the kept batch stays what it was (its slot is not reused)."""
    producer = Producer.from_dataset(
        Numbers(), "aside", batch_size=4, shuffle=True, window=4, aside_after_s=1.0
    )
    producer.start()
    import threading

    serving = threading.Thread(target=producer.serve, daemon=True)
    serving.start()
    try:
        slow = Consumer("aside", batch_size=4, timeout=scaled(30))
        fast = Consumer("aside", batch_size=4, timeout=scaled(30))
        slow_epoch = iter(slow)
        kept_x, kept_i = next(slow_epoch)
        kept_copy = kept_x.clone()
        seen_slow = kept_i.tolist()
        fast_seen = [i for _ in range(3) for _, idx in fast for i in idx.tolist()]  # 3 epochs past it
        assert sorted(fast_seen) == sorted(list(range(64)) * 3)
        assert torch.equal(kept_x, kept_copy), "a kept batch's memory was reused"
        with pytest.raises(ReaderSetAside, match="set this consumer aside"):
            for _, idx in slow_epoch:
                seen_slow += idx.tolist()
        state = slow.state_dict()
        slow.close()
        again = Consumer("aside", batch_size=4, timeout=scaled(30))
        again.load_state_dict(state)
        seen_slow += [i for _, idx in again for i in idx.tolist()]
        assert sorted(seen_slow) == list(range(64)), "the set-aside consumer's epoch is not exact"
        again.close()
        fast.close()
    finally:
        producer.stop()
        serving.join(timeout=scaled(10))


def test_a_consumer_attached_before_the_stream_starts_is_not_set_aside_for_that_wait(
    runtime_dir: str,
) -> None:
    """Its job still builds (imports, a model) while another already asks for the first
    batch: nothing is published, so it holds nobody back however long the start takes."""
    import threading

    producer = Producer.from_dataset(Numbers(), "early", batch_size=4, window=4, aside_after_s=0.5)
    producer.start()
    serving = threading.Thread(target=producer.serve, daemon=True)
    early = Consumer("early", batch_size=4, timeout=scaled(30))
    eager = Consumer("early", batch_size=4, timeout=scaled(30))
    eager_seen: list[int] = []
    eager_reads = threading.Thread(
        target=lambda: eager_seen.extend(i for _, idx in eager for i in idx.tolist())
    )
    eager_reads.start()
    try:
        # Well past aside_after_s with the eager one waiting and nothing published yet.
        attached = time.monotonic()
        while time.monotonic() - attached < 4 * 0.5:
            time.sleep(0.05)
        serving.start()
        early_seen = [i for _, idx in early for i in idx.tolist()]
        eager_reads.join(timeout=scaled(30))
        assert sorted(early_seen) == list(range(64))
        assert sorted(eager_seen) == list(range(64))
    finally:
        early.close()
        eager.close()
        producer.stop()
        if serving.is_alive():
            serving.join(timeout=scaled(10))
