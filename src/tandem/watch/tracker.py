"""A tracked run: samplers read on a fixed interval on one thread, points go to a recorder.

``Run`` is what both ``tandem run`` (tracking a command it started, :mod:`tandem.watch.runner`)
and ``track()`` (in a training script) use. The run's process-tree sampler says which
processes are the run; the other samplers (:class:`~tandem.watch.samplers.Sampler`) read
from it or from the host. The sampling thread reads every available sampler, adds the
throughput the script logged with ``log_step``, feeds the summary and hands the points to
a recorder (``tandem.watch._recording``), which writes them to the run's store
(:class:`~tandem.watch.stores.RunStore`) from a low-priority helper process, or a thread.
A sampler that raises is reported once and dropped; tracking never stops the run.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from tandem.watch._recording.helper import HelperRecorder
from tandem.watch._recording.recorder import Recorder
from tandem.watch._summary import SummaryBuilder, summary_table
from tandem.watch.checks import check_interval, check_tags, valid_key
from tandem.watch.point import Point
from tandem.watch.samplers import (
    CpuEnergySampler,
    HostSampler,
    NvmlSampler,
    ProcessTreeSampler,
    Sampler,
    ShareSampler,
)
from tandem.watch.stores import MlflowStore, RunStore
from tandem.watch.stores.base import run_env

HEARTBEAT_S = 30.0  # an unchanged metric is still stored this often


def default_samplers(tree: ProcessTreeSampler, env: Mapping[str, str] | None = None) -> list[Sampler]:
    """The samplers beside the run's process tree. They are sampled after it, and read its
    pids and CPU time from its last sample."""
    return [
        HostSampler(),
        CpuEnergySampler(lambda: tree.cpu_seconds),
        NvmlSampler(lambda: tree.pids, env=dict(env) if env is not None else None),
        ShareSampler(lambda: tree.pids),
    ]


class Run:
    """One tracked run of a process tree (``pid`` and its descendants; default: this process).

    ``cpu_since_start``: count the tree's CPU time from its processes' start (for a command
    just started) rather than from now (for this process, which has run a while).
    ``store`` is where the run is kept (default: MLflow at ``$MLFLOW_TRACKING_URI`` or
    ``./mlflow.db``); ``fallback_dir`` is where its metrics go if that store fails.
    ``samplers``: what is sampled beside the run's process tree (default:
    :func:`default_samplers`: host, CPU energy, GPUs, tandem share).
    ``writer``: ``"process"`` (the default) writes to the store from a low-priority helper
    process left out of the run, so MLflow's import and writes are neither charged to the
    run nor compete with it; ``"thread"`` writes from a thread of this process.
    """

    def __init__(
        self,
        pid: int | None = None,
        name: str | None = None,
        experiment: str = "tandem",
        tags: Mapping[str, Any] | None = None,
        interval: float = 1.0,
        store: RunStore | None = None,
        fallback_dir: str | Path = "tandem-runs",
        samplers: list[Sampler] | None = None,
        env: Mapping[str, str] | None = None,
        quiet: bool = False,
        flush_s: float = 5.0,
        cpu_since_start: bool = False,
        writer: str | None = None,
    ):
        self.pid = os.getpid() if pid is None else pid
        self.name = name or Path(sys.argv[0] or "run").stem or "run"
        self.interval = check_interval(interval)
        self.tags = {
            "tandem.host": socket.gethostname(),
            "tandem.pid": str(self.pid),
            "tandem.interval_s": f"{self.interval:g}",
            **check_tags(tags or {}),
        }
        self._store = store or MlflowStore(experiment=experiment)
        self._fallback_dir = Path(fallback_dir)
        self._samplers_given = samplers
        self._env = env
        self._since_start = cpu_since_start
        self._writer = writer or "process"
        if self._writer not in ("process", "thread"):
            raise ValueError(f"writer must be 'process' or 'thread', not {writer!r}")
        self.quiet = quiet
        self._flush_s = flush_s
        self.console = Console(stderr=True)
        self.samplers: list[Sampler] = []
        self.tree: ProcessTreeSampler | None = None  # the run's own sampler: which processes are the run
        self.recorder: Recorder | HelperRecorder | None = None
        self.summary: dict[str, float] | None = None
        self.unavailable: dict[str, str] = {}
        self._lock = threading.Lock()
        self._samples = 0
        self._steps = 0
        self._last_rate: tuple[float, int] | None = None
        self._tick_n = 0
        self._builder = SummaryBuilder()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sampler_cpu_s = 0.0
        self._t0 = 0.0
        self._broken: set[str] = set()
        self._logged: dict[str, tuple[float, float]] = {}  # key -> (value, time) last stored
        self._skipped: dict[str, Point] = {}  # key -> the newest point not stored (unchanged)
        self._bad_keys: set[str] = set()

    # --- life cycle ----------------------------------------------------------------------
    def open(self) -> Run:
        """Start the run's writer, which creates the run in its store, before :meth:`start`
        (which otherwise does it): ``tandem run`` needs the run's id before the command
        starts (:meth:`child_env`). The pid given or set by then is tagged at :meth:`start`."""
        if self.recorder is None:
            if self._writer == "process":
                self.recorder = HelperRecorder(
                    self._store, self.name, self.tags, self._fallback_dir, self._flush_s
                )
            else:
                self.recorder = Recorder(
                    self._store,
                    self.name,
                    self.tags,
                    fallback_dir=self._fallback_dir,
                    flush_s=self._flush_s,
                    warn=self._warn,
                )
        return self

    def child_env(self, timeout: float = 120.0) -> dict[str, str]:
        """What a process that should log into this run needs in its environment
        (``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``, ``MLFLOW_EXPERIMENT_NAME``: see
        :func:`~tandem.watch.stores.base.run_env`), once the run exists: this opens it
        (:meth:`open`) and waits up to ``timeout`` s for its store. Empty where the run is not
        an MLflow run (another store, MLflow failed and the run went to a file, or the store
        did not open in time): no id is given that does not exist."""
        store = self._store
        if not isinstance(store, MlflowStore):
            return {}
        self.open()
        assert self.recorder is not None
        if not self.recorder.wait_open(timeout) or self.recorder.fell_back or not self.recorder.run_id:
            return {}
        return run_env(store.uri, self.recorder.run_id, store.experiment)

    def start(self) -> Run:
        self._t0 = time.monotonic()
        self.tags["tandem.pid"] = str(self.pid)  # ``tandem run`` sets the command's pid after __init__
        opened_before = self.recorder is not None
        # Samplers first: a bad setting (TANDEM_WATTS_PER_CORE=abc) fails here, before any
        # thread or helper process exists. The writer helper's pid joins ``exclude`` below.
        exclude: set[int] = set()
        self.tree = ProcessTreeSampler(self.pid, since_start=self._since_start, exclude=exclude)
        others = (
            self._samplers_given
            if self._samplers_given is not None
            else default_samplers(self.tree, self._env)
        )
        self.samplers = []
        for s in [self.tree, *others]:  # the tree first: the others read its last sample
            ok, why = s.available()
            if ok:
                self.samplers.append(s)
                if why:
                    self.unavailable[s.name] = why  # a reduced mode, e.g. estimated energy
            else:
                self.unavailable[s.name] = why
                _close(s)
        self.open()
        assert self.recorder is not None
        if isinstance(self.recorder, HelperRecorder):
            exclude.add(self.recorder.pid)  # a child of this process, but not part of the run
        try:
            extra = {f"tandem.note.{k}": v for k, v in self.unavailable.items()}
            if opened_before:
                extra["tandem.pid"] = self.tags["tandem.pid"]  # opened with the pid known then
            for s in self.samplers:
                extra.update(s.tags())
            if extra:
                self.recorder.set_tags(extra)
            if not self.quiet:
                for k, why in self.unavailable.items():
                    self.console.print(f"[dim]tandem: {k}: {why}[/]", soft_wrap=True)
            if self.tree in self.samplers and not self._since_start:
                # The run's CPU counts from now, not from the sampling thread's first sample:
                # that can come tens of ms later (the thread waits for the GIL behind a busy
                # training loop), and the loop's CPU meanwhile belongs to the run.
                self.tree.sample()
            self._thread = threading.Thread(target=self._loop, name="tandem-sampler", daemon=True)
            self._thread.start()
        except BaseException:
            self.recorder.close("FAILED", timeout=30)
            self.summary = {}  # ended: a later stop() has nothing to do
            raise
        return self

    def stop(
        self,
        status: str = "FINISHED",
        tags: Mapping[str, Any] | None = None,
        final_cpu: tuple[float, float] | None = None,
    ) -> dict[str, float]:
        """Stop sampling, store the summary and end the run. ``final_cpu`` is the tree's
        exact (user, system) CPU time if known (``tandem run`` gets it from the kernel)."""
        if self._thread is None or self.recorder is None:
            if self.recorder is not None and self.summary is None:  # opened, never started
                self.summary = {}
                self.recorder.close(status, timeout=120)
            return {}  # never started: nothing else to stop
        if self.summary is not None:
            return self.summary  # already stopped
        self._stop.set()
        self._thread.join(self.interval + 30)
        duration = time.monotonic() - self._t0
        if self._thread.is_alive():
            # A sampler is stuck (an NVML call on a GPU that fell off the bus, say): do not
            # sample or close the samplers under it from this thread too.
            self._warn("the sampling thread did not stop in time; the last sample is skipped")
        else:
            if final_cpu is not None and self.tree is not None:
                self.tree.final_cpu = final_cpu
            self._tick(last=True)  # the end state, after the last interval; every metric
            for s in self.samplers:
                _close(s)
        with self._lock:
            samples = self._samples
        with self._builder.lock:  # a stuck sampling thread may come back and add to it
            self.summary = self._builder.result(duration, samples, self._sampler_cpu_s)
        ts = int(time.time() * 1000)
        self.recorder.log([Point(f"summary/{k}", v, ts, 0) for k, v in self.summary.items()])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "summary.json"
            path.write_text(json.dumps(self.summary, indent=2, sort_keys=True))
            self.recorder.log_artifact(path)
            if tags:
                self.recorder.set_tags(check_tags(tags))
            if not self.recorder.close(status, timeout=120):
                self._warn(f"the run may not be complete in {self.recorder.where}: its writer did not finish")
        if not self.quiet:
            self.console.print(summary_table(self.summary, f"tandem: {self.name} ({status.lower()})"))
            self.console.print(f"[dim]tandem: stored in {self.recorder.where}[/]", soft_wrap=True)
        return self.summary

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None or (issubclass(exc_type, SystemExit) and exc.code in (0, None)):
            status = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
        else:
            status = "FAILED"
        self.stop(status)

    # --- what the training script calls --------------------------------------------------
    def log_step(self, samples: int = 0, **metrics: float) -> None:
        """Count one training step of ``samples`` samples; extra metrics are logged at this step."""
        metrics = self._good(metrics)
        with self._lock:
            self._samples += int(samples)
            self._steps += 1
            step = self._steps
        if metrics and self.recorder is not None:
            ts = int(time.time() * 1000)
            self.recorder.log([Point(k, float(v), ts, step) for k, v in metrics.items()])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Log metrics at ``step`` (say, an evaluation), without counting a training step."""
        metrics = self._good(metrics)
        if self.recorder is not None:
            ts = int(time.time() * 1000)
            self.recorder.log([Point(k, float(v), ts, step) for k, v in metrics.items()])

    def _good(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """The metrics with valid names; a bad name is warned about once and dropped (a
        name first used at evaluation time must not end hours of training)."""
        good = {}
        for k, v in metrics.items():
            if valid_key(k):
                good[k] = v
            elif k not in self._bad_keys:
                self._bad_keys.add(k)
                self._warn(
                    f"metric name {k!r} is not valid (use letters, digits, '_', '-', '.', '/' or "
                    "spaces); it is not logged"
                )
        return good

    def log_artifact(self, path: str | Path) -> None:
        """Store a file with the run. It is copied when the writer gets to it (within
        seconds, and before the run ends): keep it in place until then."""
        if self.recorder is not None:
            self.recorder.log_artifact(Path(path).resolve())

    @property
    def run_id(self) -> str:
        """The store's id for this run (waits for the store to open, up to 60 s)."""
        if self.recorder is None:
            return ""
        self.recorder.wait_open(60)
        return self.recorder.run_id

    @property
    def where(self) -> str:
        return self.recorder.where if self.recorder is not None else ""

    # --- the sampling thread -------------------------------------------------------------
    def _loop(self) -> None:
        deadline = time.monotonic()
        while True:
            self._tick()
            self._sampler_cpu_s = time.thread_time()
            deadline += self.interval
            now = time.monotonic()
            if deadline < now:  # a slow sample: start again from now rather than burst
                deadline = now
            if self._stop.wait(deadline - now):
                return

    def _tick(self, last: bool = False) -> None:
        ts = int(time.time() * 1000)
        now = time.monotonic()
        metrics: dict[str, float] = {}
        for s in self.samplers:
            if s.name in self._broken:
                continue
            try:
                metrics.update(s.sample())
            except Exception as exc:  # one broken source must not end the tracking
                self._broken.add(s.name)
                self._warn(f"sampler {s.name} failed and is switched off: {type(exc).__name__}: {exc}")
        with self._lock:
            samples, steps = self._samples, self._steps
        if steps:
            metrics["train/samples"] = float(samples)
            if self._last_rate is not None and now > self._last_rate[0]:
                metrics["train/samples_per_s"] = (samples - self._last_rate[1]) / (now - self._last_rate[0])
            self._last_rate = (now, samples)
        self._builder.add(metrics)
        assert self.recorder is not None
        self.recorder.log(self._changed(metrics, now, ts, last))
        self._tick_n += 1

    def _changed(self, metrics: dict[str, float], now: float, ts: int, last: bool) -> list[Point]:
        """The points worth storing: values that changed, each metric at least every
        ``HEARTBEAT_S``, and all of them at the end. MLflow's SQL store costs about 0.4 ms
        of CPU per point, most of a 1%-of-a-core budget; unchanged values (process count,
        memory total, PSS between its reads) would be most of the points. When a value
        changes after a stretch of skipped ones, the last skipped point is stored too, so
        that a rate's change is placed at the right interval, not back at the stretch's start."""
        out = []
        for k, v in metrics.items():
            point = Point(k, v, ts, self._tick_n)
            prev = self._logged.get(k)
            if last or prev is None or prev[0] != v or now - prev[1] >= HEARTBEAT_S:
                skipped = self._skipped.pop(k, None)
                if skipped is not None and prev is not None and prev[0] != v:
                    out.append(skipped)
                out.append(point)
                self._logged[k] = (v, now)
            else:
                self._skipped[k] = point
        return out

    def _warn(self, msg: str) -> None:
        print(f"tandem: warning: {msg}", file=sys.stderr, flush=True)


def _close(sampler: Sampler) -> None:
    try:
        sampler.close()
    except Exception:
        pass  # freeing what a sampler holds must not fail the run


@contextmanager
def track(
    name: str | None = None,
    experiment: str = "tandem",
    tags: Mapping[str, Any] | None = None,
    interval: float = 1.0,
    pid: int | None = None,
    **kwargs: Any,
) -> Iterator[Run]:
    """Track this process (or ``pid``) and its descendants while the block runs.

    >>> with track(name="resnet-lr0.1", tags={"group": "sweep-1"}) as run:
    ...     for x, y in loader:
    ...         ...
    ...         run.log_step(samples=len(x), loss=loss.item())
    """
    with Run(pid=pid, name=name, experiment=experiment, tags=tags, interval=interval, **kwargs) as run:
        yield run
