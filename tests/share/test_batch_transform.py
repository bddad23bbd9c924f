"""A producer's batch_transform: applied once per batch, in order, on one or several threads."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from tandem.share import Consumer, Producer, ProducerError


class Recording:
    """Doubles x; sleeps a random while (so threads finish out of order); records each call."""

    def __init__(self, fail_on: int | None = None):
        self.calls: list[tuple[int, int]] = []  # (epoch, batch id)
        self.epoch = -1
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, batch: dict) -> dict:
        bid = int(batch["id"][0])
        if bid == self.fail_on:
            raise RuntimeError(f"cannot transform batch {bid}")
        time.sleep(random.uniform(0, 0.01))
        with self._lock:
            self.calls.append((self.epoch, bid))
        return {"id": batch["id"], "x": batch["x"] * 2}


def _batches(n: int) -> list[dict]:
    return [{"id": torch.full((4,), i), "x": torch.full((4, 3), float(i))} for i in range(n)]


def _serve_in_thread(producer: Producer, epochs: int) -> tuple[threading.Thread, list]:
    errors: list = []

    def run() -> None:
        try:
            producer.serve(epochs=epochs)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.parametrize("threads", [1, 4])
def test_transformed_once_each_in_order_and_under_its_epoch(threads):
    transform = Recording()
    producer = Producer(_batches(12), "bt", batch_transform=transform, transform_threads=threads, window=3)
    thread, errors = _serve_in_thread(producer, epochs=2)
    with Consumer("bt", timeout=30) as c:
        for _ in range(2):
            seen = [(int(b["id"][0]), float(b["x"][0, 0])) for b in c]
            assert seen == [(i, 2.0 * i) for i in range(12)]
    thread.join(30)
    assert not thread.is_alive() and not errors
    # every batch transformed once per epoch, under that epoch (set_epoch came first)
    assert sorted(transform.calls) == [(e, i) for e in (0, 1) for i in range(12)]


def test_a_failing_transform_fails_the_producer_and_tells_consumers():
    producer = Producer(
        _batches(12), "btf", batch_transform=Recording(fail_on=5), transform_threads=3, window=2
    )
    thread, errors = _serve_in_thread(producer, epochs=1)
    with Consumer("btf", timeout=30) as c, pytest.raises(ProducerError, match="cannot transform batch 5"):
        for _ in c:
            pass
    thread.join(30)
    assert not thread.is_alive()
    assert len(errors) == 1 and "cannot transform batch 5" in str(errors[0])


def test_bad_transform_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="batch_transform must be callable"):
        Producer(_batches(2), "bta", batch_transform=42)
    with pytest.raises(ValueError, match="transform_threads must be a positive integer"):
        Producer(_batches(2), "bta", batch_transform=Recording(), transform_threads=0)
