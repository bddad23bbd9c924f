"""The consumer's contract with the clients that use it: a batch stays valid while the next
one is fetched (one-ahead, across epoch boundaries), and one kept longer is copied out
before its memory is reused, never overwritten. Lightning itself is one of the clients."""

from __future__ import annotations

import gc

import pytest
import torch

from tandem.share import BatchKeptWarning, Consumer, Producer
from tests.share.serving import serving

N = 2400


class Numbered(torch.utils.data.Dataset):
    """Item i is a vector of i's and its label i: a batch overwritten by a later one shows."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.full((64,), float(i)), i


def _wrong(batch) -> int:
    x, y = batch
    return int((x[:, 0].long() != y).sum()) + int((x[:, -1].long() != y).sum())


@pytest.mark.parametrize("batch_size", [None, 16, 48])
def test_a_one_ahead_loop_across_epochs_sees_no_overwritten_sample(batch_size):
    # window=3 on a slab that wraps every few batches: the producer reuses slots at once.
    producer = Producer.from_dataset(Numbered(), f"oa{batch_size}", batch_size=32, shuffle=True, window=3)
    with serving(producer, epochs=3), Consumer(f"oa{batch_size}", batch_size=batch_size) as c:
        wrong = seen = 0
        previous = None
        for _ in range(3):
            for batch in c:  # holds the previous batch while taking this one, as Lightning does
                if previous is not None:
                    wrong += _wrong(previous)
                    seen += len(previous[1])
                previous = batch
        wrong += _wrong(previous)
        seen += len(previous[1])
        assert seen == 3 * N
        assert wrong == 0
        assert c.kept_batches == 0  # the contract held: nothing needed copying out


def test_a_batch_kept_past_the_contract_is_copied_out_not_overwritten():
    producer = Producer.from_dataset(Numbered(), "kept", batch_size=32, window=2)
    with serving(producer, epochs=2), Consumer("kept") as c:
        kept = []
        with pytest.warns(BatchKeptWarning, match="clone_batch"):
            for _ in range(2):
                kept.extend(c)  # every batch of two epochs, held to the end
        assert len(kept) == 2 * N // 32
        assert sum(_wrong(b) for b in kept) == 0
        assert c.kept_batches >= len(kept) - 2
        labels = torch.cat([b[1] for b in kept[: N // 32]])
        assert sorted(labels.tolist()) == list(range(N))


def test_batches_kept_after_the_consumer_closes_keep_their_data():
    producer = Producer.from_dataset(Numbered(), "after", batch_size=32, window=3)
    with serving(producer, epochs=2) as errors:
        c = Consumer("after")
        it = iter(c)
        last_two = [next(it), next(it)]
        c.close()
        other = Consumer("after")  # the producer reuses the slots for this one
        assert sum(len(b[1]) for b in other) == N
        other.close()
        assert sum(_wrong(b) for b in last_two) == 0
        assert not errors


def test_lightning_fit_on_a_consumer_without_len_trains_on_no_overwritten_sample(tmp_path):
    lightning = pytest.importorskip("lightning")

    class NoLen:
        """A wrapper Lightning cannot take a length of: it fetches one batch ahead."""

        def __init__(self, consumer):
            self.consumer = consumer

        def __iter__(self):
            return iter(self.consumer)

    class Model(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 1)
            self.wrong = 0
            self.seen = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.wrong += _wrong(batch)
            self.seen += len(y)
            return self.layer(x / N).pow(2).mean()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            # the batch Lightning hands back after the step, with the next one fetched already
            self.wrong += _wrong(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    producer = Producer.from_dataset(Numbered(), "lit", batch_size=40, shuffle=True, window=3)
    with serving(producer, epochs=3), Consumer("lit", batch_size=32) as c:
        model = Model()
        trainer = lightning.Trainer(
            max_epochs=3,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(model, train_dataloaders=NoLen(c))
        assert model.seen == 3 * N
        assert model.wrong == 0
    gc.collect()
