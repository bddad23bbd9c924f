"""Leaving an epoch early: a ``break``, an exception, a new ``iter()`` or Lightning's
``limit_train_batches`` hands back what the consumer holds, the rest of that epoch is skipped
and the next one starts whole; the batch kept after the break stays valid; SIGTERM ends a
consumer that waits for data even under a handler that only notes it (Lightning's)."""

from __future__ import annotations

import os
import platform
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from tandem.share import Consumer, Producer
from tests.share.conftest import wait_for
from tests.share.serving import serving
from tests.timing import scaled

N = 640


class Items(torch.utils.data.Dataset):
    """Item i: a vector of i's and its label i (a batch overwritten by a later one shows)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.full((256,), float(i)), i


def _wrong(batch) -> int:
    x, y = batch
    return int((x[:, 0].long() != y).sum() + (x[:, -1].long() != y).sum())


@pytest.mark.parametrize("batch_size", [None, 10, 48])
def test_a_break_after_three_batches_then_whole_epochs_in_bounded_time(batch_size):
    name = f"brk{batch_size}"
    # a window of 8 on 20 producer batches an epoch: a batch held back while skipping the
    # rest would stop the producer for ever (the hang of issue 32)
    producer = Producer.from_dataset(Items(), name, batch_size=32, shuffle=True, window=8)
    with serving(producer, epochs=None), Consumer(name, batch_size=batch_size, data_timeout=scaled(20)) as c:
        for _round in range(3):
            kept = None
            for k, batch in enumerate(c):
                kept = batch
                if k == 2:
                    break
            started = time.monotonic()
            whole = []
            for batch in c:  # the next epoch: at once, every item once
                whole.extend(batch[1].tolist())
                if kept is not None:
                    assert _wrong(kept) == 0  # the batch kept after the break: valid one fetch on
                    kept = None
            assert sorted(whole) == list(range(N))
            assert time.monotonic() - started < scaled(20)
        assert c.kept_batches == 0  # nothing warned of: within the contract


def test_an_exception_or_a_new_iter_leaves_the_epoch_and_the_old_iterator_ends():
    producer = Producer.from_dataset(Items(), "leave", batch_size=32, window=4)
    with serving(producer, epochs=None), Consumer("leave", batch_size=20, data_timeout=scaled(20)) as c:
        with pytest.raises(RuntimeError, match="boom"):
            for k, _batch in enumerate(c):
                if k == 4:
                    raise RuntimeError("boom")
        old = iter(c)
        next(old)
        labels = [i for _, y in c for i in y.tolist()]  # a new iter(): the next epoch, whole
        assert sorted(labels) == list(range(N))
        assert list(old) == []  # the left epoch's iterator yields nothing more


@pytest.mark.parametrize("via", ["consumer", "datamodule"])
def test_lightning_limit_train_batches_finishes_every_epoch(tmp_path, via):
    lightning = pytest.importorskip("lightning")
    from tandem.share.lightning import SharedDataModule

    class Model(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(256, 1)
            self.per_epoch: dict[int, int] = {}
            self.wrong = 0

        def training_step(self, batch, batch_idx):
            self.wrong += _wrong(batch)
            self.per_epoch[self.current_epoch] = self.per_epoch.get(self.current_epoch, 0) + 1
            return self.layer(batch[0] / N).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    name = f"limit{via}"
    producer = Producer.from_dataset(Items(), name, batch_size=32, shuffle=True, window=8)
    with serving(producer, epochs=None):
        model = Model()
        started = time.monotonic()
        trainer = lightning.Trainer(
            max_epochs=3, limit_train_batches=0.1, accelerator="cpu", logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=tmp_path,
        )  # fmt: skip
        if via == "consumer":
            with Consumer(name, batch_size=16, data_timeout=scaled(30)) as c:
                trainer.fit(model, train_dataloaders=c)
        else:
            trainer.fit(model, datamodule=SharedDataModule(name, batch_size=16, data_timeout=scaled(30)))
        assert model.per_epoch == {0: 4, 1: 4, 2: 4}  # 10% of 40 batches, each epoch
        assert model.wrong == 0
        assert time.monotonic() - started < scaled(60)


class Stalls:
    """Three batches, then nothing (a producer that is alive but sends no more)."""

    def __iter__(self):
        for i in range(3):
            yield torch.full((4, 8), float(i)), torch.arange(4)
        while True:
            time.sleep(3600)


def serve_stalling(name: str) -> None:
    Producer(Stalls(), name).serve()


LIGHTNING_WAITS = textwrap.dedent(
    """
    import sys
    import lightning, torch
    from tandem.share import Consumer

    class Model(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            print("step", batch_idx, flush=True)
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[2],
    )
    trainer.fit(Model(), train_dataloaders=Consumer(sys.argv[1]))
    print("fit returned", flush=True)
    """
)


def _in_poll(pid: int) -> bool:
    """Whether the process's main thread is blocked in poll (x86-64: poll 7, ppoll 271;
    aarch64: ppoll 73)."""
    calls = ("73",) if platform.machine() == "aarch64" else ("7", "271")
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return f.read().split()[0] in calls
    except (OSError, IndexError):
        return False


def test_sigterm_ends_a_lightning_consumer_waiting_for_data(procs, tmp_path):
    pytest.importorskip("lightning")
    procs.start(serve_stalling, "stall")
    script = tmp_path / "waits.py"
    script.write_text(LIGHTNING_WAITS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, str(script), "stall", str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in child.stdout], daemon=True)
    reader.start()
    try:
        said = []
        # Lightning fetches one batch ahead: after the second step it waits for the fourth
        while sum(line.startswith("step") for line in said) < 2:
            try:
                said.append(lines.get(timeout=scaled(120)))
            except queue.Empty:
                raise AssertionError("the consumer trained on no batch: " + "".join(said[-30:])) from None
        # A SIGTERM between batches is Lightning's to act on (it stops after the step): send
        # it once the consumer waits for the batch that never comes (its main thread in poll)
        wait_for(lambda: _in_poll(child.pid), 60, what="the consumer to wait for data")
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(scaled(20))
        except subprocess.TimeoutExpired:
            raise AssertionError("SIGTERM did not end the consumer waiting for data") from None
        reader.join(scaled(10))
        rest = "".join(said) + "".join(lines.queue)
        assert child.returncode == 143, rest[-3000:]
        assert "fit returned" not in rest
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(10)


def test_a_late_joiner_that_breaks_gets_its_next_epoch_whole():
    producer = Producer.from_dataset(Items(), "latebrk", batch_size=32, shuffle=True, window=4)
    with serving(producer, epochs=None):
        first = Consumer("latebrk", data_timeout=scaled(20))
        it = iter(first)
        for _ in range(5):
            next(it)
        done = threading.Event()

        def keep_reading() -> None:  # the first consumer goes on, so that the producer does
            source = it
            while not done.is_set():
                for _batch in source:
                    if done.is_set():
                        return
                source = iter(first)

        with Consumer("latebrk", batch_size=20, data_timeout=scaled(20)) as late:
            assert late.start[1] > 0  # joined mid-epoch: its epochs wrap into the producer's next
            reader = threading.Thread(target=keep_reading, daemon=True)
            reader.start()
            for _round in range(2):
                for k, _batch in enumerate(late):
                    if k == 1:
                        break
                whole = [i for _, y in late for i in y.tolist()]
                assert sorted(whole) == list(range(N))
            done.set()
        reader.join(scaled(20))
        first.close()


def test_lightning_ddp_of_two_ranks_with_limit_train_batches_finishes_every_epoch(tmp_path):
    pytest.importorskip("lightning")
    from tests.share.test_ranks import LIGHTNING_DDP, run_lightning_ddp
    from tests.share.test_ranks import Items as Rows  # 8 features, as its model takes

    script = tmp_path / "train_ddp.py"
    script.write_text(
        LIGHTNING_DDP.replace("max_epochs=2,", "max_epochs=3, limit_train_batches=0.1,").replace(
            'Consumer("ddp", batch_size=16)', 'Consumer("ddplimit", batch_size=16)'
        )
    )
    producer = Producer.from_dataset(Rows(N), "ddplimit", batch_size=32, shuffle=True)
    with serving(producer, epochs=None):
        ranks = run_lightning_ddp(script, tmp_path)
    for epoch in ("0", "1", "2"):  # 10% of each rank's 20 batches of 16, every epoch
        assert len(ranks[0][epoch]) == len(ranks[1][epoch]) == 2 * 16
        assert not set(ranks[0][epoch]) & set(ranks[1][epoch])
