"""The hand-off latency of tandem.share: one consumer's ``next()`` while the producer is ahead.

Used by ``tandem bench share`` and ``benchmarks/handoff_check.py``. It keeps to the public
API (``tandem.share.Producer`` and ``Consumer``), so ``handoff_check.py`` can load this file
beside another checkout's ``tandem`` and measure that one too.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from typing import Any

import torch

SHAPES = ((64, 4096), (64, 3, 224, 224), (64, 3, 361, 361))  # 1 MB, 38.5 MB, 100 MB of float32


def _produce(name: str, shape: tuple[int, ...], batches: int, policy: str) -> None:
    from tandem.share import Producer

    distinct = [torch.randn(shape) for _ in range(4)]
    source = [distinct[i % 4] for i in range(batches)]  # written into the slab one by one
    Producer(source, name, window=4, policy=policy).serve(epochs=1000)


def measure(shape: tuple[int, ...], policy: str = "wait", steps: int = 40) -> dict[str, Any]:
    """Median and p90 time of ``next()`` for batches of ``shape``. Each step touches the
    batch, then leaves the producer time to refill its window, so ``next()`` measures the
    hand-off itself."""
    from tandem.share import Consumer

    name = f"handoff-{os.getpid()}-{'x'.join(map(str, shape))}"
    nbytes = torch.Size(shape).numel() * 4
    producer = mp.get_context("spawn").Process(target=_produce, args=(name, shape, steps + 8, policy))
    producer.start()
    try:
        consumer = Consumer(name, timeout=60)
        it = iter(consumer)
        next(it)  # the first batch maps the segments: not a steady-state hand-off
        refill_s = 0.02 + 3 * nbytes / 2e9
        times = []
        for _ in range(steps):
            time.sleep(refill_s)
            t0 = time.perf_counter()
            batch = next(it)
            times.append(time.perf_counter() - t0)
            float(batch.view(-1)[::1024].sum())
        consumer.close()
    finally:
        producer.terminate()
        producer.join(10)
    times.sort()
    return {
        "shape": list(shape),
        "mbytes": round(nbytes / 1e6, 1),
        "median_ms": statistics.median(times) * 1e3,
        "p90_ms": times[int(0.9 * len(times))] * 1e3,
        "steps": steps,
    }
