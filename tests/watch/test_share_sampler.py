"""The tandem-share sampler on a real producer and consumer: pace, lag and data stall per run."""

from __future__ import annotations

import os

import torch

from tandem.share import Consumer
from tandem.watch.samplers import ShareSampler
from tests.share.workers import serve_range


def test_consumer_in_the_run_is_reported_and_others_are_not(procs):
    producer = procs.start(serve_range, "ws", 4096, 16)
    consumer = Consumer("ws", timeout=30)
    mine = ShareSampler(lambda: {os.getpid()})
    others = ShareSampler(lambda: {1})  # a run that holds neither producer nor consumer
    it = iter(consumer)
    for _ in range(20):
        batch = next(it)
        assert isinstance(batch["x"], torch.Tensor)
    m = mine.sample()
    prefix = "system/share/ws/consumer_"
    keys = {k.rsplit("/", 1)[1] for k in m if k.startswith(prefix)}
    assert {"batches_per_s", "samples", "lag_batches", "stall_seconds", "missed_batches"} <= keys, m
    assert next(v for k, v in m.items() if k.endswith("/samples")) >= 19 * 16
    assert not any("/producer/" in k for k in m), "the producer is another process, not in this run"
    assert others.sample() == {}
    m = ShareSampler(lambda: {producer.pid}).sample()  # a run that holds the producer
    assert m["system/share/ws/producer/published_batches"] >= 20
    assert m["system/share/ws/producer/consumers"] == 1
    consumer.close()
