"""Sources as users bring them: a webdataset pipeline and Hugging Face datasets (map-style
with ``with_format``/``with_transform``, and iterable), a torch ``IterableDataset`` with or
without a length, numpy items; and a ``--loader file.py:FN`` that imports its neighbours."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from tandem.share import Consumer, Producer
from tests.share.serving import serving
from tests.timing import scaled

N = 300


class Stream(torch.utils.data.IterableDataset):
    """Items 0..N-1 as numpy values, in one pass; a length only when told."""

    def __init__(self, length: bool):
        self.length = length

    def __iter__(self):
        for i in range(N):
            yield {"x": np.full(3, i, dtype=np.float32), "y": np.int64(i)}

    def __len__(self) -> int:
        if not self.length:
            raise TypeError("no length")
        return N


@pytest.mark.parametrize("length", [True, False])
def test_an_iterable_dataset_with_numpy_items_gives_every_item_once_an_epoch(length):
    name = f"iter{length}"
    # a window shorter than a pass: the first pass cannot be counted before the consumer reads
    producer = Producer.from_dataset(Stream(length), name, batch_size=32, window=4)
    with serving(producer, epochs=3), Consumer(name, batch_size=25) as c:
        if length:
            assert len(c) == 12
        else:
            with pytest.raises(TypeError, match="counted only at the end of the producer's first pass"):
                len(c)
        for _ in range(3):
            labels = []
            for batch in c:
                assert isinstance(batch["x"], torch.Tensor) and torch.equal(
                    batch["x"][:, 0].long(), batch["y"]
                )
                labels.extend(batch["y"].tolist())
            assert sorted(labels) == list(range(N))
        assert len(c) == 12  # known once the first pass has been counted


def test_from_dataset_refuses_shuffle_for_an_iterable_dataset():
    with pytest.raises(ValueError, match="IterableDataset shuffles itself"):
        Producer.from_dataset(Stream(True), "refuse", shuffle=True)
    with pytest.raises(TypeError, match="neither"):
        Producer.from_dataset(iter(range(3)), "refuse")


def _write_shards(tmp_path) -> str:
    wds = pytest.importorskip("webdataset")
    path = str(tmp_path / "shard-000000.tar")
    with wds.TarWriter(path) as sink:
        for i in range(N):
            buf = io.BytesIO()
            np.save(buf, np.full((4, 4), i, dtype=np.int16))
            sink.write({"__key__": f"{i:06d}", "npy": buf.getvalue(), "cls": str(i).encode()})
    return path


def test_a_webdataset_pipeline_is_a_source_as_it_comes(tmp_path):
    wds = pytest.importorskip("webdataset")
    path = _write_shards(tmp_path)
    pipeline = wds.WebDataset(path, shardshuffle=False).decode().to_tuple("npy", "cls")
    with serving(Producer.from_dataset(pipeline, "wds", batch_size=32), epochs=2), Consumer("wds", 64) as c:
        for _ in range(2):
            labels = []
            for x, y in c:
                assert x.dtype == torch.int16 and torch.equal(x[:, 0, 0].long(), y)
                labels.extend(y.tolist())
            assert sorted(labels) == list(range(N))
    # its own batching, numpy arrays as they come: Producer(source) takes it too
    batched = wds.WebDataset(path, shardshuffle=False).decode().to_tuple("npy", "cls").batched(50)
    with serving(Producer(batched, "wdsb"), epochs=1), Consumer("wdsb") as c:
        assert sorted(int(v) for _, y in c for v in y) == list(range(N))


def test_hugging_face_datasets_map_style_and_iterable(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"x": [[float(i)] * 3 for i in range(N)], "label": list(range(N))})
    torch_format = data.with_format("torch")
    producer = Producer.from_dataset(torch_format, "hf", batch_size=32, shuffle=True)
    with serving(producer, epochs=1), Consumer("hf") as c:
        labels = []
        for batch in c:
            assert torch.equal(batch["x"][:, 0].long(), batch["label"])
            labels.extend(batch["label"].tolist())
        assert sorted(labels) == list(range(N))

    def scale(batch):
        return {"x": [torch.tensor(v) * 2 for v in batch["x"]], "label": batch["label"]}

    with serving(Producer.from_dataset(data.with_transform(scale), "hft", batch_size=32), epochs=1):
        c = Consumer("hft")
        with c:
            assert sorted(int(v) for b in c for v in b["label"]) == list(range(N))
    iterable = data.to_iterable_dataset().with_format("torch")
    with serving(Producer.from_dataset(iterable, "hfi", batch_size=32), epochs=2), Consumer("hfi") as c:
        for _ in range(2):
            assert sorted(int(v) for b in c for v in b["label"]) == list(range(N))


def test_a_loader_file_imports_its_neighbours(tmp_path):
    (tmp_path / "ds.py").write_text("def items():\n    return [[1, 2], [3]]\n")
    (tmp_path / "loaders.py").write_text("import ds\n\ndef make_loader():\n    return ds.items()\n")
    ref = f"{tmp_path / 'loaders.py'}:make_loader"
    code = f"from tandem.share.spec import load_object\nprint(load_object({ref!r})())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60), cwd="/"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[[1, 2], [3]]"


# The drop-in over each: the same script twice at once, no producer of the user's.
DROP_IN = """
import json, sys
import datasets, torch, webdataset as wds
from tandem.share import DataLoader

if sys.argv[1] == "wds":
    source = wds.WebDataset(sys.argv[2], shardshuffle=False, seed=0).decode().to_tuple("npy", "cls")
else:
    rows = {"x": [[float(i)] * 3 for i in range(300)], "label": list(range(300))}
    source = datasets.Dataset.from_dict(rows).to_iterable_dataset().with_format("torch")
loader = DataLoader(source, batch_size=int(sys.argv[3]))
epochs = []
for _ in range(2):
    epochs.append([int(v) for b in loader for v in (b[1] if sys.argv[1] == "wds" else b["label"])])
print(json.dumps({"epochs": epochs, "producer": loader._consumer.producer_pid}))
"""


# A streamed Hugging Face dataset is not here: it pickles HfFileSystem's cache, keyed by a
# random id drawn in each process, so each process has its own producer (docs: HF streaming).
@pytest.mark.parametrize("kind", ["wds"])
def test_the_drop_in_over_a_webdataset_pipeline_reads_one_producer(kind, tmp_path, drop_in_producers_end):
    pytest.importorskip("webdataset")
    pytest.importorskip("datasets")
    script = tmp_path / "train.py"
    script.write_text(DROP_IN)
    shard = _write_shards(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), kind, shard, str(b)], stdout=subprocess.PIPE, text=True
        )
        for b in (20, 50)
    ]
    outs = [p.communicate(timeout=scaled(180))[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert len({r["producer"] for r in results}) == 1, "one producer for the two"
    for r in results:  # a late joiner wraps around: as many samples as an epoch, each once
        assert all(sorted(e) == list(range(N)) for e in r["epochs"]), r["epochs"]
