"""The drop-in is a ``DataLoader`` for Lightning (issue 34): under DDP with 2 ranks on CPU,
Lightning rebuilds it with its ``DistributedSampler``; both ranks read the one producer and
get disjoint halves of every epoch, the whole of it between them. Lightning's own launcher
(it starts rank 1 by running the script again), real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from tests.timing import scaled  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import lightning as L
    from tandem.share import DataLoader

    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.tensor([float(i * i)]), i

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen = {}
        def training_step(self, batch, _):
            x, idx = batch
            assert torch.equal(x[:, 0], (idx * idx).float())  # each item with its own index
            self.seen.setdefault(self.current_epoch, []).extend(idx.tolist())
            return self.layer(x).sum()
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)
        def train_dataloader(self):
            return DataLoader(Squares(), batch_size=4, shuffle=True)
        def on_train_end(self):
            loader = self.trainer.train_dataloader
            out = {"seen": self.seen, "is_dropin": isinstance(loader, DataLoader),
                   "sampler": type(loader.sampler).__name__,
                   "producer": loader._consumer.producer_pid if loader._consumer else None}
            with open(os.path.join(sys.argv[1], f"rank{self.global_rank}.json"), "w") as f:
                json.dump(out, f)

    if __name__ == "__main__":
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.fit(Model())
    """
)


def test_lightning_ddp_injects_its_sampler_and_the_ranks_read_disjoint_halves(
    tmp_path: Path, runtime_dir: str
):
    (tmp_path / "ddp.py").write_text(SCRIPT)
    env = dict(os.environ, TANDEM_SHARE_LINGER_S="1", PYTHONWARNINGS="ignore")
    try:
        done = subprocess.run(
            [sys.executable, "ddp.py", str(tmp_path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(240),
        )
    finally:
        for lock in Path(runtime_dir).glob("auto-*.lock"):  # its producer goes with the test
            try:
                os.kill(int(lock.read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                pass
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["is_dropin"] and rank["sampler"] == "DistributedSampler" and rank["producer"]
    assert ranks[0]["producer"] == ranks[1]["producer"]  # one producer for both ranks
    for epoch in ("0", "1"):
        first, second = (r["seen"][epoch] for r in ranks)
        assert len(first) == len(second) == 32 and not set(first) & set(second)
        assert sorted(first + second) == list(range(64))  # disjoint halves, the whole epoch
