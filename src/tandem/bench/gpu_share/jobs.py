"""The GPU share benchmark's processes: the image folder, the models, each mode's training
job and producer."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tandem.bench.data import ImageFolder
from tandem.bench.gpu_share.accounting import _cores, private_workers
from tandem.bench.gpu_share.config import CTX, DTYPES, GpuShareConfig
from tandem.bench.harness import JobResult, tree_cpu_s, waited_batches
from tandem.bench.images import make_image_folder
from tandem.bench.models import MODELS


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
    return str(
        make_image_folder(
            root, images=images, classes=classes, min_side=min_side, max_side=max_side, seed=seed
        )
    )


def prepare_images(cfg: GpuShareConfig, procs: int | None = None) -> Path:
    """The JPEG folder for ``cfg`` (reused when already there), generated in parallel: one
    :func:`make_image_folder` part per process, hard-linked into one class-folder layout."""
    params = {
        "images": cfg.images,
        "classes": cfg.classes,
        "min_side": cfg.min_side,
        "max_side": cfg.max_side,
    }
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
    jobs = [
        (str(scratch / f"p{k:02d}"), n, cfg.classes, cfg.min_side, cfg.max_side, k)
        for k, n in enumerate(sizes)
    ]
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


def _sources(cfg: GpuShareConfig, mode: str, root: str, endpoint: Any, dev: torch.device, jobs: int):
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
            Indexed(ImageFolder(root, crop=cfg.crop)),
            batch_size=b,
            shuffle=True,
            num_workers=workers,
            pin_memory=dev.type == "cuda",
            persistent_workers=workers > 0,
        )
        return (lambda _e: loader), lambda: None
    if mode in ("host", "gpu"):
        from tandem.share import Consumer

        consumer = Consumer(
            endpoint,
            batch_size=b,
            device=cfg.device,
            timeout=cfg.start_timeout_s,
            data_timeout=cfg.data_timeout_s,
        )
        return (lambda _e: consumer), consumer.close
    if mode == "tensorsocket":
        made: list = []

        def epoch(_e: int):
            # Its constructor blocks until the producer iterates: built inside the clock.
            if not made:
                from tensorsocket import TensorConsumer

                made.append(
                    TensorConsumer(
                        endpoint[0], endpoint[1], heart_ports=(endpoint[2], endpoint[3]), batch_size=b
                    )
                )
            it = iter(made[0])
            return (next(it) for _ in range(len(made[0])))  # one epoch, whatever its StopIteration does

        return epoch, lambda: None
    raise ValueError(f"unknown mode {mode!r}")


def _train(
    cfg: GpuShareConfig, mode: str, root: str, endpoint: Any, jobs: int, built, ready, progress
) -> GpuJobResult:
    torch.set_num_threads(1)
    dev = torch.device(cfg.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    # (Module.to takes memory_format, which torch's overloads leave out)
    model = build_model(cfg.model, cfg.classes).to(dev, memory_format=torch.channels_last)  # type: ignore[call-overload]
    step = _train_step(model, dev)
    source, close = _sources(cfg, mode, root, endpoint, dev, jobs)
    built.put(os.getpid())
    if not ready.wait(cfg.start_timeout_s):
        raise TimeoutError(f"no common start within {cfg.start_timeout_s:g} s")
    try:
        return _timed(cfg, source, step, dev, progress)
    finally:
        close()


def _timed(cfg: GpuShareConfig, source, step, dev: torch.device, progress) -> GpuJobResult:
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
        raise ValueError(
            f"{planned} steps per job leave none between the {cfg.warmup} warm-up "
            f"and {cfg.cooldown} cool-down steps: more --images or --epochs"
        )
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
    queue, cfg: GpuShareConfig, mode: str, root: str, endpoint: Any, jobs: int, built, ready, finish, progress
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


def _serve(queue, cfg: GpuShareConfig, ready, finish, make: Callable[[], Any]) -> None:
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


def host_producer(queue, cfg: GpuShareConfig, root: str, name: str, ready, finish) -> None:
    from tandem.share import Producer

    _serve(
        queue,
        cfg,
        ready,
        finish,
        lambda: Producer.from_dataset(
            Indexed(ImageFolder(root, crop=cfg.crop)),
            name,
            batch_size=cfg.batch_size,
            shuffle=True,
            num_workers=cfg.producer_workers,
        ),
    )


def gpu_producer(queue, cfg: GpuShareConfig, root: str, name: str, ready, finish) -> None:
    from tandem.share import Producer

    samples = ImageFolder(root, crop=cfg.crop).samples
    files, labels = [str(p) for p, _ in samples], [int(c) for _, c in samples]
    _serve(
        queue,
        cfg,
        ready,
        finish,
        lambda: Producer.from_files(
            files,
            name,
            labels=labels,
            batch_size=cfg.batch_size,
            shuffle=True,
            device=cfg.device,
            crop=cfg.crop,
            dtype=DTYPES[cfg.dtype],
            num_workers=cfg.gpu_workers,
        ),
    )


def tensorsocket_producer(
    queue, cfg: GpuShareConfig, root: str, ports: tuple[int, ...], ready, finish
) -> None:
    torch.set_num_threads(1)
    try:
        from tensorsocket import TensorProducer

        from tandem.share import auto_workers

        workers = auto_workers() if cfg.producer_workers == "auto" else int(cfg.producer_workers)
        loader = torch.utils.data.DataLoader(
            Indexed(ImageFolder(root, crop=cfg.crop)),
            batch_size=cfg.batch_size,
            shuffle=True,
            num_workers=workers,
            pin_memory=cfg.device.startswith("cuda"),
        )
        producer = TensorProducer(
            loader, ports[0], ports[1], heart_ports=(ports[2], ports[3]), consumer_max_buffer_size=8
        )
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


PRODUCERS: dict[str, Callable[..., None]] = {
    "host": host_producer,
    "gpu": gpu_producer,
    "tensorsocket": tensorsocket_producer,
}
