"""What the GPU path's augmentation costs per sample, on this machine's CPU (and GPU, if any).

The producer of ``Producer.from_files`` crops, resizes, flips and normalises every sample in
one Python thread; its per-sample overhead (drawing the crop, launching two kernels) bounds
how many images a second it can feed jobs. This times ``RandomResizedCropFlipNormalize`` on
128 small images (so that the resize's arithmetic is small next to the overhead) and the
crop drawing alone.

    python benchmarks/augment_cost.py [--out benchmarks/results/augment_cost.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from tandem.share.images import RandomResizedCropFlipNormalize


def measure(device: str, batches: int = 20, n: int = 128) -> dict:
    gen = torch.Generator().manual_seed(0)
    images = [
        torch.randint(0, 255, (3, 40 + i % 7, 48 + i % 5), dtype=torch.uint8, generator=gen).to(device)
        for i in range(n)
    ]
    t = RandomResizedCropFlipNormalize(size=16)
    for k in range(3):  # warm-up: allocator, kernels
        t(images, range(k * n, k * n + n))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for k in range(batches):
        t(images, range(k * n, k * n + n))
    sync()
    per_batch = (time.perf_counter() - t0) / batches
    t1 = time.perf_counter()
    for k in range(batches):
        for i in range(n):
            t.params(44, 50, k * n + i)
    params = (time.perf_counter() - t1) / (batches * n)
    return {
        "device": device,
        "batch": n,
        "ms_per_batch": per_batch * 1e3,
        "us_per_sample": per_batch / n * 1e6,
        "params_us_per_sample": params * 1e6,
        "samples_per_s": n / per_batch,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/augment_cost.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # the producer's one thread
    rows = [measure("cpu")]
    if torch.cuda.is_available():
        rows.append(measure("cuda"))
    print(f"{'device':8} {'ms/batch':>9} {'us/sample':>10} {'crop draw us':>13} {'samples/s':>10}")
    for r in rows:
        print(f"{r['device']:8} {r['ms_per_batch']:9.1f} {r['us_per_sample']:10.0f} "
              f"{r['params_us_per_sample']:13.1f} {r['samples_per_s']:10.0f}")  # fmt: skip
    report = {
        "benchmark": "augment_cost",
        "command": "python benchmarks/augment_cost.py",
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__},
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
