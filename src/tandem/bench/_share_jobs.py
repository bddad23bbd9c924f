"""The job processes of the share benchmark (:mod:`tandem.bench.share_bench`): one private
DataLoader job, one tandem producer and consumer job, one TensorSocket producer and job.

Each runs in a spawned process and follows the harness's steps (:mod:`tandem.bench.harness`):
builds its loader, says so, waits for the common start, then reports its
:class:`~tandem.bench.harness.JobResult` (samples, stall, CPU of its own tree).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from tandem.bench.data import ImageFolder
from tandem.bench.harness import JobResult, cpu_from, tree_cpu_s, waited_batches
from tandem.bench.models import MODELS


@dataclass
class ShareBenchConfig:
    images: int = 512
    epochs: int = 2
    batch_size: int = 32
    crop: int = 224
    workers: int = 2  # DataLoader worker processes, per private job and for the producer
    sleep_ms: float = 25.0  # simulated accelerator step per batch
    model: str = "tiny_cnn"
    run_timeout_s: float = 90.0
    data_dir: str = "data/bench-images"


# --------------------------------------------------------------------------- job processes
def _step_fn(step: str, cfg: ShareBenchConfig, model_name: str | None = None):
    if step == "sleep":
        delay = cfg.sleep_ms / 1000

        def sleep_step(images: torch.Tensor, labels: torch.Tensor) -> None:
            time.sleep(delay)

        return sleep_step
    torch.set_num_threads(1)
    model = MODELS[model_name or cfg.model]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train_step(images: torch.Tensor, labels: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(images), labels).backward()
        opt.step()

    return train_step


def _timed_epochs(batches_per_epoch, epochs: int, step, progress, unpack=lambda b: b) -> JobResult:
    """Iterate, timing the waits for data; returns samples, wall, stall and CPU time."""
    res = JobResult(job=os.getpid())
    cpu0 = tree_cpu_s()
    res.start = time.monotonic()
    progress[1] = res.start
    progress[2] = os.getpid()
    t_start = time.perf_counter()
    for e in range(epochs):
        for batch, waited in waited_batches(batches_per_epoch(e)):
            res.stall_s += waited
            images, labels = unpack(batch)
            step(images, labels)
            res.samples += len(labels)
            progress[0] = res.samples  # read by the runner if this job must be killed
            progress[3] = res.stall_s  # read by the runner to log it while the job runs
    res.wall_s = time.perf_counter() - t_start
    res.end = time.monotonic()
    res.cpu_s = tree_cpu_s() - cpu0
    res.samples_per_s = res.samples / res.wall_s if res.wall_s else 0.0
    return res


def _report(queue, fn, cfg: ShareBenchConfig, job: JobSpec, *args) -> None:
    label = job.label(cfg)
    try:
        result = fn(cfg, job, *args)
        result.label = label
    except BaseException as exc:  # noqa: BLE001 - reported to the runner
        result = JobResult(job=os.getpid(), label=label, error=f"{type(exc).__name__}: {exc}")
    queue.put(result)


@dataclass(frozen=True)
class JobSpec:
    """One training job: its step, and (for ``cnn``) its model; its own batch size."""

    step: str = "sleep"
    model: str | None = None
    batch_size: int | None = None  # None: the config's

    def label(self, cfg: ShareBenchConfig) -> str:
        return f"{self.model or self.step} bs{self.batch_size or cfg.batch_size}"


def _private_job(cfg: ShareBenchConfig, job: JobSpec, root: str, built, ready, progress) -> JobResult:
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(
        ImageFolder(root, crop=cfg.crop),
        batch_size=job.batch_size or cfg.batch_size,
        shuffle=True,
        num_workers=cfg.workers,
        persistent_workers=cfg.workers > 0,
    )
    fn = _step_fn(job.step, cfg, job.model)
    built.put(os.getpid())
    ready.wait(120)
    # The clock starts before the loader's workers do: nobody prefetches before the start.
    return _timed_epochs(lambda e: loader, cfg.epochs, fn, progress)


def private_job(queue, cfg, job, root, built, ready, progress):
    _report(queue, _private_job, cfg, job, root, built, ready, progress)


def tandem_producer(queue, cfg: ShareBenchConfig, root: str, name: str, ready) -> None:
    from tandem.share import Producer

    torch.set_num_threads(1)
    mark = cpu_from(ready)
    p = Producer.from_dataset(
        ImageFolder(root, crop=cfg.crop),
        name,
        batch_size=cfg.batch_size,
        shuffle=True,
        num_workers=cfg.workers,
        window=8,
    )
    with p:  # consumers can attach now; loading starts with the clock, as for private jobs
        ready.wait(300)
        p.serve(epochs=cfg.epochs)
        queue.put(("producer", tree_cpu_s() - mark.get("cpu0", 0.0)))


def _tandem_job(cfg: ShareBenchConfig, job: JobSpec, name: str, built, ready, progress) -> JobResult:
    from tandem.share import Consumer

    torch.set_num_threads(1)
    fn = _step_fn(job.step, cfg, job.model)
    consumer = Consumer(name, batch_size=job.batch_size or cfg.batch_size, timeout=120)
    built.put(os.getpid())
    ready.wait(120)
    try:
        return _timed_epochs(lambda e: consumer, cfg.epochs, fn, progress)
    finally:
        consumer.close()


def tandem_job(queue, cfg, job, name, built, ready, progress):
    _report(queue, _tandem_job, cfg, job, name, built, ready, progress)


def tensorsocket_producer(
    queue, cfg: ShareBenchConfig, root: str, ports: tuple[int, int, int, int], built, ready
) -> None:
    from tensorsocket import TensorProducer

    torch.set_num_threads(1)
    mark = cpu_from(ready)
    loader = torch.utils.data.DataLoader(
        ImageFolder(root, crop=cfg.crop),
        batch_size=cfg.batch_size,
        shuffle=True,
        num_workers=cfg.workers,
    )
    # Its consumers handshake with a live producer, so it is built before the clock starts
    # (and may prefetch a few batches: to its advantage).
    producer = TensorProducer(
        loader, ports[0], ports[1], heart_ports=(ports[2], ports[3]), consumer_max_buffer_size=8
    )
    built.put("producer")
    ready.wait(300)
    for _ in range(cfg.epochs):
        for _ in producer:
            pass
    queue.put(("producer", tree_cpu_s() - mark.get("cpu0", 0.0)))
    producer.join()


def _tensorsocket_job(cfg: ShareBenchConfig, job: JobSpec, ports, built, ready, progress) -> JobResult:
    from tensorsocket import TensorConsumer

    torch.set_num_threads(1)
    fn = _step_fn(job.step, cfg, job.model)
    built.put(os.getpid())
    ready.wait(120)
    # A TensorSocket consumer's constructor blocks until the producer is iterating, so it is
    # built inside the clock.
    consumer: list = []

    def epoch(_e: int):
        if not consumer:
            consumer.append(
                TensorConsumer(
                    ports[0],
                    ports[1],
                    heart_ports=(ports[2], ports[3]),
                    batch_size=job.batch_size or cfg.batch_size,
                )
            )
        return consumer[0]

    return _timed_epochs(epoch, cfg.epochs, fn, progress)


def tensorsocket_job(queue, cfg, job, ports, built, ready, progress):
    _report(queue, _tensorsocket_job, cfg, job, ports, built, ready, progress)
