"""Consumers at their own pace: a window sized by memory lets a fast consumer run ahead of a
slow one by as many batches as the bound holds (not 8), says how far apart they are in
``tandem share ls``, and makes the fast one wait only where the bound is reached; every
epoch stays exact for both."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tandem.share import Consumer, ConsumerTimeout, Producer
from tandem.share._slab import MIN_SEGMENT
from tandem.share.stats import query_all
from tests.timing import scaled

from .serving import serving
from .workers import RangeDataset

ITEMS, BATCH = 240, 4  # 60 batches of a few bytes: each takes one slot of MIN_SEGMENT


def _stats(name: str):
    return next(r for r in query_all(scaled(2)) if not isinstance(r, dict) and r.name == name)


def _ids(consumer: Consumer) -> list[int]:
    return [i for batch in consumer for i in batch["i"].tolist()]


def test_a_fast_consumer_runs_ahead_within_the_memory_bound_and_both_stay_exact() -> None:
    bound = 40 * MIN_SEGMENT
    producer = Producer.from_dataset(RangeDataset(ITEMS), "drift", batch_size=BATCH, window_mem=bound)
    with (
        serving(producer, epochs=1) as errors,
        Consumer("drift", timeout=scaled(10), data_timeout=scaled(10)) as slow,
        Consumer("drift", timeout=scaled(10), data_timeout=scaled(10)) as fast,
    ):
        ahead = iter(fast)
        taken = [i for _ in range(30) for i in next(ahead)["i"].tolist()]  # 30 batches: past 8
        stats = _stats("drift")
        assert stats.window_mem == bound and stats.window == 40
        assert stats.drift >= 29, f"the fast consumer is only {stats.drift} entries ahead"
        assert stats.drift_bytes >= 29 * MIN_SEGMENT
        assert stats.window_used >= 30, "the slow consumer's batches are not all kept"
        # as `tandem share ls --json` says it (its own process)
        out = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "share", "ls", "--json"],
            capture_output=True,
            text=True,
            timeout=scaled(30),
        )
        row = next(r for r in json.loads(out.stdout) if r["name"] == "drift")
        assert row["drift"] >= 29 and row["window"] == 40 and row["window_mem"] == bound
        # the slow one catches up (what the fast one holds back still fits the window)
        assert sorted(_ids(slow)) == list(range(ITEMS)), "the slow consumer missed or doubled items"
        taken += [i for batch in ahead for i in batch["i"].tolist()]
        assert sorted(taken) == list(range(ITEMS))
    assert not errors


def test_the_fast_consumer_waits_where_the_memory_bound_is_reached() -> None:
    producer = Producer.from_dataset(
        RangeDataset(ITEMS), "tight", batch_size=BATCH, window_mem=3 * MIN_SEGMENT
    )
    with (
        serving(producer, epochs=1) as errors,
        Consumer("tight", timeout=scaled(10), data_timeout=scaled(10)) as slow,
        Consumer("tight", timeout=scaled(10), data_timeout=2.0) as fast,
    ):
        ahead = iter(fast)
        for _ in range(3):
            next(ahead)
        with pytest.raises(ConsumerTimeout):  # the slow one holds the window's 3 batches
            next(ahead)
        stats = _stats("tight")
        assert stats.window == 3 and stats.drift <= 3
        fast.close()  # it leaves early; the slow one reads every item still
        assert sorted(_ids(slow)) == list(range(ITEMS))
    assert not errors


def test_a_window_bound_that_holds_nothing_is_refused() -> None:
    from tandem.share.spec import ShareSpec, SpecError

    with pytest.raises(SpecError, match="window-mem 0"):
        ShareSpec(name="w", source="loader", ref="m:f", window_mem=0)
    with pytest.raises(ValueError, match="window_mem must be a positive number of bytes"):
        Producer([[1]], "w", window_mem=0)
    with pytest.raises(ValueError, match="window must be an integer >= 2"):
        Producer([[1]], "w", window=1)
