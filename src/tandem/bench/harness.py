"""The benchmark harness both share benchmarks run on: the share benchmark
(:mod:`tandem.bench.share_bench`, CPU) and the GPU share benchmark
(:mod:`tandem.bench.gpu_share`).

A run is a set of spawned processes (an optional producer and N training jobs) that go
through the same steps, here once:

1. each job builds its model and loader (or attaches its consumer) and puts its pid on the
   *built* queue;
2. the runner waits until every job is built (:meth:`JobProcesses.wait_built`), then sets
   the *ready* event: the common start, from which every job times itself;
3. each job reports its :class:`JobResult` on the *results* queue (a producer may report
   there too); the runner gathers them to a deadline (:meth:`JobProcesses.gather`);
4. the runner reaps every process and what is left of its tree (loader workers too).

Also here: what a job measures of itself (:func:`tree_cpu_s`, :func:`waited_batches`) and
a ticker for samplers that run beside the jobs (:class:`Every`).
"""

from __future__ import annotations

import queue as queue_mod
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; annotations only, so 3.10 runs it too


@dataclass
class JobResult:
    """What one training job measured of itself."""

    job: int  # its pid
    label: str = ""
    samples: int = 0
    wall_s: float = 0.0
    stall_s: float = 0.0  # time blocked waiting for a batch
    samples_per_s: float = 0.0
    cpu_s: float = 0.0  # the job's process tree, from the common start to its end
    start: float = 0.0  # time.monotonic(), shared by all processes on the host
    end: float = 0.0
    partial: bool = False  # killed before it finished: figures up to the kill
    error: str | None = None


# --- in a job ---------------------------------------------------------------------------------


def tree_cpu_s() -> float:
    """CPU-seconds (user + system) of this process and its live descendants."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def waited_batches(batches: Iterable[Any]) -> Iterator[tuple[Any, float]]:
    """Each batch with the seconds that fetching it took (the training loop's wait for data)."""
    it = iter(batches)
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        yield batch, time.perf_counter() - t0


def cpu_from(event: Any, timeout: float = 300.0) -> dict[str, float]:
    """CPU of this process tree from when ``event`` is set (``["cpu0"]``, filled in by a
    helper thread): a producer's CPU over the timed run, not its start-up."""
    mark: dict[str, float] = {}

    def wait() -> None:
        event.wait(timeout)
        mark["cpu0"] = tree_cpu_s()

    threading.Thread(target=wait, daemon=True).start()
    return mark


# --- in the runner ----------------------------------------------------------------------------


class JobProcesses:
    """The processes of one run and the queues and event they share (see the module's
    steps). ``launch(target, *args)`` starts a process (default: ``ctx.Process``)."""

    def __init__(self, ctx: Any, launch: Callable[..., Any] | None = None) -> None:
        self.results = ctx.Queue()
        self.built = ctx.Queue()
        self.ready = ctx.Event()
        self.procs: list[Any] = []
        self._ctx = ctx
        self._launch = launch

    def start(self, target: Callable[..., None], *args: Any) -> Any:
        if self._launch is not None:
            proc = self._launch(target, *args)
        else:
            proc = self._ctx.Process(target=target, args=args)
            proc.start()
        self.procs.append(proc)
        return proc

    def alive(self) -> bool:
        return any(p.is_alive() for p in self.procs)

    def next(self, q: Any, timeout: float) -> Any:
        """The next item of ``q`` within ``timeout`` s (0: only one already there), or None;
        None also as soon as ``q`` is empty and none of the run's processes is alive."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return q.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue_mod.Empty:
                if time.monotonic() >= deadline or not self.alive():
                    return None

    def wait_built(
        self,
        count: int,
        timeout: float,
        on_result: Callable[[Any], None],
        until: Callable[[], bool] = lambda: True,
        stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """Wait until ``count`` jobs said they are built and ``until()`` holds; what comes
        on the results queue meanwhile goes to ``on_result`` (a job that failed on its
        way, a producer that serves). Ends early when ``stop()`` or when every process is
        gone. Returns how many jobs are still not built."""
        deadline = time.monotonic() + timeout
        while (count or not until()) and not stop() and time.monotonic() < deadline:
            while (item := self.next(self.results, 0.0)) is not None:
                on_result(item)
            if count and self.next(self.built, 0.2) is not None:
                count -= 1
            elif not count:
                time.sleep(0.05)
            if not self.alive():
                break
        return count

    def gather(self, timeout: float, on_result: Callable[[Any], None], done: Callable[[], bool]) -> bool:
        """Pass results to ``on_result`` until ``done()``, ``timeout`` s or every process is
        gone; whether ``done()`` came."""
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            item = self.next(self.results, deadline - time.monotonic())
            if item is None:
                break
            on_result(item)
        return done()

    def reap(self, grace_s: float) -> None:
        reap(self.procs, grace_s)
        self.procs = []

    def close(self) -> None:
        """Reap what is left (at once) and close the queues without waiting on them."""
        self.reap(0.5)
        for q in (self.results, self.built):
            q.close()
            q.cancel_join_thread()


def reap(procs: list[Any], grace_s: float) -> None:
    """Join ``procs``; kill whatever is left of their trees (loader workers too)."""
    tree = []
    for p in procs:
        try:
            tree += psutil.Process(p.pid).children(recursive=True)
        except (psutil.NoSuchProcess, ValueError):  # ValueError: never started (pid None)
            pass
    for p in procs:
        p.join(grace_s)
        if p.is_alive():
            p.kill()
            p.join(5)
    for child in tree:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=5)


class Every:
    """Calls ``tick()`` from a thread every ``interval`` s while in its ``with`` block, and
    once more at the block's end."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.tick()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.tick()


def free_ports(n: int) -> tuple[int, ...]:
    """``n`` TCP ports on localhost that are free now (for TensorSocket's producer)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = tuple(s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    return ports


def tensorsocket_available() -> bool:
    try:
        import tensorsocket  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True
