"""Epoch semantics: exactly once, in order, last partial batch, own batch sizes, late joins."""

from __future__ import annotations

import math

import pytest

from tandem.share import Consumer

from .workers import consume, serve_range

N, PBS = 103, 10


def test_consumers_from_start_get_every_sample_once_in_producer_order(procs):
    procs.start(serve_range, "ep", N, PBS, epochs=2, shuffle=True, window=4)
    # "a" waits after its first batch until "b" has attached: both attach at the start.
    gate = procs.event()
    procs.start(consume, "ep", procs.queue, epochs=2, tag="a", pause_after=1, gate=gate)
    assert procs.get()[:2] == ("a", "start")
    procs.start(consume, "ep", procs.queue, epochs=2, tag="b")
    starts = {}
    while "b" not in starts:
        msg = procs.get()
        if msg[1] == "start":
            starts[msg[0]] = msg[2]
    gate.set()
    res = procs.collect(["a", "b"])
    res["b"]["start"] = starts["b"]
    res["a"]["start"] = (0, 0)
    for tag in ("a", "b"):
        assert res[tag]["start"] == (0, 0)
        for e in (0, 1):
            ids, sizes = res[tag][e]
            assert sorted(ids) == list(range(N)), "every sample exactly once"
            assert sizes == [PBS] * 10 + [3], "producer batches, last partial included"
    assert res["a"][0][0] == res["b"][0][0], "same producer order for both"
    assert res["a"][0][0] != res["a"][1][0], "reshuffled between epochs"
    assert res["a"][0][0] != sorted(res["a"][0][0]), "shuffled"


@pytest.mark.parametrize(
    "bs,drop_last", [(1, False), (7, False), (10, False), (25, False), (64, False), (7, True)]
)
def test_own_batch_size_exact_sizes_and_every_sample_once(procs, bs, drop_last):
    procs.start(serve_range, "bs", N, PBS, epochs=2, window=3)
    procs.start(consume, "bs", procs.queue, batch_size=bs, epochs=2, drop_last=drop_last, tag="c")
    res = procs.collect(["c"])
    for e in (0, 1):
        ids, sizes = res["c"][e]
        full, rest = divmod(N, bs)
        if drop_last:
            assert sizes == [bs] * full
            assert ids == list(range(full * bs))
        else:
            assert sizes == [bs] * full + ([rest] if rest else [])
            assert ids == list(range(N)), "in producer order, exactly once"


def test_late_joiner_with_shuffle_sees_every_sample_once_per_own_epoch(procs):
    procs.start(serve_range, "late", N, PBS, epochs=3, shuffle=True, window=3, seed=7)
    # The first consumer pauses after 4 batches, so that the late one joins mid-epoch.
    gate = procs.event()
    procs.start(consume, "late", procs.queue, epochs=3, step_s=0.005, tag="early",
                pause_after=4, gate=gate)  # fmt: skip
    assert procs.get()[1] == "start"
    assert procs.get()[1] == "paused"
    procs.start(consume, "late", procs.queue, batch_size=8, epochs=3, step_s=0.005, tag="late")
    msg = procs.get()
    assert msg[:2] == ("late", "start"), msg
    late_start = msg[2]
    gate.set()
    res = procs.collect(["early", "late"])
    start = late_start
    assert start[0] == 0 and start[1] > 0, f"joined mid-epoch at once, got {start}"
    for e in range(3):
        ids, sizes = res["late"][e]
        assert sorted(ids) == list(range(N)), f"late joiner epoch {e}: every sample once"
        assert sizes[:-1] == [8] * (len(sizes) - 1)
        early = res["early"][e][0]
        assert sorted(early) == list(range(N)), f"producer epoch {e} is a full permutation"


def test_len_matches_batches_yielded(procs):
    procs.start(serve_range, "len", N, PBS, epochs=1)
    with Consumer("len", batch_size=9, timeout=30) as c:
        n = len(c)
        got = sum(1 for _ in c)
    assert n == got == math.ceil(N / 9)


def test_finished_producer_raises_clear_error_on_extra_epoch(procs):
    from tandem.share import ProducerFinished

    procs.start(serve_range, "fin", 20, 5, epochs=1)
    with Consumer("fin", timeout=30) as c:
        assert sum(len(b["i"]) for b in c) == 20
        with pytest.raises(ProducerFinished, match="fin"):
            for _ in c:
                pass
