"""Regression tests for faults found in review: rebatching, timeouts, resources."""

from __future__ import annotations

import gc
import os
import warnings

import pytest
import torch

from tandem.share import Consumer, ConsumerTimeout, Producer, ProducerExists, live_producers
from tandem.share._rebatch import Assembler, Piece
from tandem.share._tree import flatten

from .conftest import wait_for
from .workers import serve_range, serve_slow


def test_assembled_batch_owns_its_non_per_sample_elements():
    def piece(lo):
        spec, leaves = flatten({"x": torch.arange(lo, lo + 10), "scale": torch.tensor(3.5)})
        return Piece(spec, leaves, 10, 0, 10), leaves

    first, first_leaves = piece(0)
    second, _ = piece(10)
    asm = Assembler(15)
    asm.add(first)
    asm.add(Piece(second.spec, second.leaves, 10, 0, 5))
    out = asm.result()
    assert out["x"].tolist() == list(range(15))
    assert out["scale"].data_ptr() != first_leaves[1].data_ptr(), "copied out of the slot"
    first_leaves[1].fill_(0)  # the producer reuses the slot
    assert float(out["scale"]) == 3.5


def test_drop_last_needs_a_batch_size():
    with pytest.raises(ValueError, match="drop_last=True needs a batch_size"):
        Consumer("x", drop_last=True)


def test_data_timeout_then_consumer_is_unusable_with_a_clear_message(procs):
    procs.start(serve_slow, "slow", 120.0)  # its first batch comes long after the timeout
    with Consumer("slow", timeout=30, data_timeout=0.5) as c:
        with pytest.raises(ConsumerTimeout, match="within 0.5 s while waiting for a batch"):
            next(iter(c))
        with pytest.raises(ConsumerTimeout, match="can no longer be used"):
            next(iter(c))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_unstarted_or_refused_producers_free_their_resources(procs):
    procs.start(serve_range, "taken", 10, 5)
    wait_for(lambda: [p.name for p in live_producers()] == ["taken"], what="producer up")
    gc.collect()
    before = _open_fds()
    for _ in range(5):
        Producer([{"x": torch.zeros(1)}], "unstarted").close()
    for _ in range(5):
        with pytest.raises(ProducerExists):
            Producer([{"x": torch.zeros(1)}], "taken").start()
    gc.collect()
    assert _open_fds() == before


@pytest.mark.parametrize("kwargs", [{"timeout": float("nan")}, {"timeout": float("inf")},
                                    {"data_timeout": float("nan")}, {"timeout": -1}])  # fmt: skip
def test_timeouts_that_could_never_end_are_refused(kwargs):
    with pytest.raises(ValueError, match="finite number of seconds"):
        Consumer("never-started", **kwargs)


def test_a_slab_that_would_take_much_of_the_ram_is_warned_about():
    from tandem.share._slab import HostSlab

    slab = HostSlab("big", window=10**6)  # a million slots of 1 MiB: more RAM than any machine here
    with pytest.warns(RuntimeWarning, match="smaller window"):
        slab._check_size(1 << 20)
    small = HostSlab("small", window=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small._check_size(1 << 20)  # 8 MiB: nothing said
