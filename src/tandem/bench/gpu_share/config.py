"""The GPU share benchmark's settings: its modes, its workload (:class:`GpuShareConfig`), where
jobs are forked from."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path

import torch

# Jobs and producers are forked from a server that has imported torch and this module
# once (spawn where there is no forkserver): a run starts in about a second, not three.
CTX = mp.get_context("forkserver") if "forkserver" in mp.get_all_start_methods() else mp.get_context("spawn")
# (torch._dynamo: the first optimiser imports it, 1.2 s; modules that do not import are skipped)
PRELOAD = [
    "torch",
    "torch.optim",
    "torch._dynamo",
    "torchvision",
    "tandem.bench.gpu_share",
    "tandem.share.consumer",
    "tandem.share.producer",
    "tandem.share.images",
]
MODES = ("limit", "private", "host", "gpu", "tensorsocket")
SMOKE_MODES = ("limit", "private", "host", "gpu")  # the GPU path's producer runs on the CPU too
SHARED_MODES = ("host", "gpu", "tensorsocket")  # one producer process for all jobs
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_OUT = Path("benchmarks/results/gpu_share.json")
SMOKE_OUT = Path("benchmarks/results/gpu_share-smoke.json")
SAMPLE_INTERVAL_S = 0.2  # CPU and energy sampling of the run's processes


@dataclass
class GpuShareConfig:
    model: str = "resnet18"
    batch_size: int = 128
    images: int = 4096  # a multiple of the batch size: every step the same shape
    classes: int = 100
    min_side: int = 333  # generated JPEGs: sides drawn from [min_side, max_side] (ImageNet-like)
    max_side: int = 500
    crop: int = 224
    epochs: int = 5
    warmup: int = 20  # first steps of each job left out of its timed window
    cooldown: int = 20  # last steps of each job left out of it
    workers: int | str = "auto"  # private: DataLoader workers per job ("auto": the cores / N)
    producer_workers: int | str = "auto"  # host (and TensorSocket) producer's loader workers
    gpu_workers: int | str = 4  # GPU-path producer's file-reading workers
    dtype: str = "bf16"  # the GPU path's (and the limit's synthetic) image dtype
    device: str = "cuda:0"
    start_timeout_s: float = 120.0  # producer up, jobs built (imports, CUDA, model)
    run_timeout_s: float = 180.0  # from the common start to the last job's result
    data_timeout_s: float = 60.0  # a consumer waiting for one batch
    data_dir: str = "data/bench-images"


def smoke_config(data_dir: str = "data/bench-images") -> GpuShareConfig:
    """The ``--smoke`` workload: CPU, a tiny CNN, 64 images of about 64x48, one epoch."""
    return GpuShareConfig(
        model="tiny_cnn",
        batch_size=16,
        images=64,
        classes=4,
        min_side=48,
        max_side=64,
        crop=32,
        epochs=1,
        warmup=1,
        cooldown=0,
        workers=1,
        producer_workers=1,
        gpu_workers=1,
        device="cpu",
        start_timeout_s=90,
        run_timeout_s=90,
        data_timeout_s=60,
        data_dir=data_dir,
    )


class CudaNeeded(RuntimeError):
    pass
