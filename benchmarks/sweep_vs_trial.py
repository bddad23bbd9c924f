"""The trial of ``benchmarks/sweep_vs.py``: one CPU-costly dataset and one training script,
the same under tandem, Ray Tune and submitit.

**The dataset** (``train_set``): ``$SWEEPVS_ITEMS`` synthetic audio clips of
``$SWEEPVS_CLIP_S`` seconds at 16 kHz (a class's two tones plus noise, drawn from the item's
index), each turned into features the way audio pipelines do: a short-time Fourier transform
(512-sample Hann frames, hop 128), power in 64 bands, log, mean and standard deviation over
time: 128 floats. About 1.4 ms of CPU per second of clip on the development machine, in
numpy's single-threaded FFT, every time an item is read. An item is
``(features, label, index)``: the index lets each trial check its epochs.

**The training** (``train``): an MLP (128-256-256-10) trained with SGD at the given learning
rate for ``$SWEEPVS_EPOCHS`` epochs, batches of 64, read either from the tandem share the job
manager names (``Consumer.from_env``) or from a private ``DataLoader`` (shuffled,
``$SWEEPVS_WORKERS`` worker processes). Each epoch's indices must be every item exactly once,
else the trial fails. torch's thread count is left as the arm sets it (recorded). The trial
writes ``$SWEEPVS_OUT/trial-<loader>-lr<lr>.json``: wall-clock start and end, CPU-s of its
loop (its process and reaped children), samples per epoch, the check, the last loss.

    python benchmarks/sweep_vs_trial.py --lr 0.1 [--loader share|private]
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

SAMPLE_RATE = 16_000
CLASSES = 10
BATCH = 64
FEATURES = 128


def config() -> dict[str, float]:
    """The workload's size, from the environment (the same for every arm)."""
    return {
        "items": int(os.environ.get("SWEEPVS_ITEMS", "1500")),
        "clip_s": float(os.environ.get("SWEEPVS_CLIP_S", "2.0")),
        "epochs": int(os.environ.get("SWEEPVS_EPOCHS", "3")),
        "workers": int(os.environ.get("SWEEPVS_WORKERS", "0")),
    }


class AudioFeatures(torch.utils.data.Dataset):
    """Synthetic clips turned into log band-power features on every read (CPU-costly)."""

    def __init__(self, items: int, clip_s: float) -> None:
        self.items, self.samples = items, int(clip_s * SAMPLE_RATE)
        self.window = np.hanning(512).astype(np.float32)
        self.edges = np.linspace(0, 257, 65).astype(int)[:-1]

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        rng = np.random.default_rng([7, index])
        label = index % CLASSES
        t = np.arange(self.samples, dtype=np.float32) / SAMPLE_RATE
        f0 = 200.0 * (1 + label) * (1 + 0.01 * rng.standard_normal())
        x = np.sin(2 * np.pi * f0 * t) + 0.5 * np.sin(2 * np.pi * 2.5 * f0 * t)
        x = x + rng.standard_normal(self.samples).astype(np.float32)
        frames = np.lib.stride_tricks.sliding_window_view(x, 512)[::128] * self.window
        power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
        bands = np.log1p(np.add.reduceat(power, self.edges, axis=1))
        features = np.concatenate([bands.mean(0), bands.std(0)]).astype(np.float32)
        return torch.from_numpy(features), label, index


def train_set() -> AudioFeatures:
    """``tandem share define ... --dataset benchmarks/sweep_vs_trial.py:train_set``."""
    cfg = config()
    return AudioFeatures(int(cfg["items"]), cfg["clip_s"])


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def mlp(lr: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The trial's model (seeded: every arm trains the same one) and its SGD at ``lr``."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES)
    )
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def train(lr: float, loader: str = "private") -> dict:
    """One trial; returns (and writes) what it did. Raises if an epoch was not exact."""
    start, cpu0 = time.time(), _cpu_s()
    cfg = config()
    items, epochs = int(cfg["items"]), int(cfg["epochs"])
    model, opt = mlp(lr)
    if loader == "share":
        from tandem.share import Consumer

        batches = Consumer.from_env(batch_size=BATCH)
    else:
        batches = torch.utils.data.DataLoader(
            train_set(), batch_size=BATCH, shuffle=True, num_workers=int(cfg["workers"])
        )
    per_epoch, exact, loss = [], [], torch.tensor(float("nan"))
    try:
        for _ in range(epochs):
            seen = []
            for x, y, idx in batches:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen.append(idx)
            got = torch.cat(seen).numpy() if seen else np.zeros(0, dtype=np.int64)
            per_epoch.append(len(got))
            exact.append(len(got) == items and bool((np.bincount(got, minlength=items) == 1).all()))
    finally:
        if loader == "share":
            batches.close()
    result = {
        "lr": lr,
        "loader": loader,
        "pid": os.getpid(),
        "start": start,
        "end": time.time(),
        "loop_cpu_s": _cpu_s() - cpu0,
        # the whole process's so far (its interpreter and imports too): a trial's own cost, where
        # the process is the trial's alone (not a Ray worker's, which may run others)
        "process_cpu_s": _cpu_s(),
        "torch_threads": torch.get_num_threads(),
        "samples_per_epoch": per_epoch,
        "exact": exact,
        "loss": float(loss.detach()),
    }
    out = Path(os.environ.get("SWEEPVS_OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"trial-{loader}-lr{lr:g}.json").write_text(json.dumps(result))
    if len(exact) != epochs or not all(exact):
        raise RuntimeError(f"lr {lr}: epochs not exact: {per_epoch} samples (of {items}), exact {exact}")
    return result


def ray_trainable(config: dict) -> None:
    """Ray Tune's function trainable: the same trial with a private DataLoader."""
    from ray import tune

    result = train(float(config["lr"]), "private")
    tune.report({"loss": result["loss"], "exact": all(result["exact"])})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--loader", choices=["share", "private"], default=None,
                    help="default: share when the job manager names one ($TANDEM_SHARE)")  # fmt: skip
    args = ap.parse_args()
    loader = args.loader or ("share" if os.environ.get("TANDEM_SHARE") else "private")
    r = train(args.lr, loader)
    print(f"lr {args.lr:g}: epochs {r['samples_per_epoch']} exact, loss {r['loss']:.3f}", flush=True)


if __name__ == "__main__":
    main()
