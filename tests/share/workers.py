"""Process entry points for the share tests (importable by spawned children)."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import typing

import torch

from tandem.share import Consumer, Producer, ShareError
from tests.timing import scaled


class RangeDataset(torch.utils.data.Dataset):
    """Sample i is {"x": a (width,) float tensor filled with i, "i": i, "name": f"s{i}"}."""

    def __init__(self, n: int, width: int = 4):
        self.n = n
        self.width = width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"x": torch.full((self.width,), float(i)), "i": i, "name": f"s{i}"}


class LateOnTheGpu:
    """A batch_transform whose results are computed on the GPU behind a busy-wait of
    ``cycles``: the producer's copies into a slot run late, after the CPU has published the
    batch, so a consumer that read before the slot's written event would see its previous
    batch (duplicated ids)."""

    def __init__(self, cycles: int):
        self.cycles = cycles

    def __call__(self, batch):
        on_gpu = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        torch.cuda._sleep(self.cycles)
        return {k: v + 0 if isinstance(v, torch.Tensor) else v for k, v in on_gpu.items()}


def serve_range(name, n, batch_size, epochs=None, shuffle=False, window=8, policy="wait",
                width=4, seed=0, device=None, gpu_write_cycles=0):  # fmt: skip
    p = Producer.from_dataset(
        RangeDataset(n, width), name, batch_size=batch_size, shuffle=shuffle, seed=seed,
        window=window, policy=policy, device=device,
        batch_transform=LateOnTheGpu(gpu_write_cycles) if gpu_write_cycles else None,
    )  # fmt: skip
    p.serve(epochs=epochs)


def serve_selected(name, n, selection, batch_size, epochs, shuffle=True):
    """A producer of ``RangeDataset(n)`` restricted to the stored selection ``selection``
    (an id: loaded, and its use noted, as ``tandem share serve --selection`` does)."""
    from tandem.select.for_share import served

    p = Producer.from_dataset(
        RangeDataset(n), name, batch_size=batch_size, shuffle=shuffle, selection=served(selection, name)
    )
    p.serve(epochs=epochs)


def serve_selected_by(name, n, items, batch_size, epochs):
    """A producer of ``RangeDataset(n)`` restricted to ``items``: indices, or ``"last-two"``
    (a function of the dataset that picks its last two items)."""
    chosen = (lambda ds: [len(ds) - 2, len(ds) - 1]) if items == "last-two" else items
    Producer.from_dataset(RangeDataset(n), name, batch_size=batch_size, selection=chosen).serve(epochs=epochs)


def serve_list(name, batches, epochs=None, window=8, device=None):
    Producer(batches, name, window=window, device=device).serve(epochs=epochs)


class BadBatches:
    """Two good batches, then one holding an object tandem cannot carry."""

    def __iter__(self):
        yield {"x": torch.zeros(2, 3)}
        yield {"x": torch.ones(2, 3)}
        time.sleep(1.5)  # the test's consumer attaches meanwhile (it polls every 50 ms)
        yield {"x": torch.ones(2, 3), "meta": [1, {"deep": object()}]}


def serve_bad(name):
    try:
        Producer(BadBatches(), name).serve(epochs=1)
    except ShareError as exc:
        raise SystemExit(f"producer raised: {exc}") from None


def consume(name, queue, batch_size=None, epochs=1, step_s=0.0, drop_last=False, timeout=30.0,
            first_step_s=0.0, tag=None, pause_after=0, gate=None, device="cpu",
            gpu_step_cycles=0):  # fmt: skip
    """Report (tag, epoch, ids, batch sizes) per epoch, then ("done", stats).

    On a GPU (``device="cuda..."``) the batch is read by kernels queued behind a busy-wait of
    ``gpu_step_cycles`` (a training step), without the CPU waiting for them: a slot handed
    back before they ran would be refilled under them, and the ids would disagree."""
    tag = tag if tag is not None else os.getpid()
    try:
        c = Consumer(name, batch_size=batch_size, drop_last=drop_last, timeout=scaled(timeout), device=device)
        queue.put((tag, "start", c.start))
        gpu = device != "cpu"
        for e in range(epochs):
            ids, sizes = [], []
            on_gpu, wrong = [], torch.zeros((), dtype=torch.int64, device=device)
            for b in c:
                sizes.append(len(b["i"]))
                if gpu:
                    assert b["x"].device.type == "cuda" and b["i"].device.type == "cuda"
                    if gpu_step_cycles:
                        torch.cuda._sleep(gpu_step_cycles)
                    on_gpu.append(b["i"].clone())
                    wrong += (b["x"][:, 0] != b["i"].float()).sum()
                    assert len(b["name"]) == len(b["i"])
                else:
                    ids += b["i"].tolist()
                    assert torch.equal(b["x"][:, 0], b["i"].float()), "tensor and id disagree"
                    assert b["name"] == [f"s{i}" for i in b["i"].tolist()]
                if first_step_s and e == 0 and len(sizes) == 1:
                    time.sleep(first_step_s)
                if gate is not None and e == 0 and len(sizes) == pause_after:
                    queue.put((tag, "paused", len(ids)))
                    if not gate.wait(60):
                        raise TimeoutError("gate not opened")
                if step_s:
                    time.sleep(step_s)
            if gpu:
                ids = torch.cat(on_gpu).tolist() if on_gpu else []
                assert wrong.item() == 0, f"{wrong.item()} samples' tensor and id disagree"
            queue.put((tag, e, ids, sizes))
        queue.put((tag, "done", {"missed": c.missed_batches, "stall": c.stall_s}))
        c.close()
    except BaseException as exc:  # report, so the test fails with the reason
        queue.put((tag, "error", f"{type(exc).__name__}: {exc}"))


def consume_forever(name, queue, step_s=0.05, device="cpu"):
    """Consume until an error; report the error type and when it happened."""
    try:
        c = Consumer(name, timeout=scaled(30), device=device)
        queue.put(("start", c.start))
        while True:
            for _ in c:
                queue.put(("batch", time.monotonic()))
                time.sleep(step_s)
    except BaseException as exc:
        queue.put(("error", type(exc).__name__, str(exc), time.monotonic()))


def stop_self_after(seconds: float):
    time.sleep(seconds)
    os.kill(os.getpid(), signal.SIGKILL)


# --- structures for the round-trip test -------------------------------------------------------
@dataclasses.dataclass
class Pair:
    image: torch.Tensor
    label: int


class Point(typing.NamedTuple):
    x: torch.Tensor
    tag: str


def structured_batches():
    out = []
    for k in range(3):
        out.append(
            {
                "pair": Pair(torch.arange(6 + k, dtype=torch.float32).reshape(1, -1), k),
                "point": Point(torch.tensor([k], dtype=torch.int64), f"p{k}"),
                "many": (
                    torch.tensor([True, False]),
                    torch.full((2, 2), k, dtype=torch.int8),
                    torch.ones(2, 3, dtype=torch.float16) * k,
                    torch.ones(2, dtype=torch.bfloat16) * k,
                    torch.ones(2, dtype=torch.complex64) * (k + 1j),
                    torch.tensor(3.5 + k),  # 0-d
                    torch.empty(0, 5),
                ),
                "plain": [1, 2.5, "s", None, True, b"raw"],
                "nested": [{"a": torch.zeros(1)}, (None, 7)],
            }
        )
    return out


def make_list_loader():
    """For `tandem share serve --loader`: 5 batches of 4 samples."""
    return [{"i": torch.arange(k * 4, k * 4 + 4), "x": torch.zeros(4, 2)} for k in range(5)]


class SlowBatches:
    """A source that takes `delay` seconds per batch."""

    def __init__(self, delay: float):
        self.delay = delay

    def __iter__(self):
        for k in range(100):
            time.sleep(self.delay)
            yield {"i": torch.tensor([k])}


def serve_slow(name, delay):
    Producer(SlowBatches(delay), name, window=2).serve()


def serve_files(name, root, batch_size, epochs=1, device="cuda", crop=32, seed=0, window=8):
    Producer.from_files(
        root, name, batch_size=batch_size, device=device, crop=crop, seed=seed, window=window,
        num_workers=0,  # a test's daemonic child may not start loader workers
    ).serve(epochs=epochs)  # fmt: skip


def consume_images(name, queue, batch_size, device, tag, epochs=1):
    """Report (tag, epoch, indices, images on the CPU) per epoch, then done."""
    try:
        with Consumer(name, batch_size=batch_size, device=device, timeout=60) as c:
            for e in range(epochs):
                idx, images = [], []
                for b in c:
                    assert b["image"].device.type == torch.device(device).type
                    assert b["label"].shape == b["index"].shape == (b["image"].shape[0],)
                    idx += b["index"].tolist()
                    images.append(b["image"].to("cpu", copy=True))  # views are valid one step
                queue.put((tag, e, idx, torch.cat(images).float().numpy()))  # by value
            queue.put((tag, "done", {}))
    except BaseException as exc:
        queue.put((tag, "error", f"{type(exc).__name__}: {exc}"))
