"""What the GPU path's augmentation costs per sample, on this machine's CPU (and GPU, if any).

The producer of ``Producer.from_files`` crops, resizes, flips and normalises every sample in
its own process; its per-sample overhead (drawing the crop, launching two kernels) bounds
how many images a second it can feed jobs. This times ``RandomResizedCropFlipNormalize`` on
128 small images (so that the resize's arithmetic is small next to the overhead) and the
crop drawing alone; then a whole ``from_files`` producer (decode + augment of generated
ImageNet-sized JPEGs, into a real consumer) with ``transform_threads`` 1 and 2.

    python benchmarks/augment_cost.py [--out benchmarks/results/augment_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
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


def _serve(root: str, name: str, device: str, threads: int) -> None:
    from tandem.share import Producer

    Producer.from_files(
        root, name, device=device, batch_size=32, crop=224, transform_threads=threads, num_workers=1
    ).serve(epochs=2)


def producer_rate(root: str, device: str, threads: int) -> dict:
    """Images a second one from_files producer delivers to one consumer (its second epoch)."""
    import multiprocessing as mp

    from tandem.share import Consumer

    name = f"augment-cost-{os.getpid()}-{threads}"
    proc = mp.get_context("spawn").Process(target=_serve, args=(root, name, device, threads))
    proc.start()
    try:
        with Consumer(name, timeout=120, device=device) as c:
            for _ in c:  # the first epoch: start-up, worker spawn
                pass
            t0, n = time.perf_counter(), 0
            for b in c:
                n += len(b["index"])
            dt = time.perf_counter() - t0
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return {"device": device, "transform_threads": threads, "images": n, "images_per_s": n / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/augment_cost.json"))
    ap.add_argument("--images", type=int, default=256, help="JPEGs for the producer runs")
    args = ap.parse_args()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # the producer's one thread
    rows = [measure("cpu")]
    if torch.cuda.is_available():
        rows.append(measure("cuda"))
    torch.set_num_threads(threads_before)
    from tandem.bench.images import make_image_folder

    folder = make_image_folder("data/augment-cost", images=args.images, classes=4, min_side=333, max_side=500)
    root = str(folder)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    producers = [producer_rate(root, d, k) for d in devices for k in (1, 2)]
    print(f"{'device':8} {'ms/batch':>9} {'us/sample':>10} {'crop draw us':>13} {'samples/s':>10}")
    for r in rows:
        print(f"{r['device']:8} {r['ms_per_batch']:9.1f} {r['us_per_sample']:10.0f} "
              f"{r['params_us_per_sample']:13.1f} {r['samples_per_s']:10.0f}")  # fmt: skip
    print(f"\n{'producer':8} {'threads':>8} {'images/s':>9}")
    for r in producers:
        print(f"{r['device']:8} {r['transform_threads']:8d} {r['images_per_s']:9.0f}")
    report = {
        "benchmark": "augment_cost",
        "command": "python benchmarks/augment_cost.py",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
        },
        "results": rows,
        "producer": producers,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
