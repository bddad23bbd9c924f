"""Benchmark: N jobs training real models on ONE GPU from one JPEG folder, by input path.

Every job trains the same model (torchvision's ResNet-18 by default; the repository's small
CNNs where torchvision is missing) with a bf16-autocast step (forward, loss, backward, SGD
step) on channels-last inputs, for ``epochs`` epochs of a generated folder of ImageNet-sized
JPEGs. Modes, all run for each N in one invocation:

``limit``         the GPU's limit: the same jobs on a synthetic batch already on the GPU;
``private``       each job its own ``DataLoader`` (PIL decode and augment on CPU workers,
                  pinned memory), copying each batch to the GPU;
``host``          tandem's host path: one producer (``Producer.from_dataset``) decodes on
                  the CPU once for all; consumers copy batches to the GPU;
``gpu``           tandem's GPU path: one producer (``Producer.from_files``) reads the JPEG
                  bytes on CPU workers and decodes and augments on the GPU; consumers get
                  views of GPU batches over CUDA IPC;
``tensorsocket``  TensorSocket's producer and consumers, where it is installed.

Measured per (mode, N): samples/s of all jobs over the union of their timed windows (from
the earliest job's first timed step to the latest job's last, not a sum of per-job rates),
its share of the ``limit`` rate for the same N, CPU-seconds per sample over every process of
the run (jobs, producer, loader workers; sampled from the process tree), GPU energy per
sample (NVML's total-energy counter) over the same window, and whether every job's every
epoch was a permutation of the dataset (samples lost and duplicated, from the dataset
indices each job trained on).

Modules: ``config`` (modes, workload), ``accounting`` (the arithmetic, pure), ``jobs`` (the
job and producer processes), ``measure`` (one mode at one N), ``driver`` (all of them, the
report, the command line).

``--smoke`` runs the same machinery on the CPU (a tiny model, tiny images; ``gpu`` then uses
``from_files``'s CPU fallback) so that the tests can exercise it without a GPU.
"""

from tandem.bench.gpu_share.accounting import (
    epoch_accounting,
    label_mismatches,
    private_workers,
    samples_at,
    union_rate,
)
from tandem.bench.gpu_share.config import CTX, CudaNeeded, GpuShareConfig, smoke_config
from tandem.bench.gpu_share.driver import main, run, targets
from tandem.bench.gpu_share.jobs import _start, prepare_images
from tandem.bench.gpu_share.measure import ModeRun, unavailable

__all__ = [
    "CTX",
    "GpuShareConfig",
    "CudaNeeded",
    "ModeRun",
    "_start",
    "epoch_accounting",
    "label_mismatches",
    "main",
    "prepare_images",
    "private_workers",
    "run",
    "samples_at",
    "smoke_config",
    "targets",
    "unavailable",
    "union_rate",
]
