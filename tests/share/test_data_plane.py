"""The data plane: structures and dtypes round-trip, zero-copy views, constant-size messages."""

from __future__ import annotations

import pytest
import torch

from tandem.share import (
    Consumer,
    MissedBatchesWarning,
    Producer,
    UnsupportedBatch,
    clone_batch,
    protocol,
)
from tandem.share._tree import flatten, unflatten

from .workers import consume, serve_list, serve_range, structured_batches


def _memfd_ranges():
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:tandem:" in line:
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def _inside_shared_memory(t: torch.Tensor) -> bool:
    ptr = t.data_ptr()
    return any(lo <= ptr < hi for lo, hi in _memfd_ranges())


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert type(b) is dict and list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif hasattr(a, "__dataclass_fields__"):
        assert type(a) is type(b)
        for k in a.__dataclass_fields__:
            _assert_same(getattr(a, k), getattr(b, k))
    else:
        assert a == b and type(a) is type(b)


def test_nested_structures_dtypes_and_varying_shapes_round_trip(procs):
    batches = structured_batches()
    procs.start(serve_list, "st", batches, epochs=1)
    with Consumer("st", timeout=30) as c:
        got = [clone_batch(b) for b in c]
    assert len(got) == len(batches)
    for want, have in zip(batches, got):
        _assert_same(want, have)


def test_batches_are_views_into_shared_memory_and_slices_stay_views(procs):
    procs.start(serve_range, "zc", 40, 10, epochs=1, width=1024)
    with Consumer("zc", batch_size=5, timeout=30) as c:
        for b in c:
            assert _inside_shared_memory(b["x"]), "consumer batch inside one producer batch"
            assert not b["x"].untyped_storage().resizable()
            assert not _inside_shared_memory(clone_batch(b)["x"]), "clone_batch copies"


def test_batch_spanning_producer_batches_is_assembled_by_copy(procs):
    procs.start(serve_range, "sp", 40, 10, epochs=1)
    with Consumer("sp", batch_size=15, timeout=30) as c:
        batches = [(b["i"].tolist(), _inside_shared_memory(b["x"])) for b in c]
    assert [ids for ids, _ in batches] == [list(range(0, 15)), list(range(15, 30)),
                                           list(range(30, 40))]  # fmt: skip
    assert [inside for _, inside in batches] == [False, False, False]


def test_in_place_changes_stay_private_to_one_consumer(procs):
    procs.start(serve_range, "cow", 30, 10, epochs=1)
    with Consumer("cow", timeout=30) as a, Consumer("cow", timeout=30) as b:
        for batch_a, batch_b in zip(a, b):
            ids = batch_a["i"].clone()
            batch_a["x"].mul_(-1)  # in place, in shared memory
            assert torch.equal(batch_b["x"][:, 0], ids.float()), "other consumer unaffected"


def test_per_batch_messages_have_one_fixed_size_whatever_the_batch():
    def batch_message(segment_bytes: int, seq: int) -> bytes:
        seg = protocol.Segment(kind="host", segment_id=3, slot=1, size=segment_bytes)
        batch = protocol.Batch(
            seq=seq, epoch=2, offset=640, count=64, segment=seg, meta_offset=segment_bytes - 900, meta_len=900
        )
        return protocol.encode(batch)

    sizes = {len(batch_message(b, seq)) for b in (1 << 20, 100 << 20, 1 << 36) for seq in (0, 10**9)}
    assert len(sizes) == 1 and sizes.pop() < 100
    assert len(protocol.encode(protocol.Next(release=(7,), stall_s=1.5, samples=100, batches=9))) < 48
    msg = protocol.Batch(
        seq=9,
        epoch=1,
        offset=32,
        count=16,
        segment=protocol.Segment(kind="host", segment_id=4, slot=2, size=1 << 20),
        meta_offset=77,
        meta_len=88,
        missed_batches=1,
        missed_samples=2,
        fd_attached=True,
    )
    assert protocol.decode(protocol.encode(msg)) == msg
    nxt = protocol.Next(release=(3, 4), stall_s=0.25, samples=12, batches=3)
    assert protocol.decode(protocol.encode(nxt)) == nxt


def test_unsupported_element_is_named_with_its_path():
    with pytest.raises(UnsupportedBatch, match=r"batch\['meta'\]\[1\]\['deep'\]"):
        flatten({"x": torch.zeros(1), "meta": [1, {"deep": object()}]})
    import numpy as np

    with pytest.raises(UnsupportedBatch, match=r"batch\[1\]: a numpy ndarray of dtype object"):
        flatten((torch.zeros(1), np.array([object()], dtype=object)))


def test_numpy_values_become_tensors_as_default_collate_makes_them():
    import numpy as np

    spec, leaves = flatten(
        {
            "x": np.arange(6, dtype=np.float32).reshape(3, 2),
            "y": np.int64(4),
            "names": np.array(["a", "b", "c"]),
        }
    )
    batch = unflatten(spec, leaves)
    assert torch.equal(batch["x"], torch.arange(6, dtype=torch.float32).reshape(3, 2))
    assert batch["y"].dtype == torch.int64 and int(batch["y"]) == 4
    assert batch["names"] == ["a", "b", "c"]


def test_skip_policy_laggard_misses_batches_is_told_and_does_not_hold_others(procs):
    import time

    n = 600
    procs.start(serve_range, "skip", n, 5, epochs=1, window=2, policy="skip")
    gate = procs.event()  # the fast consumer waits after its first batch for the slow one
    procs.start(consume, "skip", procs.queue, epochs=1, step_s=0.002, tag="fast",
                pause_after=1, gate=gate)  # fmt: skip
    assert procs.get()[:2] == ("fast", "start")
    with pytest.warns(MissedBatchesWarning, match="missed"), Consumer("skip", timeout=30) as slow:
        assert slow.start == (0, 0)
        gate.set()
        seen = []
        for b in slow:
            seen += b["i"].tolist()
            time.sleep(0.03)
        missed = slow.missed_samples
    res = procs.collect(["fast"])
    assert sorted(res["fast"][0][0]) == list(range(n)), "the fast consumer lost nothing"
    assert missed > 0 and len(seen) + missed <= n
    assert len(set(seen)) == len(seen), "never twice"


def test_producer_rejects_one_shot_iterators_and_bad_options():
    with pytest.raises(TypeError, match="re-iterable"):
        Producer(iter([1, 2]), "x")
    with pytest.raises(ValueError, match="policy"):
        Producer([1], "x", policy="fast")
    with pytest.raises(ValueError, match="invalid producer name"):
        Producer([1], "a/b")
    with pytest.raises(ValueError, match="batch_size"):
        Consumer("x", batch_size=0)
