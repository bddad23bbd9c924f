"""Names stay with their samples: every list or tuple of plain values of the batch's length
(``default_collate`` makes a batch's file names a tuple; webdataset's ``__key__``) is cut with
the batch, whatever the consumer's batch size; what cannot be cut is a clear error."""

from __future__ import annotations

import collections

import pytest
import torch

from tandem.share import Consumer, Producer, ShareError
from tests.share.serving import serving

N = 99  # the last producer batch of 32 holds 3 samples: as many as an item has parts


class Named(torch.utils.data.Dataset):
    """Item i: ``(a vector of i's, i, "img-i.jpg")``, as an image folder's items with paths."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.full((4,), float(i)), i, f"img-{i}.jpg"


def serve_named(name: str) -> None:
    Producer.from_dataset(Named(), name, batch_size=32, shuffle=True).serve()


def _check_pairs(batch) -> list[str]:
    x, y, names = batch
    assert isinstance(names, tuple)  # as default_collate made it
    assert len(names) == len(y) == len(x)
    assert [f"img-{i}.jpg" for i in y.tolist()] == list(names)
    assert torch.equal(x[:, 0].long(), y)
    return list(names)


@pytest.mark.parametrize("batch_size", [10, 48, 32, None])
def test_tensor_label_name_items_keep_every_name_with_its_sample(procs, batch_size):
    name = f"named{batch_size}"
    procs.start(serve_named, name)
    with Consumer(name, batch_size=batch_size, timeout=60) as c:
        for _epoch in range(2):
            names = [n for batch in c for n in _check_pairs(batch)]
            assert sorted(names) == sorted(f"img-{i}.jpg" for i in range(N))


def test_two_ranks_and_a_resumed_epoch_keep_names_with_samples(procs):
    procs.start(serve_named, "namedranks")
    c0 = Consumer("namedranks", batch_size=7, rank=0, world_size=2, group="g", timeout=60)
    c1 = Consumer("namedranks", batch_size=7, rank=1, world_size=2, group="g", timeout=60)
    with c0, c1:
        names = []
        for pair in zip(c0, c1):  # in step, as ranks go (each has N // 2 samples)
            for batch in pair:
                names += _check_pairs(batch)
        assert len(set(names)) == len(names) == N // 2 * 2
    first = Consumer("namedranks", batch_size=10, timeout=60)
    it = iter(first)
    seen = _check_pairs(next(it)) + _check_pairs(next(it))
    state = first.state_dict()
    first.close()
    with Consumer("namedranks", batch_size=10, timeout=60) as resumed:
        resumed.load_state_dict(state)
        rest = [n for batch in resumed for n in _check_pairs(batch)]  # cut by the items it skips
    assert sorted(seen + rest) == sorted(f"img-{i}.jpg" for i in range(N))


def test_webdataset_keys_stay_with_their_samples(tmp_path):
    wds = pytest.importorskip("webdataset")
    shards = []
    for s in range(3):
        shards.append(str(tmp_path / f"shard-{s}.tar"))
        with wds.TarWriter(shards[-1]) as sink:
            for i in range(s * 100, (s + 1) * 100):
                sink.write(
                    {"__key__": f"k{i:04d}", "cls": str(i).encode(), "x.pyd": torch.full((3,), float(i))}
                )
    pipeline = (
        wds.WebDataset(shards, shardshuffle=False, empty_check=False)
        .decode()
        .to_tuple("__key__", "cls", "x.pyd")
        .map(lambda t: (t[0], int(t[1]), t[2]))
        .with_length(300)
    )
    producer = Producer.from_dataset(pipeline, "wdskeys", batch_size=32)
    with serving(producer, epochs=None), Consumer("wdskeys", batch_size=10) as c:
        for _epoch in range(2):
            keys = []
            for key, label, x in c:
                assert len(key) == len(label) == len(x) <= 10
                assert [f"k{i:04d}" for i in label.tolist()] == list(key)
                assert torch.equal(x[:, 0].long(), label)
                keys.extend(key)
            counts = collections.Counter(keys)
            assert len(counts) == 300 and set(counts.values()) == {1}  # none twice, none missing


class Targets(torch.utils.data.Dataset):
    """Detection-style items: an image and a dict of boxes per image (collated to a list)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.zeros(3), {"boxes": torch.full((i % 3 + 1, 4), float(i))}


def _keep_targets(items):
    return torch.stack([x for x, _ in items]), [t for _, t in items]


def test_what_a_consumer_cannot_cut_is_a_clear_error():
    producer = Producer.from_dataset(Targets(), "targets", batch_size=16, collate_fn=_keep_targets)
    with serving(producer, epochs=None):
        with Consumer("targets") as whole:  # the producer's batches as they are: fine
            x, targets = next(iter(whole))
            assert len(targets) == len(x) == 16 and targets[5]["boxes"].shape == (3, 4)
        with (
            Consumer("targets", batch_size=10) as cut,
            pytest.raises(ShareError, match=r"batch\[1\] holds one"),
        ):
            next(iter(cut))
