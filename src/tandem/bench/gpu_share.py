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

``--smoke`` runs the same machinery on the CPU (a tiny model, tiny images; ``gpu`` then uses
``from_files``'s CPU fallback) so that the tests can exercise it without a GPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
import torch.nn.functional as F

from tandem.bench._share_jobs import JobResult, tree_cpu_s, waited_batches
from tandem.bench.data import ImageFolder
from tandem.bench.images import make_image_folder
from tandem.bench.models import MODELS
from tandem.bench.share_bench import _Every, _free_ports, _reap, tensorsocket_available

# Jobs and producers are forked from a server that has imported torch and this module
# once (spawn where there is no forkserver): a run starts in about a second, not three.
CTX = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
# (torch._dynamo: the first optimiser imports it, 1.2 s; modules that do not import are skipped)
PRELOAD = ["torch", "torch.optim", "torch._dynamo", "torchvision", "tandem.bench.gpu_share",
           "tandem.share.consumer", "tandem.share.producer", "tandem.share.images"]  # fmt: skip
MODES = ("limit", "private", "host", "gpu", "tensorsocket")
SMOKE_MODES = ("limit", "private", "host", "gpu")  # the GPU path's producer runs on the CPU too
SHARED_MODES = ("host", "gpu", "tensorsocket")  # one producer process for all jobs
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_OUT = Path("benchmarks/results/gpu_share.json")
SMOKE_OUT = Path("benchmarks/results/gpu_share-smoke.json")
SAMPLE_INTERVAL_S = 0.2  # CPU and energy sampling of the run's processes


@dataclass
class Config:
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


def smoke_config(data_dir: str = "data/bench-images") -> Config:
    """The ``--smoke`` workload: CPU, a tiny CNN, 64 images of about 64x48, one epoch."""
    return Config(model="tiny_cnn", batch_size=16, images=64, classes=4, min_side=48, max_side=64,
                  crop=32, epochs=1, warmup=1, cooldown=0, workers=1, producer_workers=1, gpu_workers=1,
                  device="cpu", start_timeout_s=90, run_timeout_s=90, data_timeout_s=60,
                  data_dir=data_dir)  # fmt: skip


class CudaNeeded(RuntimeError):
    pass


# --------------------------------------------------------------------------- pure parts
def samples_at(timeline: Sequence[tuple[float, int]], t: float) -> float:
    """A job's samples trained by time ``t``, from its ``(step end time, samples so far)``
    timeline, linear between steps (0 before the first, all after the last)."""
    if not timeline or t <= timeline[0][0]:
        return 0.0 if not timeline or t < timeline[0][0] else float(timeline[0][1])
    for (ta, sa), (tb, sb) in zip(timeline, timeline[1:]):
        if t <= tb:
            return sa + (sb - sa) * (t - ta) / (tb - ta) if tb > ta else float(sb)
    return float(timeline[-1][1])


def union_rate(
    windows: Iterable[tuple[float, float]], timelines: Iterable[Sequence[tuple[float, int]]]
) -> tuple[float, float, float, int]:
    """All jobs' rate over the union of their timed windows ``(start, end)``:
    ``(samples/s, first start, last end, samples)``. The span runs from the earliest start
    to the latest end, so a job that starts late or ends early lowers the rate (unlike a sum
    of per-job rates, which counts each job over its own window only); every sample any job
    trained inside the span counts, from the jobs' timelines (another job's warm-up or
    cool-down steps inside the span included: they are work done in it)."""
    windows = [w for w in windows if w[1] > w[0]]
    if not windows:
        return 0.0, 0.0, 0.0, 0
    t0 = min(w[0] for w in windows)
    t1 = max(w[1] for w in windows)
    samples = round(sum(samples_at(tl, t1) - samples_at(tl, t0) for tl in timelines))
    return samples / (t1 - t0), t0, t1, samples


def epoch_accounting(epochs: Sequence[Sequence[int]], size: int, expected_epochs: int) -> tuple[int, int]:
    """``(lost, duplicated)`` samples of one job, from the dataset indices it trained on in
    each epoch; each epoch should be exactly a permutation of ``range(size)``. Lost: indices
    an epoch missed (a missing epoch loses them all). Duplicated: indices an epoch had more
    than once, plus indices out of range and any epoch beyond ``expected_epochs``."""
    lost = dup = 0
    for e in range(max(expected_epochs, len(epochs))):
        idx = np.asarray(epochs[e] if e < len(epochs) else (), dtype=np.int64).reshape(-1)
        if e >= expected_epochs:
            dup += idx.size
            continue
        valid = (idx >= 0) & (idx < size)
        counts = np.bincount(idx[valid], minlength=size)
        lost += int((counts == 0).sum())
        dup += int(np.maximum(counts - 1, 0).sum()) + int((~valid).sum())
    return lost, dup


def label_mismatches(
    indices: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], truth: np.ndarray
) -> int:
    """Samples whose label is not the dataset's label of their index."""
    bad = 0
    for idx, lab in zip(indices, labels):
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        lab = np.asarray(lab, dtype=np.int64).reshape(-1)
        if idx.size != lab.size:
            bad += max(idx.size, lab.size)
            continue
        ok = (idx >= 0) & (idx < truth.size)
        bad += int((~ok).sum()) + int((truth[idx[ok]] != lab[ok]).sum())
    return bad


def private_workers(setting: int | str, jobs: int, cores: int) -> int:
    """Loader workers per private job: the cores shared out among the jobs (at most 8)."""
    if setting == "auto":
        return max(1, min(8, (cores - jobs) // jobs))
    return int(setting)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- data
class Indexed(torch.utils.data.Dataset):
    """``(image, label, index)``: the dataset's own index travels with each sample."""

    def __init__(self, base: torch.utils.data.Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        image, label = self.base[index]
        return image, label, index


def _make_part(args: tuple) -> str:
    root, images, classes, min_side, max_side, seed = args
    return str(make_image_folder(root, images=images, classes=classes, min_side=min_side,
                                 max_side=max_side, seed=seed))  # fmt: skip


def prepare_images(cfg: Config, procs: int | None = None) -> Path:
    """The JPEG folder for ``cfg`` (reused when already there), generated in parallel: one
    :func:`make_image_folder` part per process, hard-linked into one class-folder layout."""
    params = {"images": cfg.images, "classes": cfg.classes, "min_side": cfg.min_side,
              "max_side": cfg.max_side}  # fmt: skip
    root = Path(cfg.data_dir) / f"gpu-share-{cfg.images}-{cfg.min_side}x{cfg.max_side}-c{cfg.classes}"
    marker = root / "gpu-share-images.json"
    if marker.exists() and json.loads(marker.read_text()) == params:
        return root
    if root.exists():
        shutil.rmtree(root)
    parts = max(1, min(procs or _cores(), cfg.images // 32))
    sizes = [cfg.images // parts + (k < cfg.images % parts) for k in range(parts)]
    scratch = root.with_name(root.name + ".parts")  # not under root: ImageFolder takes every folder
    shutil.rmtree(scratch, ignore_errors=True)
    jobs = [(str(scratch / f"p{k:02d}"), n, cfg.classes, cfg.min_side, cfg.max_side, k)
            for k, n in enumerate(sizes)]  # fmt: skip
    if parts == 1:
        done = [_make_part(jobs[0])]
    else:
        with ProcessPoolExecutor(parts, mp_context=CTX) as pool:
            done = list(pool.map(_make_part, jobs))
    for k, part in enumerate(done):
        for jpg in sorted(Path(part).glob("*/*.jpg")):
            (root / jpg.parent.name).mkdir(parents=True, exist_ok=True)
            os.link(jpg, root / jpg.parent.name / f"p{k:02d}_{jpg.name}")
    shutil.rmtree(scratch)
    marker.write_text(json.dumps(params))
    return root


def build_model(name: str, classes: int) -> torch.nn.Module:
    """A repository bench model by name, else a torchvision model (``resnet18``, ...)."""
    if name in MODELS:
        return MODELS[name](classes=classes)
    import torchvision

    return getattr(torchvision.models, name)(num_classes=classes)


def resolve_model(name: str) -> tuple[str, str]:
    """The model to train and a note: torchvision's where it imports, else a bench model."""
    if name in MODELS:
        return name, ""
    try:
        import torchvision

        getattr(torchvision.models, name)
    except ImportError as exc:
        return "small_resnet", f"torchvision does not import ({exc}): small_resnet instead of {name}"
    except AttributeError:
        raise ValueError(f"unknown model {name!r}: a torchvision model or one of {sorted(MODELS)}") from None
    return name, ""


# --------------------------------------------------------------------------- job processes
@dataclass
class GpuJobResult(JobResult):
    """A job's figures; ``start``/``end`` bound its timed window (between its warm-up and
    cool-down steps); ``samples`` counts every step, ``timed_samples`` the window's."""

    steps: int = 0
    timed_samples: int = 0
    indices: list = field(default_factory=list)  # per epoch: dataset indices (not in the JSON)
    labels: list = field(default_factory=list)  # per epoch: the labels trained on
    long_waits: list = field(default_factory=list)  # (step, seconds) of next() calls over 0.5 s
    timeline: list = field(default_factory=list)  # (time, samples so far) after each step (not in the JSON)


def _unpack(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(images, labels, indices or None)`` of a batch in any of the modes' layouts."""
    if isinstance(batch, dict):
        return batch["image"], batch["label"], batch.get("index")
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2 and isinstance(batch[1], (tuple, list)):  # TensorSocket: (i, batch)
            batch = batch[1]
        return batch[0], batch[1], batch[2] if len(batch) > 2 else None
    raise TypeError(f"unexpected batch type {type(batch).__name__}")


def _train_step(model: torch.nn.Module, dev: torch.device) -> Callable[[torch.Tensor, torch.Tensor], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        x = images.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = labels.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _sources(cfg: Config, mode: str, root: str, endpoint: Any, dev: torch.device, jobs: int):
    """``(epoch -> iterable of batches, close)`` for one job of ``mode``."""
    b = cfg.batch_size
    if mode == "limit":
        x = torch.randn(b, 3, cfg.crop, cfg.crop, device=dev).to(DTYPES[cfg.dtype])
        y = torch.randint(0, cfg.classes, (b,), device=dev)
        sizes = [b] * (cfg.images // b) + ([cfg.images % b] if cfg.images % b else [])

        def synthetic(_e: int):
            return ((x[:n], y[:n], None) for n in sizes)

        return synthetic, lambda: None
    if mode == "private":
        workers = private_workers(cfg.workers, jobs, _cores())
        loader = torch.utils.data.DataLoader(
            Indexed(ImageFolder(root, crop=cfg.crop)), batch_size=b, shuffle=True,
            num_workers=workers, pin_memory=dev.type == "cuda", persistent_workers=workers > 0,
        )  # fmt: skip
        return (lambda _e: loader), lambda: None
    if mode in ("host", "gpu"):
        from tandem.share import Consumer

        consumer = Consumer(endpoint, batch_size=b, device=cfg.device, timeout=cfg.start_timeout_s,
                            data_timeout=cfg.data_timeout_s)  # fmt: skip
        return (lambda _e: consumer), consumer.close
    if mode == "tensorsocket":
        made: list = []

        def epoch(_e: int):
            # Its constructor blocks until the producer iterates: built inside the clock.
            if not made:
                from tensorsocket import TensorConsumer

                made.append(TensorConsumer(endpoint[0], endpoint[1], heart_ports=(endpoint[2], endpoint[3]),
                                           batch_size=b))  # fmt: skip
            it = iter(made[0])
            return (next(it) for _ in range(len(made[0])))  # one epoch, whatever its StopIteration does

        return epoch, lambda: None
    raise ValueError(f"unknown mode {mode!r}")


def _train(
    cfg: Config, mode: str, root: str, endpoint: Any, jobs: int, built, ready, progress
) -> GpuJobResult:
    torch.set_num_threads(1)
    dev = torch.device(cfg.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    model = build_model(cfg.model, cfg.classes).to(dev, memory_format=torch.channels_last)
    step = _train_step(model, dev)
    source, close = _sources(cfg, mode, root, endpoint, dev, jobs)
    built.put(os.getpid())
    if not ready.wait(cfg.start_timeout_s):
        raise TimeoutError(f"no common start within {cfg.start_timeout_s:g} s")
    try:
        return _timed(cfg, source, step, dev, progress)
    finally:
        close()


def _timed(cfg: Config, source, step, dev: torch.device, progress) -> GpuJobResult:
    """Train ``cfg.epochs`` epochs. The timed window runs from the end of step ``warmup`` to
    the end of step ``planned - cooldown``, the GPU synchronised at both ends: the input
    buffers (producer window, loader prefetch) fill during the warm-up and drain at the end,
    and both are left out. Indices and labels are cloned where they are (a consumer's batch
    is a view until the next one) and brought to the host only after the run."""
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    res = GpuJobResult(job=os.getpid())
    progress[2] = os.getpid()
    cpu0 = tree_cpu_s()
    planned = cfg.epochs * -(-cfg.images // cfg.batch_size)
    last_timed = planned - cfg.cooldown
    if last_timed <= cfg.warmup:
        raise ValueError(f"{planned} steps per job leave none between the {cfg.warmup} warm-up "
                         f"and {cfg.cooldown} cool-down steps: more --images or --epochs")  # fmt: skip
    timed_from = timed_to = None
    if cfg.warmup == 0:
        res.start, timed_from = time.monotonic(), 0
    seen: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    for e in range(cfg.epochs):
        idx_parts: list[torch.Tensor] = []
        lab_parts: list[torch.Tensor] = []
        seen.append((idx_parts, lab_parts))
        for batch, waited in waited_batches(source(e)):
            res.stall_s += waited
            if waited > 0.5 and len(res.long_waits) < 50:
                res.long_waits.append((res.steps, round(waited, 3)))
            images, labels, idx = _unpack(batch)
            if idx is not None:
                idx_parts.append(idx.clone())
                lab_parts.append(labels.clone())
            step(images, labels)
            res.steps += 1
            res.samples += len(labels)
            if res.steps == cfg.warmup:
                sync()
                res.start, timed_from = time.monotonic(), res.samples
                progress[1] = res.start
            if res.steps == last_timed:
                sync()
                res.end, timed_to = time.monotonic(), res.samples
            # When the step was queued: the GPU runs behind by at most a few steps, small
            # against a window of hundreds; the window's own ends are synchronised.
            at = res.start if res.steps == cfg.warmup else res.end if res.steps == last_timed else None
            res.timeline.append((at if at is not None else time.monotonic(), res.samples))
            progress[0] = res.samples
            progress[3] = res.stall_s
    sync()
    res.cpu_s = tree_cpu_s() - cpu0
    if timed_from is None or timed_to is None:
        res.error = f"{res.steps} steps of the {planned} planned"
        return res
    res.timed_samples = timed_to - timed_from
    res.wall_s = res.end - res.start
    res.samples_per_s = res.timed_samples / res.wall_s if res.wall_s > 0 else 0.0

    def host(parts: list[torch.Tensor]) -> list[int]:
        return torch.cat(parts).reshape(-1).cpu().tolist() if parts else []

    res.indices = [host(i) for i, _ in seen]
    res.labels = [host(lab) for _, lab in seen]
    return res


def _child(env: dict[str, str], target: Callable[..., None], *args: Any) -> None:
    """Run ``target`` as a process the runner started would: with the runner's environment
    now (a forkserver's children inherit the server's, from when it started) and the
    platform's default start method for loader workers. A process started through a
    forkserver inherits that method, and its DataLoader workers would each start a new
    interpreter that imports torch: seconds of CPU each, a first batch tens of seconds late."""
    os.environ.clear()
    os.environ.update(env)
    mp.set_start_method(mp.get_all_start_methods()[0], force=True)
    target(*args)


def _start(target: Callable[..., None], *args: Any) -> Any:
    p = CTX.Process(target=_child, args=(dict(os.environ), target, *args))
    p.start()
    return p


def job_main(
    queue, cfg: Config, mode: str, root: str, endpoint: Any, jobs: int, built, ready, finish, progress
) -> None:
    """One training job (a spawned process): reports a :class:`GpuJobResult` on ``queue``,
    then stays until ``finish`` (so that the runner's last CPU sample still sees it)."""
    try:
        result = _train(cfg, mode, root, endpoint, jobs, built, ready, progress)
    except BaseException as exc:  # noqa: BLE001 - reported to the runner
        result = GpuJobResult(job=os.getpid(), error=f"{type(exc).__name__}: {exc}"[:500])
    result.label = f"{cfg.model} bs{cfg.batch_size}"
    queue.put(result)
    finish.wait(cfg.run_timeout_s)


def _serve(queue, cfg: Config, ready, finish, make: Callable[[], Any]) -> None:
    torch.set_num_threads(1)
    try:
        producer = make()
        with producer:  # consumers may attach now; serving starts with the common start
            workers = getattr(getattr(producer, "_source", None), "num_workers", None)
            queue.put(("serving", os.getpid(), workers))
            if not ready.wait(cfg.start_timeout_s + 30):
                raise TimeoutError("no common start")
            producer.serve(epochs=cfg.epochs)
            queue.put(("producer-done", os.getpid(), None))
            finish.wait(cfg.run_timeout_s)  # with its workers, until the runner's last CPU sample
    except BaseException as exc:  # noqa: BLE001 - reported to the runner
        queue.put(("producer-error", os.getpid(), f"{type(exc).__name__}: {exc}"[:500]))


def host_producer(queue, cfg: Config, root: str, name: str, ready, finish) -> None:
    from tandem.share import Producer

    _serve(queue, cfg, ready, finish, lambda: Producer.from_dataset(
        Indexed(ImageFolder(root, crop=cfg.crop)), name, batch_size=cfg.batch_size, shuffle=True,
        num_workers=cfg.producer_workers))  # fmt: skip


def gpu_producer(queue, cfg: Config, root: str, name: str, ready, finish) -> None:
    from tandem.share import Producer

    samples = ImageFolder(root, crop=cfg.crop).samples
    files, labels = [str(p) for p, _ in samples], [int(c) for _, c in samples]
    _serve(queue, cfg, ready, finish, lambda: Producer.from_files(
        files, name, labels=labels, batch_size=cfg.batch_size, shuffle=True, device=cfg.device,
        crop=cfg.crop, dtype=DTYPES[cfg.dtype], num_workers=cfg.gpu_workers))  # fmt: skip


def tensorsocket_producer(queue, cfg: Config, root: str, ports: tuple[int, ...], ready, finish) -> None:
    torch.set_num_threads(1)
    try:
        from tensorsocket import TensorProducer

        from tandem.share import auto_workers

        workers = auto_workers() if cfg.producer_workers == "auto" else int(cfg.producer_workers)
        loader = torch.utils.data.DataLoader(
            Indexed(ImageFolder(root, crop=cfg.crop)), batch_size=cfg.batch_size, shuffle=True,
            num_workers=workers, pin_memory=cfg.device.startswith("cuda"),
        )  # fmt: skip
        producer = TensorProducer(loader, ports[0], ports[1], heart_ports=(ports[2], ports[3]),
                                  consumer_max_buffer_size=8)  # fmt: skip
        queue.put(("serving", os.getpid(), workers))
        ready.wait(cfg.start_timeout_s + 30)
        for _ in range(cfg.epochs):
            for _ in producer:
                pass
        queue.put(("producer-done", os.getpid(), None))
        finish.wait(cfg.run_timeout_s)
        producer.join()
    except BaseException as exc:  # noqa: BLE001 - reported to the runner
        queue.put(("producer-error", os.getpid(), f"{type(exc).__name__}: {exc}"[:500]))


PRODUCERS = {"host": host_producer, "gpu": gpu_producer, "tensorsocket": tensorsocket_producer}


# --------------------------------------------------------------------------- measurement
class GpuEnergy:
    """NVML's total-energy counter (mJ) of the GPU behind ``device``, via tandem.watch."""

    def __init__(self, device: str):
        self.why_not = ""
        self._sampler: Any = None
        self._device: Any = None
        if not device.startswith("cuda"):
            self.why_not = "not a GPU run"
            return
        try:
            from tandem.watch.samplers.nvml import NvmlSampler

            sampler = NvmlSampler(run_pids=lambda: ())
        except Exception as exc:  # noqa: BLE001 - no energy figures, the run goes on
            self.why_not = f"NVML unavailable: {exc}"
            return
        ok, why = sampler.available()
        ordinal = torch.device(device).index or 0
        found = [d for d in sampler.devices if d.ordinal == ordinal]
        if not ok or not found:
            self.why_not = why or f"NVML does not see {device}"
        elif found[0].mig:
            self.why_not = "a MIG instance: NVML gives energy for the whole GPU only"
        elif sampler.read(found[0]).energy_mj is None:
            self.why_not = "this GPU has no total-energy counter"
        else:
            self._sampler, self._device = sampler, found[0]
            return
        sampler.close()

    def read_mj(self) -> float | None:
        if self._sampler is None:
            return None
        value = self._sampler.read(self._device).energy_mj
        return None if value is None else float(value)

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None


class TreeSampler(_Every):
    """Cumulative CPU-seconds of this process's descendants by role (``job``, ``producer``,
    ``workers``: a descendant of a job or producer, i.e. a loader worker; ``other``: the rest,
    such as the forkserver that starts them) and the GPU energy counter, every 0.2 s; a
    process that is gone keeps its last figure. :meth:`between` reads them over a window."""

    ROLES = ("job", "producer", "workers", "other")

    def __init__(self, energy: GpuEnergy):
        super().__init__(SAMPLE_INTERVAL_S)
        self.roles: dict[int, str] = {}  # pid -> role, set by the runner as it starts them
        self._energy = energy
        self._lock = threading.Lock()  # the runner ticks too, once the jobs are done
        self._me = psutil.Process()
        self._last: dict[tuple[int, float], float] = {}  # (pid, create time) -> CPU s
        self._role_of: dict[tuple[int, float], str] = {}  # (pid, create time) -> role
        self.times: list[float] = []
        self.cpu: dict[str, list[float]] = {r: [] for r in self.ROLES}
        self.energy_mj: list[float | None] = []

    def tick(self) -> None:
        with self._lock:
            self._tick()

    def _tick(self) -> None:
        try:
            kids = self._me.children(recursive=True)
        except psutil.Error:
            kids = []
        for p in kids:
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
                self._last[key] = t.user + t.system
                if key not in self._role_of:
                    self._role_of[key] = self._role(p)
            except psutil.Error:
                pass
        now = time.monotonic()
        totals = dict.fromkeys(self.ROLES, 0.0)
        for key, cpu in self._last.items():
            totals[self.roles.get(key[0]) or self._role_of.get(key, "other")] += cpu
        energy = self._energy.read_mj()
        self.times.append(now)
        for role in self.ROLES:
            self.cpu[role].append(totals[role])
        self.energy_mj.append(energy)

    def _role(self, p: psutil.Process) -> str:
        """A process the runner did not start itself: a loader worker of a job or producer
        (by ancestry), or something else (``other``: not input)."""
        if p.pid in self.roles:
            return self.roles[p.pid]
        try:
            ancestors = p.parents()
        except psutil.Error:
            return "other"
        return "workers" if any(a.pid in self.roles for a in ancestors) else "other"

    def between(self, t0: float, t1: float) -> tuple[dict[str, float], float | None]:
        """CPU-seconds by role and GPU joules from ``t0`` to ``t1`` (interpolated; energy from
        the readings that succeeded, None unless they cover the window)."""
        if len(self.times) < 2 or t1 <= t0:
            return dict.fromkeys(self.ROLES, 0.0), None
        ts = np.asarray(self.times)
        cpu = {r: float(np.interp(t1, ts, v) - np.interp(t0, ts, v)) for r, v in self.cpu.items()}
        read = [(t, e) for t, e in zip(self.times, self.energy_mj) if e is not None]
        if len(read) < 2 or read[0][0] > t0 or read[-1][0] < t1:
            return cpu, None
        et = np.asarray([t for t, _ in read])
        e = np.asarray([v for _, v in read], dtype=np.float64)
        return cpu, float(np.interp(t1, et, e) - np.interp(t0, et, e)) / 1000.0


@dataclass
class ModeRun:
    mode: str
    jobs: int
    status: str = "ok"  # ok | failed | unavailable
    note: str = ""
    samples: int = 0  # all jobs' timed samples
    window_s: float = 0.0  # the union of the jobs' timed windows
    samples_per_s: float = 0.0
    pct_of_limit: float | None = None
    cpu_s: float = 0.0  # every process of the run, over the window
    cpu_s_per_sample: float | None = None
    cores_busy: float | None = None
    cores_by_role: dict = field(default_factory=dict)
    input_cores: float | None = None  # cores busy in the producer and loader workers
    cores_over_limit: float | None = None  # cores busy less the limit's for the same N
    gpu_joules: float | None = None
    joules_per_sample: float | None = None
    lost: int | None = None
    duplicated: int | None = None
    label_mismatches: int | None = None
    workers: str = ""
    leaked_producers: list = field(default_factory=list)
    elapsed_s: float = 0.0  # the whole run, start-up included
    per_job: list = field(default_factory=list)


def unavailable(mode: str, cfg: Config) -> str | None:
    """Why ``mode`` cannot run here, or None."""
    cuda = cfg.device.startswith("cuda")
    if mode == "tensorsocket":
        if not tensorsocket_available():
            return "tensorsocket is not installed (pip install 'tandem[compare]')"
        if not cuda:
            return "TensorSocket is compared on a GPU only"
    if mode not in MODES:
        return f"unknown mode (one of {', '.join(MODES)})"
    return None


def _get(q, timeout: float, alive: Callable[[], bool]) -> Any:
    """The next item of ``q`` within ``timeout`` s (0: only one already there), or None; also
    None as soon as the queue is empty and none of the run's processes is alive."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return q.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        except queue_mod.Empty:
            if time.monotonic() >= deadline or not alive():
                return None


def run_one(mode: str, n: int, cfg: Config, root: str, truth: np.ndarray) -> ModeRun:
    """Run ``n`` jobs of ``mode`` to the end (or the timeouts) and measure them."""
    r = ModeRun(mode, n)
    why = unavailable(mode, cfg)
    if why:
        r.status, r.note = "unavailable", f"unavailable: {why}"
        return r
    began = time.monotonic()
    q, built, ready, finish = CTX.Queue(), CTX.Queue(), CTX.Event(), CTX.Event()
    progress = [CTX.Array("d", 4, lock=False) for _ in range(n)]
    name = f"gpubench-{os.getpid()}-{mode}-{n}-{time.monotonic_ns() % 10**6}"
    endpoint: Any = _free_ports(4) if mode == "tensorsocket" else name
    procs: list = []
    jobs: list = []
    results: list[GpuJobResult] = []
    notes: list[str] = []
    serving = mode not in SHARED_MODES
    if mode == "private":
        r.workers = f"{private_workers(cfg.workers, n, _cores())} per job"

    def handle(item: Any) -> None:
        nonlocal serving
        if isinstance(item, JobResult):
            results.append(item)
        elif item[0] == "serving":
            serving = True
            asked = cfg.gpu_workers if mode == "gpu" else cfg.producer_workers
            r.workers = f"{asked if item[2] is None else item[2]} in the producer"
        elif item[0] == "producer-error":
            notes.append(f"producer: {item[2]}")

    def alive() -> bool:
        return any(p.is_alive() for p in procs)

    energy = GpuEnergy(cfg.device)
    sampler = TreeSampler(energy)
    try:
        with sampler:
            if mode in SHARED_MODES:
                producer = _start(PRODUCERS[mode], q, cfg, root, endpoint, ready, finish)
                procs.append(producer)
                sampler.roles[producer.pid] = "producer"
                # TensorSocket's consumers need a live producer, and "auto" workers count the
                # cores that are free: then the jobs start once the producer serves.
                if mode == "tensorsocket" or cfg.producer_workers == "auto" and mode == "host":
                    item = _get(q, cfg.start_timeout_s, alive)
                    if item is None:
                        notes.append("producer: not serving within the start timeout")
                    else:
                        handle(item)
            if not notes:
                shared = (q, cfg, mode, root, endpoint, n, built, ready, finish)
                jobs = [_start(job_main, *shared, pr) for pr in progress]
                for p in jobs:
                    sampler.roles[p.pid] = "job"
                procs += jobs
            # Until every job is built (model, loader or consumer) and the producer serves; a
            # failure on the way ends the run.
            waiting = len(jobs)
            deadline = time.monotonic() + cfg.start_timeout_s
            while (waiting or not serving) and not notes and not results and time.monotonic() < deadline:
                while (item := _get(q, 0.0, alive)) is not None:
                    handle(item)
                if waiting and _get(built, 0.2, alive) is not None:
                    waiting -= 1
                elif not waiting:
                    time.sleep(0.05)
                if not alive():
                    break
            if waiting or not serving:
                notes.append(f"{waiting} job(s) not built, producer serving: {serving}, after "
                             f"{time.monotonic() - began:.0f} s")  # fmt: skip
            if not notes and not results:
                ready.set()  # the common start
                sampler.tick()  # a sample before any window starts (np.interp clamps outside them)
                deadline = time.monotonic() + cfg.run_timeout_s
                while len(results) < n and time.monotonic() < deadline:
                    item = _get(q, deadline - time.monotonic(), alive)
                    if item is None:
                        break
                    handle(item)
                if len(results) < n:
                    missing = n - len(results)
                    notes.append(f"{missing} job(s) gave no result within {cfg.run_timeout_s:g} s: killed")
            sampler.tick()  # while every process is still there: the window's CPU is all seen
            finish.set()
            _reap(procs, grace_s=15.0 if len(results) == n else 0.5)
            procs = []
    finally:
        _reap(procs, grace_s=0.5)
        energy.close()
        for qq in (q, built):
            qq.close()
            qq.cancel_join_thread()
    if mode in ("host", "gpu"):
        from tandem.share import live_producers

        r.leaked_producers = [p.name for p in live_producers() if p.name == name]
    r.elapsed_s = time.monotonic() - began
    _summarise(r, results, notes, sampler, cfg, truth)
    return r


def _summarise(r: ModeRun, results: list[GpuJobResult], notes: list[str], sampler: TreeSampler,
               cfg: Config, truth: np.ndarray) -> None:  # fmt: skip
    done = [j for j in results if not j.error]
    notes += [f"job {j.job}: {j.error}" for j in results if j.error]
    if r.leaked_producers:
        notes.append(f"producer still registered after the run: {r.leaked_producers}")
    r.samples_per_s, t0, t1, r.samples = union_rate(
        [(j.start, j.end) for j in done], [j.timeline for j in done]
    )
    r.window_s = t1 - t0
    cpu, joules = sampler.between(t0, t1)
    r.cpu_s = sum(cpu.values())
    if r.window_s > 0:
        r.cores_busy = r.cpu_s / r.window_s
        r.cores_by_role = {k: round(v / r.window_s, 3) for k, v in cpu.items()}
    if r.samples:
        r.cpu_s_per_sample = r.cpu_s / r.samples
        if joules is not None:
            r.gpu_joules = joules
            r.joules_per_sample = joules / r.samples
    if r.mode != "limit" and done:
        size = int(truth.size)
        accounts = [epoch_accounting(j.indices, size, cfg.epochs) for j in done]
        r.lost = sum(a[0] for a in accounts)
        r.duplicated = sum(a[1] for a in accounts)
        r.label_mismatches = sum(label_mismatches(j.indices, j.labels, truth) for j in done)
    hidden = ("indices", "labels", "timeline")
    r.per_job = [{k: v for k, v in asdict(j).items() if k not in hidden} for j in results]
    if notes or len(done) < r.jobs:
        r.status = "failed"
    r.note = "; ".join(notes)[:1000]


# --------------------------------------------------------------------------- driver
def machine_facts(cfg: Config) -> dict:
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cores_usable": _cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    try:
        import torchvision

        facts["torchvision"] = torchvision.__version__
    except Exception:  # noqa: BLE001
        facts["torchvision"] = None
    if cfg.device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(cfg.device).index or 0
        props = torch.cuda.get_device_properties(index)
        facts["gpu"] = props.name
        facts["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return facts


def _cross_run(runs: list[ModeRun]) -> None:
    """% of the limit (and cores over it) from the ``limit`` run of the same N; input cores."""
    limits = {r.jobs: r for r in runs if r.mode == "limit" and r.status == "ok" and r.samples_per_s}
    for r in runs:
        limit = limits.get(r.jobs)
        if r.cores_busy is None:
            continue
        if limit is not None and r.samples_per_s:
            r.pct_of_limit = 100.0 * r.samples_per_s / limit.samples_per_s
        if r.mode != "limit":
            r.input_cores = r.cores_by_role.get("producer", 0.0) + r.cores_by_role.get("workers", 0.0)
            if limit is not None and limit.cores_busy is not None:
                r.cores_over_limit = r.cores_busy - limit.cores_busy


def targets(runs: list[ModeRun], cfg: Config, facts: dict, jobs: Sequence[int]) -> list[dict]:
    """The issue's targets (set for N=4 ResNet-18 on an H100 with 16 cores), pass or fail."""
    n = 4 if 4 in jobs else max(jobs)
    setting = (cfg.model == "resnet18" and n == 4 and "H100" in str(facts.get("gpu"))
               and facts.get("cores_usable") == 16)  # fmt: skip

    def find(mode: str) -> ModeRun | None:
        return next((r for r in runs if r.mode == mode and r.jobs == n), None)

    def share_target(mode: str, pct_min: float, cores_max: float | None) -> dict:
        text = f"N={n} {mode} path >= {pct_min:g}% of the limit" + (
            f" with <= {cores_max:g} cores busy for input" if cores_max is not None else ""
        )
        r = find(mode)
        if r is None or r.status != "ok" or r.pct_of_limit is None:
            why = "not run" if r is None else r.note or f"no limit run for N={n}"
            return {"target": text, "measured": why, "met": False, "setting_matches": setting}
        measured = f"{r.pct_of_limit:.0f}% of the limit, {r.input_cores or 0:.1f} input cores"
        met = r.pct_of_limit >= pct_min and (cores_max is None or (r.input_cores or 0) <= cores_max)
        met = met and setting  # a target counts as met only in the setting it was set for
        return {"target": text, "measured": measured, "value": r.pct_of_limit,
                "input_cores": r.input_cores, "met": met, "setting_matches": setting}  # fmt: skip

    out = [share_target("gpu", 90, 4), share_target("host", 70, None)]
    checked = [r for r in runs if r.mode != "limit" and r.status in ("ok", "failed")]
    accounted = [r for r in checked if r.lost is not None]
    lost = sum(r.lost or 0 for r in accounted)
    dup = sum(r.duplicated or 0 for r in accounted)
    bad = sum(r.label_mismatches or 0 for r in accounted)
    failed = [f"{r.mode} x{r.jobs}" for r in checked if r.status == "failed"]
    measured = f"lost {lost}, duplicated {dup}, wrong labels {bad} over {len(accounted)} run(s)"
    if failed:
        measured += f"; failed: {', '.join(failed)}"
    out.append({"target": "no sample lost or duplicated (each job's each epoch a permutation)",
                "measured": measured, "met": bool(accounted) and not failed and lost == dup == bad == 0,
                "setting_matches": True})  # fmt: skip
    return out


COLUMNS = ("mode", "N", "samples/s", "% limit", "CPU ms/sample", "cores busy", "input cores",
           "J/sample", "lost", "dup", "note")  # fmt: skip


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table_rows(runs: list[ModeRun]) -> list[list[str]]:
    rows = []
    for r in runs:
        rate = "-" if r.status in ("unavailable", "skipped") else f"{r.samples_per_s:.0f}"
        cpu_ms = None if r.cpu_s_per_sample is None else 1000 * r.cpu_s_per_sample
        rows.append([r.mode, str(r.jobs), rate, _fmt(r.pct_of_limit, ".0f"), _fmt(cpu_ms, ".2f"),
                     _fmt(r.cores_busy, ".1f"), _fmt(r.input_cores, ".1f"), _fmt(r.joules_per_sample, ".3f"),
                     _fmt(r.lost, "d"), _fmt(r.duplicated, "d"), r.note[:120]])  # fmt: skip
    return rows


def text_table(runs: list[ModeRun]) -> str:
    rows = [list(COLUMNS), *table_rows(runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows)


def write_markdown(report: dict, runs: list[ModeRun], path: Path) -> None:
    m, c = report["machine"], report["config"]
    lines = [
        f"# tandem GPU share benchmark: results of {report['when']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: GPU {m.get('gpu') or 'none'}, {m['cores_usable']} usable cores ({m['cpus']} CPUs), "
        f"{m['platform']}, Python {m['python']}, torch {m['torch']} (CUDA {m['cuda']}), "
        f"torchvision {m.get('torchvision')}.",
        "",
        f"Workload: {c['images']} generated JPEGs ({c['min_side']}-{c['max_side']} px sides, "
        f"{c['classes']} classes), {c['epochs']} epoch(s) per job, batch {c['batch_size']}, crop "
        f"{c['crop']}, model {c['model']} (bf16 autocast, channels-last, SGD), first {c['warmup']} "
        f"and last {c['cooldown']} steps of each job untimed. Loader workers: private "
        f"{c['workers']} per job, host producer "
        f"{c['producer_workers']}, GPU-path producer {c['gpu_workers']}; GPU-path dtype {c['dtype']}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(runs)]
    lines += ["", "| target | measured | met | setting as specified |", "|---|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} "
                     f"| {'yes' if t['setting_matches'] else 'no'} |")  # fmt: skip
    lines += ["", "Definitions:", ""] + [f"- {k}: {v}" for k, v in report["definitions"].items()]
    path.write_text("\n".join(lines) + "\n")


DEFINITIONS = {
    "samples/s": "all jobs' timed samples over the union of their timed windows, from the "
    "earliest job's first timed step to the latest job's last (GPU synchronised at both ends; "
    "each job's first `warmup` and last `cooldown` steps untimed, so that input buffers filled "
    "in the warm-up and drained at the end count for nothing)",
    "% limit": "samples/s as a share of the limit mode's (synthetic batches on the GPU) for the same N",
    "CPU ms/sample": "CPU time of every process of the run (jobs, producer, loader workers), "
    "sampled from the process tree every 0.2 s, over the same window, per timed sample",
    "cores busy": "that CPU time over the window's length; by role in the JSON (cores_by_role)",
    "input cores": "cores busy in the processes that do nothing but input: the producer and the "
    "loader workers (the jobs' own processes are left out; cores_over_limit in the JSON is the "
    "run's cores busy less the limit mode's for the same N)",
    "J/sample": "GPU energy (NVML total-energy counter, whole device) over the window, per timed sample",
    "lost/dup": "over every job and epoch: dataset indices an epoch missed / had more than once",
}


def run(
    cfg: Config | None = None,
    *,
    jobs: Sequence[int] = (1, 2, 4),
    modes: Sequence[str] | None = None,
    out: Path | None = None,
    smoke: bool = False,
    command: str | None = None,
    budget_s: float | None = None,
    log: Callable[[str], None] = lambda s: print(s, flush=True),
) -> dict:
    """Run every mode for every N in ``jobs``; write ``out`` (JSON) and its ``.md``; return
    the report. ``smoke``: on the CPU (``cfg`` defaults to :func:`smoke_config`).
    ``budget_s``: runs that would start after this many seconds are skipped."""
    began = time.monotonic()
    if CTX.get_start_method() == "forkserver":
        CTX.set_forkserver_preload(PRELOAD)
    if cfg is None:
        cfg = smoke_config() if smoke else Config()
    if smoke:
        cfg = _replace(cfg, device="cpu")
    elif cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise CudaNeeded(
            "CUDA needed: this benchmark trains on a GPU and torch sees none here "
            f"(torch {torch.__version__}); --smoke runs its machinery on the CPU"
        )
    model, model_note = resolve_model(cfg.model)
    cfg = _replace(cfg, model=model)
    modes = tuple(modes or (SMOKE_MODES if smoke else MODES))
    out = Path(out or (SMOKE_OUT if smoke else DEFAULT_OUT))
    facts = machine_facts(cfg)
    where = facts.get("gpu") or "CPU (smoke)"
    log(f"gpu_share: {where}, {facts['cores_usable']} cores, torch {facts['torch']}; {cfg.model} "
        f"batch {cfg.batch_size}, {cfg.images} images x {cfg.epochs} epoch(s), N in {list(jobs)}, "
        f"modes {list(modes)}")  # fmt: skip
    if model_note:
        log(f"note: {model_note}")
    t = time.monotonic()
    root = prepare_images(cfg)
    truth = np.array([label for _, label in ImageFolder(root, crop=cfg.crop).samples], dtype=np.int64)
    log(f"images ready in {root} ({time.monotonic() - t:.1f} s)")
    report: dict[str, Any] = {
        "machine": facts,
        "config": asdict(cfg),
        "command": command or f"python3 benchmarks/gpu_share.py{' --smoke' if smoke else ''}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "jobs": list(jobs),
        "modes": list(modes),
        "notes": [model_note] if model_note else [],
        "definitions": DEFINITIONS,
    }
    runs: list[ModeRun] = []
    plan = [(n, mode) for n in jobs for mode in modes]
    for k, (n, mode) in enumerate(plan, 1):
        if budget_s is not None and time.monotonic() - began > budget_s:
            runs.append(ModeRun(mode, n, status="skipped", note=f"skipped: over the {budget_s:g} s budget"))
            continue
        log(f"[{k}/{len(plan)}] {mode} x{n} ({time.monotonic() - began:.0f} s in) ...")
        r = run_one(mode, n, cfg, str(root), truth)
        runs.append(r)
        _cross_run(runs)
        log(f"    {r.status}: {r.samples_per_s:.0f} samples/s, window {r.window_s:.1f} s of "
            f"{r.elapsed_s:.1f} s, cores busy {_fmt(r.cores_busy, '.1f')}, lost {_fmt(r.lost, 'd')}, "
            f"dup {_fmt(r.duplicated, 'd')}" + (f"; {r.note}" if r.note else ""))  # fmt: skip
        _write(report, runs, cfg, facts, jobs, out)  # after every run: a cut-off run keeps its results
    report = _write(report, runs, cfg, facts, jobs, out)
    log("")
    log(text_table(runs))
    log("")
    for tgt in report["targets"]:
        where = "" if tgt["setting_matches"] else " [not the target's setting: N=4 resnet18, H100, 16 cores]"
        log(f"{'PASS' if tgt['met'] else 'FAIL'}: {tgt['target']} (measured {tgt['measured']}){where}")
    log(f"results written to {out} and {out.with_suffix('.md')} ({time.monotonic() - began:.0f} s)")
    return report


def _write(
    report: dict, runs: list[ModeRun], cfg: Config, facts: dict, jobs: Sequence[int], out: Path
) -> dict:
    report["runs"] = [asdict(r) for r in runs]
    report["targets"] = targets(runs, cfg, facts, jobs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    write_markdown(report, runs, out.with_suffix(".md"))
    return report


def _replace(cfg: Config, **changes: Any) -> Config:
    from dataclasses import replace

    return replace(cfg, **changes)


def _workers_arg(text: str) -> int | str:
    if text == "auto":
        return text
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("a non-negative integer or 'auto'")
    return value


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu_share",
        description="N jobs training on one GPU from one JPEG folder: the GPU's limit, private "
        "DataLoaders, tandem's host path, tandem's GPU path, TensorSocket.",
    )
    p.add_argument(
        "--jobs", type=_int_list, default=None, help="comma-separated N (default 1,2,4; smoke 1,2)"
    )
    p.add_argument("--modes", default=None, help=f"comma-separated, of {','.join(MODES)} (default all)")
    p.add_argument("--model", default=None, help="torchvision model or bench model (default resnet18)")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=None, help="default 128")
    p.add_argument("--images", type=int, default=None, help="JPEGs generated (default 4096)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per job (default 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed first steps per job (default 20)")
    p.add_argument("--cooldown", type=int, default=None, help="untimed last steps per job (default 20)")
    p.add_argument("--classes", type=int, default=None, help="default 100")
    p.add_argument("--min-side", dest="min_side", type=int, default=None, help="default 333")
    p.add_argument("--max-side", dest="max_side", type=int, default=None, help="default 500")
    p.add_argument(
        "--workers",
        type=_workers_arg,
        default=None,
        help="private: loader workers per job (default auto: the cores / N, at most 8)",
    )
    p.add_argument(
        "--producer-workers",
        dest="producer_workers",
        type=_workers_arg,
        default=None,
        help="host path: the producer's loader workers (default auto)",
    )
    p.add_argument(
        "--gpu-workers",
        dest="gpu_workers",
        type=_workers_arg,
        default=None,
        help="GPU path: the producer's file-reading workers (default 4)",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="GPU path's images (default bf16)")
    p.add_argument(
        "--timeout",
        dest="run_timeout_s",
        type=float,
        default=None,
        help="seconds per run from the common start (default 180)",
    )
    p.add_argument(
        "--budget-s",
        dest="budget_s",
        type=float,
        default=None,
        help="skip the runs that would start after this many seconds",
    )
    p.add_argument("--data-dir", dest="data_dir", default=None, help="default data/bench-images")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON path; the markdown goes beside it (default {DEFAULT_OUT})",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="on the CPU: a tiny model and images, modes limit, private, host, gpu (its CPU fallback)",
    )
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python3 benchmarks/gpu_share.py") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    base = smoke_config() if args.smoke else Config()
    given = {f.name: getattr(args, f.name) for f in fields(Config) if getattr(args, f.name, None) is not None}
    cfg = _replace(base, **given)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] if args.modes else None
    bad = [m for m in modes or () if m not in MODES]
    if bad:
        print(f"gpu_share: unknown mode(s) {bad}: use {', '.join(MODES)}", file=sys.stderr)
        return 2
    try:
        jobs = args.jobs or ([1, 2] if args.smoke else [1, 2, 4])
        run(cfg, jobs=jobs, modes=modes, out=args.out, smoke=args.smoke,
            command=f"{prog} {shlex.join(argv)}".strip(), budget_s=args.budget_s)  # fmt: skip
    except (CudaNeeded, ValueError) as exc:
        print(f"gpu_share: {exc}", file=sys.stderr)
        return 2
    return 0
