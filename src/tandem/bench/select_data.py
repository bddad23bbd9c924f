"""Small datasets with a planted truth, made here (nothing downloaded), and a proxy model:
the workloads of the select benchmark and of its tests."""

from __future__ import annotations

import numpy as np
import torch


class Blobs(torch.utils.data.Dataset):
    """Gaussian blobs, ``classes`` classes in 20 dimensions; a ``noise`` fraction of labels
    flipped to another class (``flipped`` says which); ``domain`` shifts every blob."""

    def __init__(
        self,
        n: int = 1500,
        noise: float = 0.5,
        seed: int = 0,
        classes: int = 10,
        domain: float = 0.0,
        spread: float = 1.0,
    ) -> None:
        rng = np.random.default_rng(seed)
        centers = np.random.default_rng(1234).normal(0, 3, (classes, 20)) + domain
        self.true = rng.integers(0, classes, n)
        self.x = (centers[self.true] + rng.normal(0, spread, (n, 20))).astype(np.float32)
        self.flipped = rng.random(n) < noise
        self.y = np.where(self.flipped, (self.true + rng.integers(1, classes, n)) % classes, self.true)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.x[i]), int(self.y[i])


class Mixture(torch.utils.data.Dataset):
    """Two domains of clean blobs with different class layouts; ``domain_b`` says which
    item is from the second."""

    def __init__(self, n: int = 1200, seed: int = 0) -> None:
        a, b = Blobs(n // 2, 0.0, seed), Blobs(n - n // 2, 0.0, seed + 1, domain=4.0)
        b.y = (b.y + 3) % 10  # the same inputs' neighbourhoods mean other classes there
        self.x = np.concatenate([a.x, b.x])
        self.y = np.concatenate([a.y, b.y])
        self.domain_b = np.concatenate([np.zeros(len(a), bool), np.ones(len(b), bool)])

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.x[i]), int(self.y[i])


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def noisy() -> Blobs:
    return Blobs()


def target_a() -> Blobs:
    return Blobs(200, 0.0, seed=7)
