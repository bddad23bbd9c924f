"""Re-measure only the hand-off latency of tandem.share.

    python benchmarks/handoff_check.py [--policy wait|skip] [--rounds N] [--json PATH]
    TANDEM_SHARE_TABLE=0 python benchmarks/handoff_check.py     # the socket transport

The time of a consumer's ``next()`` while the producer is ahead, for batches of 1 MB, 38.5 MB
and 100 MB; each step touches the batch and then leaves the producer time to refill its
window, so ``next()`` measures the hand-off itself. It uses the public API only, so the same
script measures another checkout: ``PYTHONPATH=/path/to/other/src python benchmarks/...``.
Prints a table (median and p90 per round) and optionally writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

import torch

SHAPES = ((64, 4096), (64, 3, 224, 224), (64, 3, 361, 361))


def _produce(name: str, shape: tuple[int, ...], batches: int, policy: str) -> None:
    from tandem.share import Producer

    distinct = [torch.randn(shape) for _ in range(4)]
    source = [distinct[i % 4] for i in range(batches)]  # written into the slab one by one
    Producer(source, name, window=4, policy=policy).serve(epochs=1000)


def measure(shape: tuple[int, ...], policy: str, steps: int = 40) -> dict:
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
        "shape": "x".join(map(str, shape)),
        "mbytes": round(nbytes / 1e6, 1),
        "median_ms": statistics.median(times) * 1e3,
        "p90_ms": times[int(0.9 * len(times))] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=("wait", "skip"), default="wait")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    table = "socket only" if os.environ.get("TANDEM_SHARE_TABLE") == "0" else "default"
    print(f"policy {args.policy}, transport {table}")
    rows = []
    for r in range(args.rounds):
        for shape in SHAPES:
            row = {"round": r, **measure(shape, args.policy)}
            rows.append(row)
            shape, mb, median, p90 = row["shape"], row["mbytes"], row["median_ms"], row["p90_ms"]
            print(f"{shape:>14} {mb:6.1f} MB  median {median:.3f} ms  p90 {p90:.3f} ms", flush=True)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"policy": args.policy, "transport": table, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
