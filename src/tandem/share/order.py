"""Epochs and positions: how late joiners see every sample exactly once.

Positions in the producer's stream are ``(epoch, offset)`` pairs, ``offset`` counting samples
from the start of the producer's epoch. A consumer that attaches at ``(e, p)`` has epochs
``[(e, p), (e+1, p))``, ``[(e+1, p), (e+2, p))``, ...: each as long as the dataset, wrapping
into the producer's next epoch. A consumer attached at an epoch's start has ``p == 0`` and
its epochs are the producer's.

With :meth:`Producer.from_dataset` the producer owns the order. Every live consumer's join
point ``p > 0`` is a *cut*. Epoch ``e+1``'s order is epoch ``e``'s order with each segment
between consecutive cuts shuffled on its own: for a cut at ``p``, the next epoch's first
``p`` samples are a fresh shuffle of this epoch's first ``p``, and the rest a fresh shuffle
of the rest. Each epoch is still a full permutation, and every consumer's own epoch (the
tail of one producer epoch plus the head of the next) holds every sample exactly once. When
a consumer leaves, its cut goes with it.

With a plain iterable source the producer cannot choose the order: the wrap-around still
gives a late joiner as many samples as an epoch has, exactly once each if the source yields
the same set every epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch.utils.data


def plan_epoch(
    previous: np.ndarray | None,
    size: int,
    cuts: Iterable[int],
    shuffle: bool,
    seed: int,
    epoch: int,
) -> np.ndarray:
    """The sample order of ``epoch``, given the previous epoch's order and the live cuts."""
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    if previous is None:
        return rng.permutation(size).astype(np.int64)
    bounds = sorted({0, size, *(c for c in cuts if 0 < c < size)})
    parts = [rng.permutation(previous[a:b]) for a, b in zip(bounds, bounds[1:])]
    return np.concatenate(parts).astype(np.int64) if parts else previous.copy()


class PlannedSampler(torch.utils.data.Sampler[int]):
    """A sampler whose order the producer sets before each epoch (and may cut short)."""

    def __init__(self, size: int):
        self.size = size
        self.order: np.ndarray = np.arange(size, dtype=np.int64)
        self.limit = size

    def __iter__(self) -> Iterator[int]:
        return iter(self.order[: self.limit].tolist())

    def __len__(self) -> int:
        return self.limit


Position = tuple[int, int]


def epoch_bounds(start: Position, k: int) -> tuple[Position, Position]:
    """The producer positions ``[begin, end)`` of a consumer's ``k``-th epoch."""
    epoch, offset = start
    return (epoch + k, offset), (epoch + k + 1, offset)
