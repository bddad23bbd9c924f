"""A consumer's state names its share and dataset and is refused for another; a state taken at
an epoch's end resumes the next epoch once; out-of-range and malformed states are clear
errors; the ranks of a Lightning DDP job resume from rank 0's state, each its own part."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tandem.share import Consumer, Producer
from tests.share.serving import serving
from tests.timing import scaled

N = 640


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.full((8,), float(i)), i


def _state_after(name: str, batches: int, **kwargs) -> tuple[dict, list[int]]:
    with Consumer(name, **kwargs) as c:
        it = iter(c)
        seen = [i for _ in range(batches) for i in next(it)[1].tolist()]
        return c.state_dict(), seen


def test_a_state_of_another_share_or_dataset_is_refused():
    half_a = torch.utils.data.Subset(Items(), range(0, N, 2))
    half_b = torch.utils.data.Subset(Items(), range(1, N, 2))  # as many items, other ones
    with serving(Producer.from_dataset(half_a, "stA", batch_size=32, shuffle=True), epochs=None):
        state, _ = _state_after("stA", 3)
    assert (
        state["share"] == "stA" and state["dataset"]["length"] == N // 2 and state["dataset"]["fingerprint"]
    )
    refused = pytest.raises(ValueError, match="share 'stA'; this consumer reads 'stB'")
    with (
        serving(Producer.from_dataset(half_b, "stB", batch_size=32), epochs=None),
        Consumer("stB") as c,
        refused,
    ):
        c.load_state_dict(state)
    # the same name, restarted over another selection of the same size
    refused = pytest.raises(ValueError, match="another dataset than the one share 'stA' serves")
    with (
        serving(Producer.from_dataset(half_b, "stA", batch_size=32), epochs=None),
        Consumer("stA") as c,
        refused,
    ):
        c.load_state_dict(state)
    refused = pytest.raises(ValueError, match=f"epoch of {N // 2} items, but share 'stA' now serves {N}")
    with (
        serving(Producer.from_dataset(Items(), "stA", batch_size=32), epochs=None),
        Consumer("stA") as c,
        refused,
    ):
        c.load_state_dict(state)


def test_malformed_and_out_of_range_states_are_clear_errors():
    with serving(Producer.from_dataset(Items(), "bad", batch_size=32), epochs=None):
        state, _ = _state_after("bad", 2)
        with Consumer("bad") as c:
            with pytest.raises(ValueError, match="not a tandem consumer state"):
                c.load_state_dict({"step": 3})
            with pytest.raises(ValueError, match="not a tandem consumer state"):
                c.load_state_dict([1, 2])
            with pytest.raises(ValueError, match="malformed consumer state: it has no seen"):
                c.load_state_dict({k: v for k, v in state.items() if k != "seen"})
            with pytest.raises(ValueError, match="samples must be a list of counts"):
                c.load_state_dict({**state, "samples": [-1]})
            with pytest.raises(ValueError, match="items marked seen for"):
                c.load_state_dict({**state, "samples": [10**9]})
            with pytest.raises(ValueError, match="seen holds 3 bytes for 640 items"):
                c.load_state_dict({**state, "seen": torch.zeros(3, dtype=torch.uint8)})
    # a source without item indices (an iterable one): a count, checked against the epoch
    with serving(Producer.from_dataset(Counted(), "counted", batch_size=10), epochs=None):
        with Consumer("counted") as c:
            it = iter(c)
            next(it), next(it)
            state = c.state_dict()
        assert state["seen"] is None and state["samples"] == [20]
        with Consumer("counted") as c:
            with pytest.raises(
                ValueError, match="10000 samples delivered, but an epoch of this consumer has 80"
            ):
                c.load_state_dict({**state, "samples": [10**4]})
            c.load_state_dict(state)
            assert sum(len(b) for b in c) == 60  # the rest of the epoch
            assert sum(len(b) for b in c) == 80  # then whole epochs


class Counted(torch.utils.data.IterableDataset):
    """80 numbers, the same order every pass, with a stated length."""

    def __iter__(self):
        return iter(range(80))

    def __len__(self) -> int:
        return 80


@pytest.mark.parametrize("batch_size", [32, 20])
def test_a_state_taken_at_an_epochs_end_resumes_the_next_epoch_once(batch_size):
    name = f"end{batch_size}"
    with serving(Producer.from_dataset(Items(), name, batch_size=32, shuffle=True), epochs=None):
        with Consumer(name, batch_size=batch_size) as c:
            it = iter(c)
            for _ in range(len(c)):  # every batch of the epoch; the iterator not yet exhausted
                next(it)
            state = c.state_dict()
        assert state["epoch_done"] and state["seen"] is None
        with Consumer(name, batch_size=batch_size) as resumed:
            resumed.load_state_dict(state)
            assert sorted(i for _, y in resumed for i in y.tolist()) == list(range(N))
            assert sorted(i for _, y in resumed for i in y.tolist()) == list(range(N))


def test_ranks_resume_from_one_merged_state_each_its_share_of_the_unseen_items():
    producer = Producer.from_dataset(Items(), "merged", batch_size=48, shuffle=True)
    with serving(producer, epochs=None):
        ranks = [Consumer("merged", batch_size=16, rank=r, world_size=2, group="g1") for r in (0, 1)]
        its = [iter(c) for c in ranks]
        seen = [i for _ in range(5) for it in its for i in next(it)[1].tolist()]
        state = Consumer.merge_states([c.state_dict() for c in ranks])
        for c in ranks:
            c.close()
        resumed = [Consumer("merged", batch_size=16, rank=r, world_size=2, group="g2") for r in (0, 1)]
        parts: list[list[int]] = [[], []]
        for c in resumed:
            c.load_state_dict(state)  # one state, the same for every rank
        for pair in zip(*resumed):
            for part, (_, y) in zip(parts, pair):
                part.extend(y.tolist())
        assert len(parts[0]) == len(parts[1]) == (N - len(seen)) // 2
        assert sorted(seen + parts[0] + parts[1]) == list(range(N))
        for c in resumed:
            c.close()


LIGHTNING_DDP_RESUME = textwrap.dedent(
    """
    import json, os, sys
    import lightning, torch
    from tandem.share.lightning import SharedDataModule

    out_dir, stop_at, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ckpt = sys.argv[4] if len(sys.argv) > 4 else None

    class Model(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.seen = {}

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.setdefault(self.current_epoch, []).extend(y.tolist())
            return self.layer(x / 640).pow(2).mean()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if stop_at and self.global_step == stop_at:
                self.trainer.save_checkpoint(os.path.join(out_dir, "mid.ckpt"))
                self.trainer.should_stop = True

        def on_train_end(self):
            name = "resumed" if ckpt else "first"
            with open(os.path.join(out_dir, f"{name}{self.global_rank}.json"), "w") as f:
                json.dump(self.seen, f)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = lightning.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=out_dir,
    )
    trainer.fit(Model(), datamodule=SharedDataModule("ddpresume", batch_size=16), ckpt_path=ckpt)
    """
)


def test_lightning_ddp_resumes_every_rank_from_its_checkpoint(tmp_path):
    pytest.importorskip("lightning")
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING_DDP_RESUME)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TANDEM_JOB_ID", None)

    def run(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(240),
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    producer = Producer.from_dataset(Items(), "ddpresume", batch_size=32, shuffle=True)
    with serving(producer, epochs=None):
        run("7", "1")  # 7 of the epoch's 20 steps (16 a rank a step), then a checkpoint
        run("0", "2", str(tmp_path / "mid.ckpt"))
    first = [json.loads((tmp_path / f"first{r}.json").read_text())["0"] for r in (0, 1)]
    resumed = [json.loads((tmp_path / f"resumed{r}.json").read_text()) for r in (0, 1)]
    assert len(first[0]) == len(first[1]) == 7 * 16
    head = first[0] + first[1]
    rest = resumed[0]["0"] + resumed[1]["0"]
    assert len(resumed[0]["0"]) == len(resumed[1]["0"])
    assert sorted(head + rest) == list(range(N))  # exactly the unseen items, once
    whole = resumed[0]["1"] + resumed[1]["1"]
    assert sorted(whole) == list(range(N))  # then whole epochs
