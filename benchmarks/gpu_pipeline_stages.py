"""Where the GPU path's producer spends its time: each stage of ``Producer.from_files`` alone.

The GPU path feeds N jobs from one producer, so its images/s bound every job's. This times,
on the same generated ImageNet-sized JPEGs as ``gpu_share.py``:

``overhead``  ``RandomResizedCropFlipNormalize`` on 128 tiny images on one thread, so that
              the per-sample overhead (drawing the crop, launching kernels) is all there
              is, and the crop drawing alone
``read``      the loader alone (workers reading the files' bytes, collated), per worker count,
              packed into one buffer a batch (``collate_encoded``) or one tensor a file
``decode``    ``decode_images`` on batches already in memory, on 1 and 2 threads at once
``augment``   ``RandomResizedCropFlipNormalize`` on decoded batches, on 1 and 2 threads
``pipeline``  decode + augment (``ImagePipeline``), on 1, 2 and 4 threads
``producer``  a whole ``from_files`` producer into one consumer that only counts

Each row gives images/s and the CPU-seconds per image of the threads that did the work
(``time.thread_time``) where that is meaningful. On a machine without CUDA it runs the same
stages on the CPU (Pillow), smaller, to check itself.

    PYTHONPATH=src python3 benchmarks/gpu_pipeline_stages.py [--out FILE] [--images 2048]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import threading
import time
from pathlib import Path

import torch

from tandem.bench.gpu_share import GpuShareConfig, prepare_images
from tandem.share.images import (
    EncodedImages,
    ImagePipeline,
    RandomResizedCropFlipNormalize,
    collate_encoded,
    decode_images,
    split_encoded,
)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _threaded(work, items: list, threads: int, device: str) -> tuple[float, float]:
    """Run ``work(item)`` over ``items`` on ``threads`` threads (interleaved split); return
    (wall seconds, summed thread CPU seconds)."""
    cpu = [0.0] * threads

    def run(k: int) -> None:
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        t = time.thread_time()
        for item in items[k::threads]:
            work(item)
        _sync(device)
        cpu[k] = time.thread_time() - t

    _sync(device)
    t0 = time.perf_counter()
    pool = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    _sync(device)
    return time.perf_counter() - t0, sum(cpu)


def _row(stage: str, setting: str, images: int, wall: float, cpu: float | None) -> dict:
    cpu_ms = None if cpu is None else cpu / images * 1e3
    row = {"stage": stage, "setting": setting, "images": images, "seconds": wall,
           "images_per_s": images / wall, "cpu_ms_per_image": cpu_ms}  # fmt: skip
    print(f"{stage:9} {setting:28} {row['images_per_s']:9.0f} img/s  "
          f"{'-' if cpu is None else f'{cpu / images * 1e3:.3f}':>7} CPU ms/img", flush=True)  # fmt: skip
    return row


def collate_per_file(samples: list) -> dict:
    """The batch format before ``collate_encoded`` packed it: one tensor per file (each
    handed from a worker in a shared-memory segment of its own), for comparison."""
    return {"data": [s[0] for s in samples], "label": torch.tensor([s[1] for s in samples]),
            "index": torch.tensor([s[2] for s in samples])}  # fmt: skip


def overhead_stage(device: str, batches: int = 20, n: int = 128) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 255, (3, 40 + i % 7, 48 + i % 5), dtype=torch.uint8, generator=gen).to(device)
              for i in range(n)]  # fmt: skip
    t = RandomResizedCropFlipNormalize(size=16)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # the producer thread's own work, not intra-op parallelism
    try:
        for k in range(3):  # warm-up: allocator, kernels
            t(images, range(k * n, k * n + n))
        wall, cpu = _threaded(lambda k: t(images, range(k * n, k * n + n)), list(range(batches)), 1, device)
        t0 = time.thread_time()
        for k in range(batches * n):
            t.params(44, 50, k)
        draw = time.thread_time() - t0
    finally:
        torch.set_num_threads(threads_before)
    return [_row("overhead", f"augment, tiny images, {device}", batches * n, wall, cpu),
            _row("overhead", "crop drawing alone", batches * n, draw, draw)]  # fmt: skip


def read_stage(dataset: EncodedImages, batch: int, workers: int, pin: bool, packed: bool = True) -> dict:
    """The loader alone; CPU is the consuming (producer's) thread's, which unpickles batches."""
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch, num_workers=workers, pin_memory=pin, persistent_workers=workers > 0,
        collate_fn=collate_encoded if packed else collate_per_file, shuffle=True)  # fmt: skip
    for _ in loader:  # warm-up epoch: worker start
        pass
    t0, cpu, n = time.perf_counter(), time.thread_time(), 0
    for _ in range(2):
        for b in loader:
            n += len(b["index"])
    setting = f"{workers} workers, pin {pin}, {'packed' if packed else 'per file'}"
    return _row("read", setting, n, time.perf_counter() - t0, time.thread_time() - cpu)


def _serve(root: str, name: str, device: str, threads: int, workers: int, batch: int) -> None:
    from tandem.share import Producer

    Producer.from_files(root, name, device=device, batch_size=batch, transform_threads=threads,
                        num_workers=workers, dtype=torch.bfloat16).serve(epochs=3)  # fmt: skip


def producer_stage(root: str, device: str, threads: int, workers: int, batch: int) -> dict:
    from tandem.share import Consumer

    name = f"stages-{os.getpid()}-{threads}-{workers}"
    proc = mp.get_context("spawn").Process(target=_serve, args=(root, name, device, threads, workers, batch))
    proc.start()
    try:
        with Consumer(name, timeout=120, device=device) as c:
            for _ in c:  # first epoch: start-up
                pass
            t0, n = time.perf_counter(), 0
            for _ in range(2):
                for b in c:
                    n += len(b["index"])
            _sync(device)
            wall = time.perf_counter() - t0
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return _row("producer", f"{threads} threads, {workers} workers", n, wall, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_pipeline_stages.json"))
    ap.add_argument("--images", type=int, default=None, help="default 4096 on a GPU, 256 on a CPU")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--stages", default="overhead,read,decode,augment,pipeline,producer")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda:0" if cuda else "cpu"
    images = args.images or (4096 if cuda else 256)
    stages = set(args.stages.split(","))
    cfg = GpuShareConfig(images=images, data_dir="data/bench-images")
    root = str(prepare_images(cfg))
    dataset = EncodedImages.from_folder(root)
    print(f"{len(dataset)} JPEGs in {root}, device {device}, batch {args.batch}")
    rows: list[dict] = []
    if "overhead" in stages:
        rows += overhead_stage("cpu")
        if cuda:
            rows += overhead_stage(device)
    if "read" in stages:
        for workers, pin, packed in ((2, False, False), (2, False, True), (4, False, False),
                                     (4, False, True), (4, cuda, False), (4, cuda, True)):  # fmt: skip
            rows.append(read_stage(dataset, args.batch, workers, pin, packed))
    # Batches in memory, for the stages after the loader.
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()
    batches = [collate_encoded([dataset[i] for i in order[k : k + args.batch]])
               for k in range(0, len(order) - args.batch + 1, args.batch)]  # fmt: skip
    n_img = len(batches) * args.batch
    transform = RandomResizedCropFlipNormalize(dtype=torch.bfloat16)
    pipe = ImagePipeline(device, transform)
    pipe(batches[0])  # warm-up: nvJPEG handle, kernels
    _sync(device)
    if "decode" in stages:
        for threads in (1, 2):
            wall, cpu = _threaded(lambda b: decode_images(split_encoded(b), device), batches, threads, device)
            rows.append(_row("decode", f"{threads} thread(s)", n_img, wall, cpu))
    if "augment" in stages:
        decoded = [(decode_images(split_encoded(b), device), b["index"]) for b in batches]
        for threads in (1, 2):
            wall, cpu = _threaded(lambda d: transform(d[0], d[1]), decoded, threads, device)
            rows.append(_row("augment", f"{threads} thread(s)", n_img, wall, cpu))
        del decoded
    if "pipeline" in stages:
        for threads in (1, 2, 4):
            wall, cpu = _threaded(pipe, batches, threads, device)
            rows.append(_row("pipeline", f"{threads} thread(s)", n_img, wall, cpu))
    if "producer" in stages:
        for threads, workers in ((2, 4), (4, 4)):
            rows.append(producer_stage(root, device, threads, workers, args.batch))
    report = {
        "benchmark": "gpu_pipeline_stages",
        "command": "PYTHONPATH=src python3 benchmarks/gpu_pipeline_stages.py",
        "machine": {
            "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "cores": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
        },
        "images": n_img,
        "batch": args.batch,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
