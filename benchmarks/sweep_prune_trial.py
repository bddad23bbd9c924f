"""The trial of ``benchmarks/sweep_prune.py``: the README's sweep script, as a user writes it,
with a dataset whose items cost CPU, under tandem and under Ray Tune.

The README's shape: a plain PyTorch loop whose ``DataLoader`` is tandem's drop-in
(``from tandem.share import DataLoader``: under the job manager it reads the producer the
daemon starts for its data), shuffled batches of 64, and each epoch's loss logged with
``mlflow.log_metric("loss", ..., step=epoch)`` into the run tandem made for the job. The
dataset is ``benchmarks/sweep_vs_trial.py``'s CPU-costly audio features; the model its
MLP, trained with SGD at ``--lr``. Under Ray Tune (:func:`ray_trainable`) the same loop reads
a private ``torch.utils.data.DataLoader`` and reports the loss with ``tune.report`` each
epoch, which ASHA judges.

After each epoch it writes ``$SWEEPVS_OUT/trial-lr<lr>.json`` (its start, the end of its last
epoch, the epochs done and whether each was the dataset exactly once), so that a trial
stopped early leaves what it did.

    python benchmarks/sweep_prune_trial.py 0.1
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from sweep_vs_trial import BATCH, config, mlp, train_set
from torch import nn


def train(lr: float, loader_class: type, report: Callable[[int, float], None]) -> None:
    start = time.time()
    cfg = config()
    items, epochs = int(cfg["items"]), int(cfg["epochs"])
    model, opt = mlp(lr)
    loader = loader_class(train_set(), batch_size=BATCH, shuffle=True)
    out = Path(os.environ.get("SWEEPVS_OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    exact: list[bool] = []
    for epoch in range(epochs):
        seen, total, batches = [], 0.0, 0
        for x, y, idx in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(idx)
            total, batches = total + float(loss.detach()), batches + 1
        got = torch.cat(seen).numpy()
        exact.append(len(got) == items and bool((np.bincount(got, minlength=items) == 1).all()))
        mean = total / max(1, batches)
        record = {
            "lr": lr,
            "start": start,
            "end": time.time(),
            "epochs": epoch + 1,
            "exact": exact,
            "loss": mean,
        }
        part = out / f".trial-lr{lr:g}.json.{os.getpid()}"  # whole or not at all: it may be stopped
        part.write_text(json.dumps(record))
        os.replace(part, out / f"trial-lr{lr:g}.json")
        report(epoch, mean)
    if not all(exact):
        raise RuntimeError(f"lr {lr}: an epoch was not the dataset exactly once: {exact}")


def ray_trainable(config: dict) -> None:
    """Ray Tune's function trainable: the same loop, a private DataLoader, tune.report."""
    from ray import tune

    train(float(config["lr"]), torch.utils.data.DataLoader, lambda _e, loss: tune.report({"loss": loss}))


def main() -> None:
    import mlflow

    from tandem.share import DataLoader  # in place of: from torch.utils.data import DataLoader

    lr = float(sys.argv[1])
    train(lr, DataLoader, lambda epoch, loss: mlflow.log_metric("loss", loss, step=epoch))
    print(f"lr {lr:g}: done", flush=True)


if __name__ == "__main__":
    main()
