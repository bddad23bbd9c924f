"""The ranks of one job: each gets a disjoint part of every epoch, together every item once
(the last ``n % W`` dropped), the same number of batches each; Lightning's DDP on CPU too."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tandem.share import Consumer, Producer
from tests.share.serving import serving
from tests.timing import scaled


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((8,), float(i)), i


@pytest.mark.parametrize(("n", "batch_size"), [(640, 32), (643, 20), (640, None)])
def test_two_ranks_get_disjoint_parts_that_cover_every_epoch(n, batch_size):
    name = f"ranks{n}{batch_size}"
    producer = Producer.from_dataset(Items(n), name, batch_size=48, shuffle=True, window=4)
    with serving(producer, epochs=3):
        c0 = Consumer(name, batch_size=batch_size, rank=0, world_size=2, group="g")
        c1 = Consumer(name, batch_size=batch_size, rank=1, world_size=2, group="g")
        with c0, c1:
            for _epoch in range(3):
                parts: list[list[int]] = [[], []]
                # in step, as DDP ranks go: the group moves at its slowest rank's pace
                for pair in itertools.zip_longest(c0, c1):
                    for labels, batch in zip(parts, pair):
                        if batch is not None:
                            x, y = batch
                            assert torch.equal(x[:, 0].long(), y)
                            labels.extend(y.tolist())
                assert len(parts[0]) == len(parts[1]) == n // 2
                assert not set(parts[0]) & set(parts[1])
                assert len(set(parts[0]) | set(parts[1])) == n // 2 * 2
            if batch_size is not None:
                assert len(c0) == len(c1) == -(-(n // 2) // batch_size)


def test_a_rank_that_joins_late_gets_the_same_epochs_as_the_first():
    producer = Producer.from_dataset(Items(400), "late", batch_size=40, shuffle=True, window=8)
    with serving(producer, epochs=2):
        first = Consumer("late", batch_size=40, rank=1, world_size=2, group="job")
        it = iter(first)
        # rank 1 is two batches in (a window of 8 holds the four producer batches they took)
        got = [next(it)[1] for _ in range(2)]
        with Consumer("late", batch_size=40, rank=0, world_size=2, group="job") as second:
            assert second.start == first.start
            zero = []
            for mine, theirs in itertools.zip_longest(second, it):
                if mine is not None:
                    zero.extend(mine[1].tolist())
                if theirs is not None:
                    got.append(theirs[1])
        one = torch.cat(got).tolist()
        first.close()
    assert len(zero) == len(one) == 200
    assert sorted(zero + one) == list(range(400))


def test_bad_rank_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="both rank and world_size"):
        Consumer("x", rank=0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        Consumer("x", rank=2, world_size=2, group="g")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TANDEM_JOB_ID", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
    }
    code = (
        "from tandem.share import Consumer\n"
        "try:\n    Consumer('x', rank=0, world_size=2)\nexcept ValueError as e:\n    print(e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=scaled(60)
    )
    assert "name their group alike" in out.stdout


LIGHTNING_DDP = textwrap.dedent(
    """
    import json, os, sys
    import lightning, torch
    from tandem.share import Consumer

    out_dir = sys.argv[1]

    class Model(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.seen = {}

        def train_dataloader(self):
            return Consumer("ddp", batch_size=16)  # rank and world size from torch.distributed

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.setdefault(self.current_epoch, []).extend(y.tolist())
            return self.layer(x / 640).pow(2).mean()

        def on_train_end(self):
            with open(os.path.join(out_dir, f"rank{self.global_rank}.json"), "w") as f:
                json.dump(self.seen, f)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = lightning.Trainer(
        max_epochs=2, accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=out_dir,
    )
    trainer.fit(Model())
    """
)


def run_lightning_ddp(script: Path, tmp_path: Path) -> list[dict]:
    """Run a 2-rank Lightning script (``LIGHTNING_DDP`` or a variant) against a producer
    already serving; each rank's items per epoch, as it wrote them."""
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TANDEM_JOB_ID", None)
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(240),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_lightning_ddp_on_cpu_sees_each_item_once_per_epoch_across_two_ranks(tmp_path):
    pytest.importorskip("lightning")

    script = tmp_path / "train_ddp.py"
    script.write_text(LIGHTNING_DDP)
    producer = Producer.from_dataset(Items(640), "ddp", batch_size=32, shuffle=True)
    with serving(producer, epochs=2):
        ranks = run_lightning_ddp(script, tmp_path)
    for epoch in ("0", "1"):
        a, b = ranks[0][epoch], ranks[1][epoch]
        assert len(a) == len(b) == 320
        assert sorted(a + b) == list(range(640))
