"""Loaders a library built, read through to their options: :func:`shared`.

timm's ``create_loader``, Accelerate's ``prepare`` and so the Hugging Face ``Trainer`` hand
back a ``torch.utils.data.DataLoader`` (or their own subclass of it) built from the dataset
and options they were given. :func:`shared` makes a drop-in
:class:`~tandem.share.loader.DataLoader` of it with the same dataset, collate and
worker-init functions, order and batch size, so that it reads from the host's one producer
of that data.

Accelerate's prepared loader (``DataLoaderShard``) is read through: it keeps its batches in a
batch sampler (a ``BatchSampler`` of the user's sampler), under several processes wrapped in
a ``BatchSamplerShard`` that deals each process its own batches. The sampler and batch size
inside are the order options; the processes are ranks (a ``DistributedSampler`` of the same
shuffle: each rank reads its own part of every epoch, as under Lightning's DDP); with
``split_batches`` each process's batch is its share of the batch. Its ``device`` is where
the drop-in moves each batch, as ``DataLoaderShard`` did. A batch sampler of any other kind
is not reproduced by a producer: the loader then reads privately and says why.
"""

from __future__ import annotations

from typing import Any

import torch.utils.data as tud

from tandem.share.loader import DataLoader


def shared(loader: tud.DataLoader, share: bool = True) -> DataLoader:
    """A drop-in loader with the options of ``loader`` (one a library built)."""
    if isinstance(loader, DataLoader):
        return loader
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    order = _order_of(loader)
    if order is None:  # a batch sampler of its own (torch takes it without a batch size)
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        sampler, batch_size, drop_last = order
        kwargs.update(batch_size=batch_size, drop_last=drop_last, sampler=sampler)
    return DataLoader(loader.dataset, share=share, device=_device_of(loader), **kwargs)


def _order_of(loader: tud.DataLoader) -> tuple[Any, int, bool] | None:
    """``(sampler, batch size, drop_last)`` of ``loader``, through a plain ``BatchSampler``
    and Accelerate's ``BatchSamplerShard`` (as ranks); None: a batch sampler of its own."""
    if loader.batch_size is not None:
        return loader.sampler, loader.batch_size, loader.drop_last
    batches: Any = loader.batch_sampler
    shard: Any = batches if _is_accelerate_shard(batches) else None
    if shard is not None:
        batches = shard.batch_sampler
    if type(batches) is not tud.BatchSampler:  # a subclass may batch in its own way
        return None
    sampler, batch_size, drop_last = batches.sampler, int(batches.batch_size), bool(batches.drop_last)
    if shard is None or int(shard.num_processes) == 1:
        return sampler, batch_size, drop_last
    processes = int(shard.num_processes)
    if not _plain_order(sampler):  # its ranks' parts are not a DistributedSampler's: private
        return None
    if shard.split_batches:  # each process reads its share of every batch
        batch_size //= processes
    ranks: tud.DistributedSampler[Any] = tud.DistributedSampler(
        loader.dataset,
        num_replicas=processes,
        rank=int(shard.process_index),
        shuffle=isinstance(sampler, tud.RandomSampler),
        drop_last=drop_last,
    )
    return ranks, batch_size, drop_last


def _is_accelerate_shard(batches: object) -> bool:
    """Accelerate's ``BatchSamplerShard`` (by its attributes: tandem does not import it)."""
    names = ("batch_sampler", "num_processes", "process_index", "split_batches")
    return all(hasattr(batches, name) for name in names)


def _plain_order(sampler: object) -> bool:
    """In order, or a permutation each epoch (Accelerate's ``SeedableRandomSampler`` too)."""
    if isinstance(sampler, tud.RandomSampler):
        return not sampler.replacement and sampler._num_samples is None
    return isinstance(sampler, tud.SequentialSampler)


def _device_of(loader: tud.DataLoader) -> Any:
    """Where Accelerate's prepared loader put its batches (None: a CPU, or not said)."""
    device = getattr(loader, "device", None)
    if device is None or str(device) == "cpu":
        return None
    return device
