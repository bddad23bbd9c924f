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

import functools
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch.utils.data

from tandem.share._workers import auto_workers
from tandem.share.errors import ShareError


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


class EpochPlanner:
    """The sample order of a producer that owns it: one plan per epoch, cut by join points."""

    def __init__(self, sampler: PlannedSampler, shuffle: bool, seed: int):
        self.sampler = sampler
        self.shuffle = shuffle
        self.seed = seed
        self._order: np.ndarray | None = None

    def begin(self, epoch: int, cuts: Iterable[int], limit: int | None) -> None:
        """Plan ``epoch``; with ``limit``, only its first ``limit`` samples are served."""
        self._order = plan_epoch(self._order, self.sampler.size, cuts, self.shuffle, self.seed, epoch)
        self.sampler.order = self._order
        self.sampler.limit = self.sampler.size if limit is None else limit

    def count(self, batch_size: int, offset: int) -> int:
        """Samples in the batch at ``offset`` (the last one may be partial)."""
        return min(batch_size, self.sampler.limit - offset)


def lower_priority(increment: int, _worker_id: int) -> None:
    """A loader worker's ``worker_init_fn``: run ``increment`` nice levels below the producer,
    so that decoding yields the cores to the training processes' kernel-launch threads (+4%
    at ResNet-50 measured on an H100 machine). Module-level: picklable for spawned workers."""
    try:
        os.nice(increment)
    except OSError:
        pass


def _init_worker(nice: int | None, user_init: Callable[[int], None] | None, worker_id: int) -> None:
    if nice:
        lower_priority(nice, worker_id)
    if user_init is not None:
        user_init(worker_id)


def planned_loader(
    dataset: torch.utils.data.Dataset,
    batch_size: int,
    shuffle: bool,
    num_workers: int | str,
    collate_fn: Any,
    seed: int,
    prefetch_factor: int | None,
    worker_nice: int | None = 0,
    pin_memory: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
) -> tuple[torch.utils.data.DataLoader, EpochPlanner | None]:
    """A ``DataLoader`` over ``dataset`` whose order an :class:`EpochPlanner` sets (None for
    an ``IterableDataset``: its passes are the epochs, in the order it yields them).
    ``num_workers="auto"``: :func:`auto_workers`. ``worker_nice``: how much lower the workers'
    CPU priority is (None or 0: the same). ``pin_memory``: batches go to a GPU next.
    ``worker_init_fn``: run in each worker as it starts, as ``DataLoader`` runs it."""
    if num_workers == "auto":
        num_workers = auto_workers()
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
        raise ValueError(f"num_workers must be a non-negative integer or 'auto', got {num_workers!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    if iterable:
        if shuffle:
            raise ValueError(
                "shuffle=True needs a map-style dataset (the producer then owns the order); an "
                "IterableDataset shuffles itself (webdataset: .shuffle(1000); Hugging Face: "
                ".shuffle(buffer_size=1000))"
            )
        size = 0
    else:
        try:
            size = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"from_dataset needs a map-style dataset with __len__ or a torch IterableDataset; "
                f"{type(dataset).__name__} is neither (an iterable of batches goes to Producer(source, name))"
            ) from None
    loader_kwargs: dict[str, Any] = {}
    if num_workers > 0:
        loader_kwargs["persistent_workers"] = True
        if worker_nice or worker_init_fn is not None:
            loader_kwargs["worker_init_fn"] = functools.partial(_init_worker, worker_nice, worker_init_fn)
        if prefetch_factor is not None:
            loader_kwargs["prefetch_factor"] = prefetch_factor
    # An iterable dataset: one pass is an epoch, in its own order (see the module docstring);
    # a map-style one: the order the planner sets.
    sampler = None if iterable else PlannedSampler(size)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        drop_last=False,
        pin_memory=pin_memory,
        **loader_kwargs,
    )
    if sampler is None:
        return loader, None
    return loader, EpochPlanner(sampler, shuffle, seed)


def source_shape(source: object) -> tuple[int | None, int | None]:
    """``(batch_size, samples_per_epoch)`` of a ``DataLoader`` when they are fixed, else Nones
    (an iterable dataset's epoch length is then counted at the end of the first pass)."""
    try:
        batch_size = source.batch_size  # type: ignore[attr-defined]
        drop_last = source.drop_last  # type: ignore[attr-defined]
        dataset = source.dataset  # type: ignore[attr-defined]
        if isinstance(dataset, torch.utils.data.IterableDataset):
            return batch_size, _given_length(dataset)
        return batch_size, len(source) * batch_size if drop_last else len(source.sampler)  # type: ignore
    except (AttributeError, TypeError):
        return None, None


def _given_length(dataset: torch.utils.data.IterableDataset) -> int | None:
    """The length an iterable dataset states (webdataset's ``with_length(n)``), if any."""
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return None
    return n if isinstance(n, int) and n > 0 else None


Position = tuple[int, int]


def epoch_bounds(start: Position, k: int) -> tuple[Position, Position]:
    """The producer positions ``[begin, end)`` of a consumer's ``k``-th epoch."""
    epoch, offset = start
    return (epoch + k, offset), (epoch + k + 1, offset)


def selected(dataset: torch.utils.data.Dataset, selection: Any) -> torch.utils.data.Dataset:
    """``dataset`` restricted to ``selection``'s items: a sequence of item indices, an object
    with ``indices`` (a :class:`tandem.select.Selection`, whose ``check(dataset)`` refuses a
    dataset it was not made of), or a function of the dataset that returns either (a
    selection made when the producer starts). Share knows nothing of how it was made."""
    if callable(selection) and not hasattr(selection, "indices"):
        selection = selection(dataset)
    if isinstance(selection, (str, bytes)):
        raise TypeError(
            f"selection={selection!r}: give the items, not an id: tandem.select.load(ID), or item indices"
        )
    check = getattr(selection, "check", None)
    if callable(check):
        try:
            check(dataset)
        except Exception as exc:  # its own error type: share does not import tandem.select
            raise ShareError(str(exc)) from None
    indices = [int(i) for i in getattr(selection, "indices", selection)]
    size = len(dataset)  # type: ignore[arg-type]
    outside = next((i for i in indices if not 0 <= i < size), None)
    if outside is not None:
        raise ShareError(f"selection: item {outside} is not in the dataset ({size} items)")
    if not indices:
        raise ShareError("selection: it holds no items")
    return torch.utils.data.Subset(dataset, indices)


def fingerprint(dataset: Any) -> str:
    """A short fingerprint of a map-style dataset, for a consumer's state to name what it is
    of: its class, length and, where it has them, the items a ``Subset`` keeps (a selection),
    a Hugging Face dataset's own fingerprint and an image folder's root and files. Read
    without loading an item (items may be random: augmented)."""
    digest = hashlib.sha256()
    for _ in range(16):  # Subsets of Subsets
        digest.update(f"{type(dataset).__module__}.{type(dataset).__qualname__}:".encode())
        try:
            digest.update(str(len(dataset)).encode())
        except TypeError:
            pass
        for attribute in ("_fingerprint", "root", "samples", "files"):
            value = getattr(dataset, attribute, None)
            if isinstance(value, (str, os.PathLike)):
                digest.update(os.fsencode(value))
            elif isinstance(value, list):  # paths (and labels): an image folder's 1.2M in a second
                for i in range(0, len(value), 65536):
                    digest.update("\n".join(map(repr, value[i : i + 65536])).encode())
        if not isinstance(dataset, torch.utils.data.Subset):
            break
        digest.update(np.asarray(dataset.indices, dtype=np.int64).tobytes())
        dataset = dataset.dataset
    return digest.hexdigest()[:16]
