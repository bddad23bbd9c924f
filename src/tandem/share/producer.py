"""The producer: loads each batch once and serves it to every attached consumer.

Two threads share one lock (every wait on it has a timeout, so signals and stops are seen):

* the main thread (:meth:`Producer.serve`, in the loop of :mod:`tandem.share._publishing`)
  iterates the source, writes each batch into a free slot of the slab (:mod:`tandem.share._slab`)
  and publishes it as an *entry* in the window (:mod:`tandem.share._window`, which also holds
  the pacing policy);
* the control thread (:mod:`tandem.share._control`) admits consumers and answers their
  requests from the window (see :mod:`tandem.share.protocol`).

Pacing (``policy``):

``"wait"`` (default)
    An entry's slot is reused once every attached consumer has taken and released it: the
    slowest consumer sets the pace, and nobody misses anything.
``"skip"``
    The producer keeps pace with the fastest consumer. When it needs a slot, it drops the
    oldest entry that no consumer is reading; consumers that had not taken it yet skip it
    and are told how many batches and samples they missed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.utils.data

from tandem._ipc import listen
from tandem.share import protocol
from tandem.share._control import ASIDE_AFTER_S, ControlServer, rate
from tandem.share._cuda import check_device
from tandem.share._cuda_slab import CudaSlab
from tandem.share._identity import item_digests
from tandem.share._order import fingerprint, planned_loader, selected, source_shape
from tandem.share._publishing import Publisher
from tandem.share._registry import Registration
from tandem.share._slab import HostSlab, Slab, window_budget
from tandem.share._window import AHEAD_SLOTS, MAX_SLOTS, MIN_SLOTS, PACING_POLICIES, Window
from tandem.share.errors import UnsupportedBatch

log = logging.getLogger("tandem.share")

# How long after its first consumer a producer keeps its stream's start for the others it
# expects (a sweep's jobs start within seconds; a slower one joins mid-epoch as before).
START_HOLD_S = 20.0

_RELEASE_GPU_MEMORY_S = 10.0  # at the end, how long consumers may keep reading a CUDA slab


def _aside_after_s(given: float | None) -> float | None:
    """The pause after which a consumer is set aside (None: never)."""
    if given is None:
        env = os.environ.get("TANDEM_SHARE_ASIDE_S")
        if env is None:
            return ASIDE_AFTER_S
        try:
            given = float(env)
        except ValueError:
            raise ValueError(f"TANDEM_SHARE_ASIDE_S must be a number of seconds, not {env!r}") from None
    if not given > 0:
        raise ValueError(f"aside_after_s must be a positive number of seconds, got {given!r}")
    return None if given == float("inf") else float(given)


class Producer:
    """Serve batches from ``source`` to every consumer that attaches to ``name``.

    ``source`` is any re-iterable of batches (a ``DataLoader`` or any iterable): each
    ``iter(source)`` is one epoch. Use :meth:`from_dataset` to let the producer own the
    sample order, which late joiners need to see every sample exactly once when shuffling.

    The window (the batches in flight) is bounded by memory: ``window_mem`` bytes (default:
    a tenth of the RAM available at start, or of the GPU's free memory for a GPU slab), at
    most ``window`` batches (default 64); ``window`` alone: exactly that many batches.
    Consumers drift apart within it; under ``"wait"`` a fast one waits only when it is full.

    ``aside_after_s`` (default 10 s, or ``$TANDEM_SHARE_ASIDE_S``; ``float("inf")``: never):
    a consumer that takes no batch for this long while it holds the others back (a stopped
    process, a debugger, a reader that keeps its batches) is set aside: the others go on at
    their own pace; when it is back it gets :class:`~tandem.share.errors.ReaderSetAside`,
    and its epoch continues exactly on a new consumer given its ``state_dict()`` (the
    drop-in ``DataLoader`` does that itself). It never gets a wrong batch: the slots it may
    still read are not reused.

    ``public`` (the host's system manager sets it for ``tandem share define --public``): the
    socket path where it listens for every user's jobs instead of this user's private runtime
    directory. Another user's consumer is a guest there: it reads over the socket only (no
    announcement table), from host memory only, through read-only descriptors, and may not
    ask for item digests or statistics; at most ``GUESTS`` of each other user at once.
    """

    def __init__(
        self,
        source: Iterable[Any],
        name: str,
        *,
        window: int | None = None,
        window_mem: int | None = None,
        policy: str = "wait",
        drain_timeout: float | None = None,
        device: str | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        transform_threads: int = 1,
        aside_after_s: float | None = None,
        public: str | None = None,
    ):
        if not isinstance(source, Iterable):
            raise TypeError(f"source must be a re-iterable of batches, got {type(source).__name__}")
        if isinstance(source, (str, bytes, Iterator)):
            raise TypeError(
                "source must be re-iterable (each iter() one epoch), not a one-shot iterator or "
                "generator; pass a DataLoader, a list, or an object whose __iter__ starts anew"
            )
        if policy not in PACING_POLICIES:
            raise ValueError(f"policy must be one of {PACING_POLICIES}, got {policy!r}")
        if window is not None and (type(window) is not int or window < MIN_SLOTS):
            raise ValueError(f"window must be an integer >= {MIN_SLOTS} (batches) or None, got {window!r}")
        if window_mem is not None and (type(window_mem) is not int or window_mem < 1):
            raise ValueError(f"window_mem must be a positive number of bytes or None, got {window_mem!r}")
        if batch_transform is not None and not callable(batch_transform):
            raise TypeError(f"batch_transform must be callable, got {type(batch_transform).__name__}")
        if type(transform_threads) is not int or transform_threads < 1:
            raise ValueError(f"transform_threads must be a positive integer, got {transform_threads!r}")
        slab_device = check_device(device) if device is not None else None
        self.name = name
        self.policy = policy
        self.drain_timeout = drain_timeout
        self._source = source
        # ``public``: the socket of a public share (the host's system manager's, in a folder
        # of this user's that every user may reach): other users' jobs read it there as guests.
        self._registration = Registration(name, public)
        self._cond = threading.Condition(threading.RLock())
        self.device = slab_device if slab_device is not None and slab_device.type == "cuda" else None
        # The window: batches up to ``window_mem`` bytes (default: a share of the memory free
        # now where the slab is), at most ``window`` of them; ``window`` alone: that many.
        cap = window if window is not None else MAX_SLOTS
        self.window_mem: int | None = None
        if window_mem is not None or window is None:
            self.window_mem = window_mem if window_mem is not None else window_budget(self.device)
        # Sized by memory, it is made only a few batches ahead of the fastest consumer (the
        # rest is room for the slower ones to drift behind); given in batches, that many.
        ahead = AHEAD_SLOTS if self.window_mem is not None else None
        self._window = Window(policy, cap if self.window_mem is None else MIN_SLOTS, cap, ahead)
        label = f"{name}:{os.getpid()}"
        self._slab: Slab = (
            CudaSlab(label, self.device)
            if self.device is not None
            else HostSlab(label, cap if self.window_mem is None else MIN_SLOTS)
        )
        self._server = ControlServer(name, self._window, self._slab, self._cond, self.stats, self.stop)
        self._server.aside_after_s = _aside_after_s(aside_after_s)
        self._server.public = public is not None
        self._publisher = Publisher(
            name,
            source,
            self._window,
            self._slab,
            self._server,
            self._cond,
            transform=batch_transform,
            transform_threads=transform_threads,
            device=self.device,
            window_mem=self.window_mem,
        )
        self._started = False
        self._closed = False
        self._window.batch_size, self._window.samples_per_epoch = source_shape(source)

    # ----------------------------------------------------------------------------- setup
    @classmethod
    def from_dataset(
        cls,
        dataset: torch.utils.data.Dataset,
        name: str,
        *,
        batch_size: int = 32,
        shuffle: bool = False,
        num_workers: int | str = 0,
        collate_fn: Any = None,
        seed: int = 0,
        prefetch_factor: int | None = None,
        worker_nice: int | None = 0,
        selection: Any = None,
        worker_init_fn: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> Producer:
        """A producer over a map-style dataset whose sample order it owns (see ``_order``),
        or over a torch ``IterableDataset`` (a webdataset pipeline, a Hugging Face
        ``IterableDataset``): one pass of it is an epoch, in its own order; its length is the
        one it states (``with_length(n)``), else counted at the end of the first pass. With
        loader workers, each worker must yield its own part (webdataset and Hugging Face
        split their shards across workers).

        ``selection``: serve only these items of the dataset, each once an epoch, with every
        guarantee above: a stored data selection (``tandem.select.load(ID)``, checked to be
        of this dataset), any sequence of item indices, or a function of the dataset that
        returns either.

        ``num_workers="auto"`` runs as many loader workers as the cores the jobs leave free
        (less one, at most 8). The workers run ``worker_nice`` levels below normal CPU
        priority (default 0: the same as the jobs they feed, which wait for them when they
        lose the cores; a higher value yields cores to the training processes). Where the
        kernel groups processes by session (autogroup), nice only orders processes within
        one session. ``worker_init_fn``: run in each loader worker as it starts (as a
        ``DataLoader`` runs it)."""
        if selection is not None:
            if isinstance(dataset, torch.utils.data.IterableDataset):
                raise TypeError(
                    "selection= needs a map-style dataset: an IterableDataset has no item indices"
                )
            dataset = selected(dataset, selection)
        on_gpu = kwargs.get("device") not in (None, "cpu")
        loader, planner = planned_loader(
            dataset,
            batch_size,
            shuffle,
            num_workers,
            collate_fn,
            seed,
            prefetch_factor,
            worker_nice,
            on_gpu,
            worker_init_fn,
        )
        producer = cls(loader, name, **kwargs)
        if planner is not None:
            producer._publisher.planner = planner
            producer._window.samples_per_epoch = planner.sampler.size
            producer._server.dataset_id = fingerprint(dataset)
            if selection is None:  # a reader's indices are the dataset's own
                producer._server.item_digests = functools.partial(item_digests, dataset)
        return producer

    @classmethod
    def from_files(
        cls,
        files: str | os.PathLike | Sequence[str | os.PathLike],
        name: str,
        *,
        labels: Sequence[int] | None = None,
        device: str = "cuda",
        batch_size: int = 128,
        shuffle: bool = True,
        seed: int = 0,
        crop: int = 224,
        dtype: torch.dtype = torch.float32,
        transform: Callable[..., torch.Tensor] | None = None,
        num_workers: int | str = 2,
        transform_threads: int = 2,
        **kwargs: Any,
    ) -> Producer:
        """A producer of image files that decodes and augments on the GPU, once for all jobs.

        ``files``: an image folder (``root/<class>/*.jpg``, labels from the class folders)
        or a list of files (with ``labels``). Loader workers only read each file's bytes;
        the producer decodes them on ``device`` in batches (nvJPEG through torchvision),
        applies ``transform`` there (default: random-resized-crop to ``crop``, flip,
        normalise, as ``dtype``, random per sample and reproducible from ``seed``), and
        publishes ``{"image", "label", "index"}`` batches into a slab on that GPU. Decoding
        and augmenting run on ``transform_threads`` threads of the producer, a batch each,
        published in order. With ``device="cpu"`` the same runs on the CPU (PIL), into host
        memory."""
        from tandem.share.images import (
            EncodedImages,
            ImagePipeline,
            RandomResizedCropFlipNormalize,
            collate_encoded,
        )

        dev = check_device(device)
        if isinstance(files, (str, os.PathLike)):
            if labels is not None:
                raise ValueError("labels come from the class folders when files is a folder; pass no labels")
            dataset = EncodedImages.from_folder(files)
        else:
            dataset = EncodedImages(list(files), labels)
        if transform is None:
            transform = RandomResizedCropFlipNormalize(size=crop, dtype=dtype, seed=seed)
        return cls.from_dataset(
            dataset,
            name,
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=num_workers,
            collate_fn=collate_encoded,
            seed=seed,
            batch_transform=ImagePipeline(dev, transform),
            transform_threads=transform_threads,
            device=str(dev) if dev.type == "cuda" else None,
            **kwargs,
        )

    def start(self) -> Producer:
        """Claim the name and start accepting consumers (``serve`` calls this if needed)."""
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("this producer was closed; create a new one")
        self._registration.acquire()
        try:
            listener = listen(self._registration.socket_path)
            if self._server.public:  # any user may connect; each is admitted as _control says
                os.chmod(self._registration.socket_path, 0o666)
            self._server.start(listener)
        except BaseException:
            self._registration.release()
            raise
        self._started = True
        log.info("producer %r serving on %s", self.name, self._registration.socket_path)
        return self

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stop(self, reason: str = "stopped") -> None:
        """Ask ``serve`` to stop after the current batch; safe from any thread or handler."""
        self._publisher.stop(reason)

    def close(self) -> None:
        """Tell consumers, stop the control thread, free the slab and the name."""
        if self._started:
            with self._cond:
                self._publisher.publish_end(self._publisher.stop_reason or "producer closed", finished=False)
                self._server.push_final()
            if self.device is not None:
                self._server.await_released(_RELEASE_GPU_MEMORY_S)
            self._server.stop()
            self._registration.release()
            shutdown = getattr(getattr(self._source, "_iterator", None), "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            self._started = False
        self._free()

    def _free(self) -> None:
        if not self._closed:
            self._closed = True
            self._server.close()
            self._slab.close()

    def __del__(self) -> None:
        try:
            if not self._started:
                self._free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ----------------------------------------------------------------------------- serving
    def expect_consumers(self, consumers: int, within_s: float = START_HOLD_S) -> None:
        """Before :meth:`serve`: ``consumers`` will attach soon (a sweep's jobs, as the job
        manager knows them): the first epoch's start is kept until they have, or
        ``within_s`` after the first did, so that each starts there rather than mid-epoch,
        which the producer would serve again for it."""
        self._server.expect(consumers, within_s)

    def serve(self, epochs: int | None = None) -> None:
        """Serve until stopped, or until ``epochs`` epochs (plus late joiners' wrap) are done.

        Raises the source's exception (or :class:`UnsupportedBatch`) after telling the
        consumers. SIGINT/SIGTERM stop it cleanly when called from the main thread.
        """
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ValueError(f"epochs must be a positive integer or None, got {epochs!r}")
        owns = not self._started
        if epochs is not None:
            self._window.full_epochs = epochs
        self.start()
        restore = self._install_signal_handlers()
        failure: BaseException | None = None
        try:
            # The slab's GPU as this thread's current device: the loader's pin-memory thread
            # and the transform threads take theirs from it, and a context made on another
            # GPU (device 0) would cost memory on a GPU that other jobs use.
            with torch.cuda.device(self.device) if self.device is not None else contextlib.nullcontext():
                self._publisher.run(epochs)
        except BaseException as exc:
            failure = exc
            where = "" if isinstance(exc, UnsupportedBatch) else f"{type(exc).__name__}: "
            with self._cond:
                self._publisher.publish_failed(f"producer {self.name!r} failed: {where}{exc}")
        try:
            stopped = self._publisher.stop_reason is not None or failure is not None
            self._server.drain(10.0 if stopped else self.drain_timeout)
        finally:
            restore()  # only now: a signal while draining still stops cleanly
            if owns:
                self.close()
        if failure is not None:
            raise failure

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handler(signum: int, _frame: object) -> None:
            if self._publisher.stop_reason is not None:  # a second signal: stop hard
                raise KeyboardInterrupt
            self.stop(f"stopped by {signal.Signals(signum).name}")

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    # ----------------------------------------------------------------------------- stats
    @property
    def epochs_served(self) -> int:
        """Whole epochs served so far."""
        return self._publisher.epochs_served

    @property
    def blocked_s(self) -> float:
        """Seconds the producer waited for consumers to free a slot."""
        return self._publisher.blocked_s

    def stats(self) -> protocol.StatsReply:
        now = time.monotonic()
        with self._cond:
            drift = self._window.drift([c.link for c in self._server.consumers.values()])
            return protocol.StatsReply(
                name=self.name,
                pid=os.getpid(),
                policy=self.policy,
                window=self._window.size,
                epoch=self._window.epoch,
                published=self._publisher.published_batches,
                batches_per_s=rate(self._publisher.progress),
                blocked_s=self._publisher.blocked_s,
                slab_bytes=self._slab.nbytes,
                consumers=self._server.consumer_stats(now),
                window_mem=self.window_mem,
                window_used=sum(1 for e in self._window.entries.values() if e.slot is not None),
                drift=drift,
                drift_bytes=drift * self._slab.slot_bytes,
            )
