"""Consumers that come and go: one dropped or closed mid-epoch stops holding the group at
once; a resumed one (``state_dict``) finishes its interrupted epoch with exactly the items it
had not seen; a per-consumer ``transform``; a Lightning DataModule that makes a new consumer
every epoch runs to the end."""

from __future__ import annotations

import pytest
import torch

from tandem.share import Consumer, Producer
from tests.share.conftest import wait_for
from tests.share.serving import serving

N = 640


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.full((4,), float(i)), i


def quiet_trainer(lightning, root, epochs: int, **kwargs):
    """A CPU Trainer that logs, checkpoints and prints nothing."""
    return lightning.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kwargs,
    )


def test_a_consumer_dropped_mid_epoch_stops_holding_the_group_at_once():
    producer = Producer.from_dataset(Items(), "dropped", batch_size=32, window=3)
    with serving(producer, epochs=4):
        stays = Consumer("dropped", batch_size=32)
        leaves = Consumer("dropped", batch_size=32)
        it = iter(leaves)
        next(it), next(it)
        del leaves, it  # no close(), no garbage collection: the last reference goes
        wait_for(lambda: len(producer._server.consumers) == 1, 10, what="the dropped consumer detached")
        assert sum(len(y) for _, y in stays) == N  # the window of 3 did not wait for it
        stays.close()


@pytest.mark.parametrize("batch_size", [32, 20])
def test_a_resumed_consumer_finishes_its_epoch_with_exactly_the_unseen_items(batch_size):
    name = f"resume{batch_size}"
    producer = Producer.from_dataset(Items(), name, batch_size=32, shuffle=True)
    with serving(producer, epochs=None):
        first = Consumer(name, batch_size=batch_size)
        seen = []
        for i, (_, y) in enumerate(first):
            seen.extend(y.tolist())
            if i == 13:
                break
        state = first.state_dict()
        first.close()
        resumed = Consumer(name, batch_size=batch_size)
        resumed.load_state_dict(state)
        rest = [i for _, y in resumed for i in y.tolist()]
        assert sorted(seen + rest) == list(range(N))  # each item once in the interrupted epoch
        assert resumed.state_dict()["seen"] is None  # between epochs: nothing to resume
        whole = sorted(i for _, y in resumed for i in y.tolist())
        assert whole == list(range(N))  # then whole epochs again
        resumed.close()


def test_a_transform_runs_on_each_consumers_batches():
    producer = Producer.from_dataset(Items(), "tf", batch_size=32)
    with serving(producer, epochs=1):
        plain = Consumer("tf", batch_size=32)
        scaled = Consumer("tf", batch_size=32, transform=lambda b: (b[0] * 2 - 1, b[1]))
        with plain, scaled:
            for (x, y), (x2, y2) in zip(plain, scaled):
                assert torch.equal(y, y2) and torch.equal(x2, x * 2 - 1)
    with pytest.raises(TypeError, match="transform must be callable"):
        Consumer("tf", transform=3)


def test_a_datamodule_that_makes_a_new_consumer_every_epoch_runs_to_the_end(tmp_path):
    lightning = pytest.importorskip("lightning")

    class Data(lightning.LightningDataModule):
        def train_dataloader(self):
            return Consumer("reload", batch_size=32)

    class Model(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.per_epoch: dict[int, list[int]] = {}

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.per_epoch.setdefault(self.current_epoch, []).extend(y.tolist())
            return self.layer(x / N).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    producer = Producer.from_dataset(Items(), "reload", batch_size=32, shuffle=True, window=3)
    with serving(producer, epochs=None):
        model = Model()
        quiet_trainer(lightning, tmp_path, 4, reload_dataloaders_every_n_epochs=1).fit(
            model, datamodule=Data()
        )
    assert sorted(model.per_epoch) == [0, 1, 2, 3]
    for labels in model.per_epoch.values():
        assert sorted(labels) == list(range(N))


def test_lightning_resumed_mid_epoch_trains_on_exactly_the_unseen_items(tmp_path):
    lightning = pytest.importorskip("lightning")
    from tandem.share.lightning import SharedDataModule

    class Model(lightning.LightningModule):
        def __init__(self, stop_at: int | None = None):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.labels: list[int] = []
            self.stop_at = stop_at

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.labels.extend(y.tolist())
            return self.layer(x / N).pow(2).mean()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if self.stop_at is not None and self.global_step == self.stop_at:
                self.trainer.save_checkpoint(tmp_path / "mid.ckpt")
                self.trainer.should_stop = True

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def trainer(epochs):
        return quiet_trainer(lightning, tmp_path, epochs)

    producer = Producer.from_dataset(Items(), "litresume", batch_size=32, shuffle=True)
    with serving(producer, epochs=None):
        first = Model(stop_at=14)  # 14 of the epoch's 20 steps, then a checkpoint
        trainer(1).fit(first, datamodule=SharedDataModule("litresume", batch_size=32))
        assert len(first.labels) == 14 * 32
        resumed = Model()
        trainer(2).fit(
            resumed, datamodule=SharedDataModule("litresume", batch_size=32), ckpt_path=tmp_path / "mid.ckpt"
        )
    head, rest = first.labels, resumed.labels[: N - 14 * 32]
    assert sorted(head + rest) == list(range(N))  # the interrupted epoch, each item once
    assert sorted(resumed.labels[N - 14 * 32 :]) == list(range(N))  # then a whole epoch
