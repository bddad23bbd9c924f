"""The training script of ``benchmarks/dropin.py``: plain PyTorch, its loader either torch's
``DataLoader`` or ``tandem.share.DataLoader`` (``--loader``), nothing else differs.

The dataset (``Spectra``): ``$DROPIN_ITEMS`` synthetic signals of 4,096 samples, each put
through ``$DROPIN_COST`` rounds of a real FFT and its inverse on every read (CPU-costly
items, about 4 ms each on the 2-core development machine); an item is ``(features,
label, index)``. The training: a small MLP, SGD, ``$DROPIN_EPOCHS`` epochs of shuffled
batches of 32, every epoch checked to be every item exactly once (else it fails). Writes
``$DROPIN_OUT/<pid>.json``: start, end, CPU-s of this process, samples per epoch.

    python benchmarks/dropin_trial.py --loader tandem|torch
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn


class Spectra(torch.utils.data.Dataset):
    def __init__(self, items: int, cost: int) -> None:
        self.items, self.cost = items, cost

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        x = np.random.default_rng(i).standard_normal(4096).astype(np.float32)
        for _ in range(self.cost):
            x = np.fft.irfft(np.fft.rfft(x) * 0.999, n=4096).astype(np.float32)
        return torch.from_numpy(np.abs(np.fft.rfft(x))[:128].astype(np.float32)), i % 10, i


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loader", choices=("tandem", "torch"), required=True)
    args = parser.parse_args()
    if args.loader == "tandem":
        from tandem.share import DataLoader
    else:
        from torch.utils.data import DataLoader
    items = int(os.environ.get("DROPIN_ITEMS", "2000"))
    data = Spectra(items, int(os.environ.get("DROPIN_COST", "30")))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    start = time.time()
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    per_epoch = []
    for _ in range(int(os.environ.get("DROPIN_EPOCHS", "2"))):
        seen = []
        for x, y, idx in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(idx)
        got = torch.cat(seen).numpy()
        if len(got) != items or not (np.bincount(got, minlength=items) == 1).all():
            raise SystemExit(f"an epoch was not every item exactly once: {len(got)} samples")
        per_epoch.append(len(got))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = Path(os.environ.get("DROPIN_OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "loader": args.loader,
        "start": start,
        "end": time.time(),
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "samples_per_epoch": per_epoch,
        "is_dataloader": isinstance(loader, torch.utils.data.DataLoader),
    }
    (out / f"{os.getpid()}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
