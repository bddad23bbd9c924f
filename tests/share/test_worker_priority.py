"""The producer's loader workers: the jobs' CPU priority by default (lower when told), and how
many of them when not told."""

from __future__ import annotations

import math
import os

import pytest
import torch

from tandem.share._order import planned_loader
from tandem.share._workers import MAX_AUTO_WORKERS, auto_workers


class NiceDataset(torch.utils.data.Dataset):
    """Each sample is the niceness of the process that loaded it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([os.nice(0)])


def _niceness_of_loaded(**kwargs) -> set[int]:
    loader, planner = planned_loader(NiceDataset(), 2, False, 1, None, 0, None, **kwargs)
    planner.begin(0, (), None)
    values = {int(v) for batch in loader for v in batch.flatten()}
    del loader  # persistent workers end with their loader
    return values


def test_workers_run_at_the_jobs_priority_by_default() -> None:
    # not lower: jobs that wait for their batches gain nothing when the workers lose the cores
    base = os.nice(0)
    assert _niceness_of_loaded() == {base}
    assert _niceness_of_loaded(worker_nice=10) == {min(19, base + 10)}
    assert _niceness_of_loaded(worker_nice=3) == {min(19, base + 3)}
    assert _niceness_of_loaded(worker_nice=0) == {base}
    assert os.nice(0) == base  # the producer itself keeps its priority


def test_auto_workers() -> None:
    assert auto_workers(reserved_cpus=3) == 2  # the producer's own thread takes one core
    cores = len(os.sched_getaffinity(0))
    # one core reserved: the producer's thread; still a worker where there are two cores, so
    # that decoding runs at one torch thread, not spinning the default's against the jobs
    assert auto_workers(reserved_cpus=1) == (1 if cores >= 2 else 0)
    assert auto_workers(reserved_cpus=2.5) == 2
    assert auto_workers(reserved_cpus=64) == MAX_AUTO_WORKERS
    free = auto_workers()  # from what the jobs leave free now
    assert (1 if cores >= 2 else 0) <= free <= min(MAX_AUTO_WORKERS, max(0, cores - 1))
    assert math.isfinite(free)


def test_bad_worker_counts() -> None:
    for bad in (-1, "many", 1.5, True):
        with pytest.raises(ValueError, match="non-negative integer or 'auto'"):
            planned_loader(NiceDataset(), 2, False, bad, None, 0, None)
