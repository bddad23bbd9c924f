"""The job manager's daemon: takes submissions, places jobs, supervises them, keeps state.

One daemon per state directory (a file lock says which). Each tick (0.5 s, or at once
when a request or a job's result arrives) it:

1. answers requests on its socket (:mod:`tandem.place.protocol`);
2. measures the host and GPUs (:class:`tandem.place.devices.Monitor`, each second) and
   each running job's process tree (the shim's ``usage.json``);
3. collects endings (the shim's ``result.json``), classifies them, and requeues an
   out-of-memory ending with an escalated placement while retries remain;
4. plans (:func:`tandem.place.scheduler.plan`, the policy's choices) and starts the jobs
   it placed, each under its own shim (:mod:`tandem.place.shim`).

Jobs do not depend on the daemon: each runs under a shim in its own session, and a
restarted daemon re-adopts the attempts it finds running (shim pid plus start time, so a
reused pid is never mistaken for one) and goes on with the queue. An attempt is recorded
before its shim starts, and the shim leaves ``shim.json`` before anything else, so an
attempt is never started twice.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from filelock import FileLock, Timeout

from tandem import _ipc
from tandem.place import protocol
from tandem.place.devices import Monitor, Nvml
from tandem.place.model import (
    CANCELLED,
    FAILED,
    FINAL_STATES,
    QUEUED,
    RETRYING,
    RUNNING,
    SUCCEEDED,
    WAITING_STATES,
    Capacity,
    GpuInfo,
    format_size,
)
from tandem.place.policies import GpuSlot, HostSlot, Limits, Policy
from tandem.place.scheduler import Placement, Waiting, fits_at_all, plan
from tandem.place.shim import create_time, host_id, read_json, same_process, write_json
from tandem.place.state import Attempt, Job, State

log = logging.getLogger(__name__)

TICK_S = 0.5
SAMPLE_S = 1.0
LOST_AFTER_S = 10.0  # an attempt whose shim never showed itself within this is abandoned


def _runs_in(attempt_dir: Path) -> bool:
    """Is a shim for ``attempt_dir`` running (found by its command line)?"""
    target = str(attempt_dir)
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if "tandem.place.shim" in cmdline and target in cmdline:
            return True
    return False


def slab_on_gpu(serve_args: list[str]) -> bool:
    """Whether ``tandem share serve`` with these arguments keeps its batches on a GPU."""
    if "--device" in serve_args:
        i = serve_args.index("--device")
        return i + 1 < len(serve_args) and serve_args[i + 1].startswith("cuda")
    return "--images" in serve_args  # decoded on a GPU where there is one


class DaemonRunning(Exception):
    """Another daemon holds this state directory."""


@dataclass
class Active:
    """A running attempt as the daemon follows it."""

    job: Job
    n: int
    placement: Placement
    uuids: tuple[str, ...]
    dir: Path
    started: float  # wall clock
    shim_pid: int | None = None
    shim_ctime: float | None = None
    gpu_mem_reserved: int | None = None  # per GPU; None while a probe has not settled
    pids: tuple[int, ...] = ()
    mem: int = 0
    peak_mem: int = 0
    peak_gpu_mem: int = 0
    last_growth: float = field(default_factory=time.time)
    usage_t: float = 0.0
    energy_start: dict[str, int] = field(default_factory=dict)
    remote: bool = False  # its supervisor runs on another machine (a Ray node): no pid checks

    def settled(self, now: float, settle_s: float) -> bool:
        return now - self.started >= settle_s and now - self.last_growth >= settle_s


@dataclass
class Settings:
    policy: Policy
    limits: Limits
    grace_s: float = 10.0
    interval_s: float = 1.0
    mps: bool = False
    track: bool = True
    store: str | None = None  # MLflow tracking URI (default: tracking.default_store)
    backend: str = "local"  # or "ray": attempts become Ray tasks (tandem.place.ray_backend)
    address: str | None = None  # the Ray cluster's address (None: start a local instance)


class Daemon:
    def __init__(
        self, state: State, capacity: Capacity, settings: Settings, nvml: Nvml | None = None
    ) -> None:
        self.state = state
        self.capacity = capacity
        self.settings = settings
        self.limits = settings.limits
        self.policy = settings.policy
        self.nvml = nvml
        self.ray = None
        if settings.backend == "ray":
            from tandem.place.ray_backend import RayBackend

            self.ray = RayBackend(
                settings.address, capacity.gpus, capacity.cpus if not settings.address else None
            )
            cpus, mem, gpus = self.ray.cluster()
            self.capacity = capacity = Capacity(cpus, mem, gpus)
            nvml = None  # GPUs are Ray's now: measured only where the daemon runs NVML (not yet)
        self.monitor = Monitor(capacity, settings.limits.window_s, nvml)
        self.active: dict[int, Active] = {}
        self.socket_path = protocol.socket_path(state.dir)
        self.lock = FileLock(str(state.dir / "daemon.lock"))
        self.started = time.time()
        self.host = host_id()
        self._stop = False
        self._wake = False
        self._next_sample = 0.0
        self._producers: dict[str, subprocess.Popen] = {}  # started by this daemon (to reap)
        self._producer_gpus: dict[str, int] = {}  # share -> the GPU its producer keeps batches on
        self._stopping: dict[str, tuple[int, float, float]] = {}  # name -> pid, ctime, SIGKILL deadline
        self._reasons: dict[int, str] = {}  # why each waiting job waits, as last written
        self.tracker = None
        if settings.track:
            from tandem.place.tracking import Tracker, default_store

            self.tracker = Tracker(state.dir, settings.store or default_store(state.dir))
            if self.tracker.why_not:
                log.warning("jobs are not tracked in MLflow: %s", self.tracker.why_not)
        self.mps = None
        if settings.mps:
            from tandem.place.mps import MpsManager

            self.mps = MpsManager(_ipc.runtime_dir())

    # --- life cycle -----------------------------------------------------------------------

    def serve(self) -> None:
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            raise DaemonRunning(f"a daemon already serves {self.state.dir}") from None
        try:
            listener = self._listen()
            write_json(self.state.dir / "daemon.json", {"pid": os.getpid(), "started": self.started})
            self._install_signals()
            self.adopt()
            sel = selectors.DefaultSelector()
            sel.register(listener, selectors.EVENT_READ)
            log.info("serving %s with policy %s", self.state.dir, self.policy.name)
            while not self._stop:
                for _key, _ in sel.select(timeout=0 if self._wake else TICK_S):
                    self._accept(listener)
                self._wake = False
                try:
                    self.tick()
                except Exception:  # one bad tick (a full disk, a vanished file) must not end the daemon
                    log.exception("tick failed; going on")
                    time.sleep(TICK_S)
                listener = self._check_socket(sel, listener)
            sel.close()
            listener.close()
        finally:
            self.socket_path.unlink(missing_ok=True)
            if (
                self.mps is not None
            ):  # servers with clients stay: their jobs go on, the next daemon adopts them
                self.mps.release_idle({u for a in self.active.values() for u in a.uuids})
            if self.nvml is not None:
                self.nvml.close()
            if self.ray is not None:
                self.ray.shutdown()
            self.lock.release()

    def _listen(self) -> Any:
        self.socket_path = protocol.socket_path(self.state.dir)
        self.socket_path.unlink(missing_ok=True)  # a dead daemon's; the lock says it is dead
        listener = _ipc.listen(self.socket_path)
        self._socket_ino = os.stat(self.socket_path).st_ino
        return listener

    def _check_socket(self, sel: selectors.BaseSelector, listener: Any) -> Any:
        """Listen again if our socket file was removed or replaced (logind removes the
        runtime directory at the user's last logout): otherwise no client could reach us."""
        try:
            if os.stat(self.socket_path).st_ino == self._socket_ino:
                return listener
        except OSError:
            pass
        sel.unregister(listener)
        listener.close()
        listener = self._listen()
        sel.register(listener, selectors.EVENT_READ)
        log.warning("socket %s had gone; listening again", self.socket_path)
        return listener

    def _install_signals(self) -> None:
        def stop(_signum: int, _frame: Any) -> None:
            self._stop = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    # --- requests -------------------------------------------------------------------------

    def _accept(self, listener: Any) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return
            with conn:
                conn.setblocking(True)
                try:
                    data, fds = _ipc.recv_packet(conn, timeout=2.0)
                    _ipc.close_fds(fds)
                    request = protocol.decode(data)
                except (EOFError, TimeoutError, ValueError, OSError):
                    continue
                op = request.get("op")
                if op == "wake":
                    self._wake = True
                    continue
                try:
                    reply = self.handle(request)
                except Exception as exc:  # a bad request must not take the daemon down
                    log.exception("request %r failed", op)
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                try:
                    _ipc.send_packet(conn, protocol.encode(reply), timeout=2.0)
                except (OSError, TimeoutError, ValueError):
                    pass

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "submit":
            return self.submit(request["job"])
        if op == "cancel":
            return self.cancel([int(i) for i in request.get("ids", [])])
        if op == "status":
            return self.status()
        if op == "stop":
            self._stop = True
            return {"ok": True}
        return {"ok": False, "error": f"unknown request {op!r}; this daemon knows {', '.join(protocol.OPS)}"}

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        gpus = spec.get("gpus")
        if gpus is None:  # a GPU job where there are GPUs, a CPU job where there are none
            gpus = 1 if self.capacity.gpus else 0
        cpus, mem = float(spec["cpus"]), int(spec["mem"])
        share = self.state.share(spec["share"]) if spec.get("share") else None
        if spec.get("share") and share is None:
            return {
                "ok": False,
                "refused": True,
                "error": f"refused: --share {spec['share']}: no such shared dataset; define it first: "
                f"tandem share define {spec['share']} --dataset MODULE:FUNCTION",
            }
        if share is not None:
            cpus, mem = cpus + share.cpus, mem + share.mem
        waiting = Waiting(
            0, 0, 0.0, cpus, mem, int(gpus), spec.get("gpu_mem"), with_producer=share is not None
        )
        why = fits_at_all(waiting, self._host_slot(), self._gpu_slots(), self.limits)
        if why:
            fix = "ask for less, or start the daemon with more"
            if share is not None:
                fix = (
                    f"its share's producer reserves {share.cpus:g} cores, {format_size(share.mem or None)} "
                    f"RAM: ask for less, redefine the share with less (tandem share define {share.name} "
                    "... --cpus N), or start the daemon with more"
                )
            return {"ok": False, "refused": True, "error": f"refused: the job {why}; {fix}"}
        for dep in spec.get("after", []):
            if self.state.job(int(dep), attempts=False) is None:
                return {"ok": False, "error": f"refused: --after {dep}: no such job"}
        job_id = self.state.add_job(
            name=spec.get("name"),
            job_key=spec["job_key"],
            command=spec["command"],
            cwd=spec["cwd"],
            env=spec["env"],
            cpus=float(spec["cpus"]),
            mem=int(spec["mem"]),
            gpus=int(gpus),
            gpu_mem=spec.get("gpu_mem"),
            gpu_share=spec.get("gpu_share"),
            priority=int(spec.get("priority", 0)),
            retries=int(spec.get("retries", 2)),
            share=spec.get("share"),
            grp=spec.get("group"),
            after=[int(a) for a in spec.get("after", [])],
            state=QUEUED,
            submitted=(now := time.time()),
            queued_at=now,
        )
        self._wake = True
        return {"ok": True, "id": job_id}

    def cancel(self, ids: list[int]) -> dict[str, Any]:
        cancelled, unknown, ended = [], [], []
        for job_id in ids:
            job = self.state.job(job_id, attempts=False)
            if job is None:
                unknown.append(job_id)
            elif job.state in FINAL_STATES:
                ended.append(job_id)
            elif job_id in self.active:
                self.state.update_job(job_id, cancel_requested=1)
                a = self.active[job_id]
                if a.shim_pid is None and self.ray is not None:
                    self.ray.cancel(job_id, a.n)  # still queued in Ray (or starting): the task is dropped
                self._signal_shim(a, signal.SIGTERM)
                cancelled.append(job_id)
            else:
                self.state.update_job(
                    job_id, state=CANCELLED, cause="cancelled", ended=time.time(), cancel_requested=1
                )
                self.state.event(job_id, "cancelled", "while waiting")
                cancelled.append(job_id)
        return {"ok": True, "cancelled": cancelled, "unknown": unknown, "ended": ended}

    def status(self) -> dict[str, Any]:
        host = self._host_slot()
        counts: dict[str, int] = {}
        for row in self.state.query("SELECT state, count(*) FROM jobs GROUP BY state"):
            counts[row[0]] = row[1]
        return {
            "ok": True,
            "pid": os.getpid(),
            "policy": self.policy.name,
            "state_dir": str(self.state.dir),
            "started": self.started,
            "limits": self.limits.__dict__,
            "mps": self.settings.mps,
            "backend": self.settings.backend,
            "tracking": None if self.tracker is None else (self.tracker.why_not or self.tracker.uri),
            "capacity": {
                "cpus": self.capacity.cpus,
                "mem_bytes": self.capacity.mem,
                "gpus": [
                    {"index": g.index, "uuid": g.uuid, "mem_bytes": g.mem_total} for g in self.capacity.gpus
                ],
            },
            "used": {
                "cpus": host.cpus_reserved,
                "mem_bytes": host.mem_reserved,
                "cpu_busy_mean": host.cpu_mean,
                "mem_available_bytes": host.mem_available,
                "jobs": len(self.active),
                "gpus": [
                    {
                        "index": g.index,
                        "jobs": g.jobs,
                        "mem_reserved_bytes": g.mem_reserved,
                        "mem_used_bytes": g.mem_used,
                        "activity_mean": g.activity_mean,
                        "probing": g.probing,
                    }
                    for g in self._gpu_slots()
                ],
            },
            "jobs": counts,
        }

    # --- the tick ---------------------------------------------------------------------------

    def tick(self) -> None:
        now = time.time()
        if time.monotonic() >= self._next_sample:
            self._next_sample = time.monotonic() + SAMPLE_S
            self.monitor.sample()
        for active in list(self.active.values()):
            self._follow(active, now)
        self._reap_children()
        if self.mps is not None:
            self.mps.release_idle({u for a in self.active.values() for u in a.uuids})
        # The waiting jobs and their dependencies' states, read once for the whole tick.
        waiting = self.state.jobs(tuple(WAITING_STATES))
        deps = self._dependency_states(waiting)
        waiting = self._resolve_dependencies(waiting, deps)
        self._schedule(now, waiting, deps)
        self._stop_idle_producers(now, waiting)
        if self.tracker is not None:
            self.tracker.poke()
            for done in self.tracker.results():
                if done.get("run_id"):
                    self.state.update_attempt(done["job_id"], done["attempt"], mlflow_run_id=done["run_id"])
                    self.state.update_job(done["job_id"], mlflow_run_id=done["run_id"])
                else:
                    self.state.event(
                        done["job_id"], "tracking", f"not recorded in MLflow: {done.get('error')}"
                    )

    def _follow(self, a: Active, now: float) -> None:
        if a.shim_pid is None:
            shim = read_json(a.dir / "shim.json")
            if shim is not None:
                a.shim_pid, a.shim_ctime = shim["pid"], shim["ctime"]
                a.remote = shim.get("host", self.host) != self.host
                self.state.update_attempt(a.job.id, a.n, shim_pid=a.shim_pid, shim_ctime=a.shim_ctime)
                if self._cancel_requested(a.job.id):  # cancelled before we knew whom to tell
                    self._signal_shim(a, signal.SIGTERM)
        usage = read_json(a.dir / "usage.json")
        if usage is not None and usage["t"] != a.usage_t:
            a.usage_t = usage["t"]
            a.pids = tuple(usage["pids"])
            grown = usage["mem"] > a.peak_mem * 1.02 + (1 << 20)
            a.mem = usage["mem"]
            a.peak_mem = max(a.peak_mem, usage["peak_mem"])
            gpu_mem = max((self.monitor.job_gpu_mem(u, a.pids) for u in a.uuids), default=0)
            if gpu_mem > a.peak_gpu_mem * 1.02 + (1 << 20):
                grown = True
            a.peak_gpu_mem = max(a.peak_gpu_mem, gpu_mem)
            if grown:
                a.last_growth = now
        # A probe has settled once its GPU memory stopped growing; one that has not touched
        # the GPU yet (still loading data, say) is not settled at 0 unless that goes on long.
        long_s = max(300.0, 10 * self.limits.settle_s)
        if (
            a.gpu_mem_reserved is None
            and a.placement.gpus
            and a.settled(now, self.limits.settle_s)
            and (a.peak_gpu_mem > 0 or now - a.started > long_s)
        ):
            a.gpu_mem_reserved = int(a.peak_gpu_mem * (1 + self.limits.gpu_mem_margin))
            placement = {**self._placement_json(a), "gpu_mem": a.gpu_mem_reserved, "settled": True}
            self.state.update_attempt(a.job.id, a.n, placement=placement, peak_gpu_mem=a.peak_gpu_mem)
            self.state.event(a.job.id, "settled", f"GPU memory {format_size(a.peak_gpu_mem)}")
        result = read_json(a.dir / "result.json")
        if result is not None:
            self._finish(a, result)
        elif a.shim_pid is not None and not self._alive(a):
            result = read_json(a.dir / "result.json")  # it may have written it just before exiting
            if result is None:
                self._stop_orphan(a)
                result = {
                    "kind": "lost",
                    "state": FAILED,
                    "exit_code": None,
                    "signal": None,
                    "cause": "lost: the job's supervisor died without a result",
                    "line": None,
                    "ended": now,
                }
                if a.job.cancel_requested or self._cancel_requested(a.job.id):
                    result.update(kind="cancelled", state=CANCELLED, cause="cancelled")
            self._finish(a, result)
        elif (
            a.shim_pid is None
            and now - a.started > LOST_AFTER_S
            and not (self.ray is not None and self.ray.pending(a.job.id, a.n))
            and not _runs_in(a.dir)
        ):
            # The daemon died between recording the attempt and starting its shim: the
            # attempt never ran, so the job goes back to the queue (no attempt runs twice).
            del self.active[a.job.id]
            self.state.update_attempt(a.job.id, a.n, state="lost", ended=now, cause="never started")
            if self._cancel_requested(a.job.id):
                self.state.update_job(a.job.id, state=CANCELLED, cause="cancelled", ended=now)
                self.state.event(a.job.id, "cancelled", "before its attempt started")
            else:
                self.state.update_job(a.job.id, state=RETRYING if a.n > 1 else QUEUED, queued_at=now)
                self.state.event(a.job.id, "requeued", f"attempt {a.n} never started")

    def _placement_json(self, a: Active) -> dict[str, Any]:
        rows = self.state.query("SELECT placement FROM attempts WHERE job_id = ? AND n = ?", (a.job.id, a.n))
        return json.loads(rows[0][0]) if rows else {}

    def _alive(self, a: Active) -> bool:
        """Is the attempt's supervisor alive? On this machine: its pid and start time. On
        another (a Ray node): its task has not returned (after a restart, when the task is
        gone with the old daemon, only its result file can tell)."""
        if not a.remote:
            return same_process(a.shim_pid, a.shim_ctime)
        if self.ray is not None and (a.job.id, a.n) in self.ray.refs:
            return self.ray.pending(a.job.id, a.n)
        return True

    def _stop_orphan(self, a: Active) -> None:
        """The shim died without a result (killed): stop the job it supervised, so that it
        does not run on unaccounted for, holding memory the scheduler has given away."""
        started = read_json(a.dir / "started.json")
        if started and same_process(started["pid"], started["ctime"]):
            from tandem.place.shim import stop_tree

            stop_tree(started["pid"], started.get("pgid"), self.settings.grace_s)
            self.state.event(a.job.id, "stopped", "its supervisor died; the job was stopped")

    def _cancel_requested(self, job_id: int) -> bool:
        job = self.state.job(job_id, attempts=False)
        return bool(job and job.cancel_requested)

    def _finish(self, a: Active, result: dict[str, Any]) -> None:
        del self.active[a.job.id]
        if self.ray is not None:
            self.ray.forget(a.job.id, a.n)
        ended = result.get("ended") or time.time()
        peak_mem = max(a.peak_mem, result.get("peak_mem") or 0) or None
        peak_gpu = a.peak_gpu_mem or None
        kind = result["kind"]
        self.state.update_attempt(
            a.job.id,
            a.n,
            state=result["state"],
            ended=ended,
            exit_code=result.get("exit_code"),
            signal=result.get("signal"),
            cause=result.get("cause"),
            cause_line=result.get("line"),
            peak_mem=peak_mem,
            peak_gpu_mem=peak_gpu,
            cpu_seconds=result.get("cpu_seconds"),
        )
        job = self.state.job(a.job.id, attempts=False)
        assert job is not None
        energy = self._energy(a)
        common = {
            "exit_code": result.get("exit_code"),
            "signal": result.get("signal"),
            "cause": result.get("cause"),
            "cause_line": result.get("line"),
            "peak_mem": max(job.peak_mem or 0, peak_mem or 0) or None,
            "peak_gpu_mem": max(job.peak_gpu_mem or 0, peak_gpu or 0) or None,
            "energy_joules": (job.energy_joules or 0.0) + energy if energy is not None else job.energy_joules,
        }
        if kind in ("gpu_oom", "host_oom") and a.n <= job.retries and not job.cancel_requested:
            # Escalate: first the GPU with the most free memory, then alone; reserve what was measured.
            changes: dict[str, Any] = {"state": RETRYING, "escalation": min(2, job.escalation + 1)}
            # ... capped at what the machine has, so that the retry can still be placed.
            if kind == "gpu_oom" and peak_gpu:
                largest = max((g.mem_total for g in self.capacity.gpus), default=0)
                wanted = max(job.gpu_mem or 0, int(peak_gpu * (1 + self.limits.gpu_mem_margin)))
                changes["gpu_mem"] = min(largest, wanted) if largest else wanted
            if kind == "host_oom" and peak_mem:
                usable = int(self.capacity.mem * (1 - self.limits.host_mem_headroom))
                changes["mem"] = min(usable, max(job.mem, int(peak_mem * 1.2)))
            changes["queued_at"] = time.time()
            self.state.update_job(job.id, **common, **changes)
            self.state.event(job.id, "retry", f"attempt {a.n} ended {result.get('cause')}; retrying")
        else:
            self.state.update_job(job.id, state=result["state"], ended=ended, **common)
            self.state.event(job.id, result["state"], result.get("cause") or "")
        if peak_mem or peak_gpu:
            self.state.record_peak(job.job_key, peak_mem, peak_gpu, ended - a.started)
        if self.tracker is not None and not self.tracker.why_not:
            self._track(job, a, result, ended, peak_mem, peak_gpu, energy)

    def _track(
        self,
        job: Job,
        a: Active,
        result: dict[str, Any],
        ended: float,
        peak_mem: int | None,
        peak_gpu: int | None,
        energy: float | None,
    ) -> None:
        from tandem.place.tracking import enqueue

        placement = ",".join(f"cuda:{i}" for i in a.placement.gpus) or "cpu"
        status = {"succeeded": "FINISHED", "cancelled": "KILLED"}.get(result["state"], "FAILED")
        enqueue(
            self.state.dir,
            {
                "job_id": job.id,
                "attempt": a.n,
                "name": job.name or Path(job.command[0]).name,
                "started": a.started,
                "ended": ended,
                "status": status,
                "metrics_file": str(a.dir / "metrics.jsonl"),
                "log_file": str(a.dir / "output.log"),
                "tags": {
                    "tandem.job_id": job.id,
                    "tandem.attempt": a.n,
                    "group": job.grp or "",
                    "tandem.share": job.share or "",
                    "tandem.placement": placement,
                    "tandem.mps": bool(a.uuids and self.mps is not None),
                    "tandem.command": " ".join(job.command)[:5000],
                    "tandem.state": result["state"],
                    "tandem.cause": result.get("cause") or "",
                    "tandem.exit_code": result.get("exit_code"),
                },
                "summary": {
                    "run_s": ended - a.started,
                    "wait_s": (job.started or a.started) - job.submitted,
                    "peak_mem_bytes": peak_mem,
                    "peak_gpu_mem_bytes": peak_gpu,
                    "cpu_seconds": result.get("cpu_seconds"),
                    "gpu_energy_joules": energy,
                },
            },
        )

    def _energy(self, a: Active) -> float | None:
        """Joules of the job's GPUs over the attempt (shared among collocated jobs: the
        whole device's counter, split by how many jobs were on it at the end)."""
        if not a.energy_start:
            return None
        total = 0.0
        for uuid, start in a.energy_start.items():
            end = self.monitor.gpus[uuid].energy_mj
            if end is None:
                return None
            sharers = 1 + sum(1 for o in self.active.values() if uuid in o.uuids)
            total += (end - start) / 1000.0 / sharers
        return total

    def _signal_shim(self, a: Active, sig: int) -> None:
        if a.remote and self.ray is not None:
            self.ray.cancel(a.job.id, a.n)  # the task passes it on to the supervisor as SIGTERM
            return
        if same_process(a.shim_pid, a.shim_ctime):
            try:
                os.kill(a.shim_pid or 0, sig)
            except ProcessLookupError:
                pass

    def _reap_children(self) -> None:
        # Shims this daemon started are its children until they exit: reap them (no zombies).
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _dependency_states(self, waiting: list[Job]) -> dict[int, tuple[str, float | None]]:
        """``id -> (state, ended)`` of every job a waiting job depends on (one query)."""
        deps = {d for j in waiting for d in j.after}
        if not deps:
            return {}
        marks = ", ".join("?" for _ in deps)
        rows = self.state.query(f"SELECT id, state, ended FROM jobs WHERE id IN ({marks})", tuple(deps))
        return {row["id"]: (row["state"], row["ended"]) for row in rows}

    def _resolve_dependencies(
        self, waiting: list[Job], deps: dict[int, tuple[str, float | None]]
    ) -> list[Job]:
        """Cancel the queued jobs one of whose dependencies ended other than succeeded; the
        jobs still waiting."""
        still = []
        for job in waiting:
            failed = next(
                (d for d in job.after if deps.get(d, ("", None))[0] in FINAL_STATES - {SUCCEEDED}), None
            )
            if job.state != QUEUED or failed is None:
                still.append(job)
                continue
            why = f"dependency {failed} ended {deps[failed][0]}"
            self.state.update_job(job.id, state=CANCELLED, ended=time.time(), cause=why)
            self.state.event(job.id, "cancelled", why)
        return still

    # --- scheduling -------------------------------------------------------------------------

    def _host_slot(self) -> HostSlot:
        now = time.time()
        cpu_jobs = [a for a in self.active.values() if not a.placement.gpus]
        producers = [s for s in self.state.shares() if same_process(s.pid, s.ctime)]
        return HostSlot(
            cpus_total=self.capacity.cpus,
            mem_total=self.capacity.mem,
            cpus_reserved=sum(a.job.cpus for a in self.active.values()) + sum(s.cpus for s in producers),
            mem_reserved=sum(a.job.mem for a in self.active.values()) + sum(s.mem for s in producers),
            mem_available=self.monitor.mem_available,
            cpu_mean=self.monitor.cpu.mean(),
            cpu_p95=self.monitor.cpu.p95(),
            jobs=len(cpu_jobs),
            all_jobs=len(self.active),
            fresh=any(now - a.started < self.limits.settle_s for a in cpu_jobs),
            alone=any(a.placement.alone for a in cpu_jobs),
        )

    def _gpu_slots(self) -> list[GpuSlot]:
        now = time.time()
        slots = []
        for g in self.capacity.gpus:
            on = [a for a in self.active.values() if g.uuid in a.uuids]
            m = self.monitor.gpus.get(g.uuid)
            slots.append(
                GpuSlot(
                    index=g.index,
                    uuid=g.uuid,
                    mem_total=g.mem_total,
                    mem_reserved=sum(a.gpu_mem_reserved or 0 for a in on),
                    mem_used=m.mem_used if m else None,
                    jobs=len(on),
                    probing=any(a.gpu_mem_reserved is None for a in on),
                    probing_job=next((a.job.id for a in on if a.gpu_mem_reserved is None), None),
                    fresh=any(now - a.started < self.limits.settle_s for a in on),
                    alone=any(a.placement.alone for a in on),
                    activity_mean=m.activity.mean() if m else None,
                    activity_p95=m.activity.p95() if m else None,
                )
            )
        return slots

    def _waiting(
        self, waiting: list[Job], ended: dict[int, tuple[str, float | None]], reasons: dict[int, str]
    ) -> list[Waiting]:
        """The jobs the scheduler may consider; the reason each other waiting job waits goes
        into ``reasons``."""
        out = []
        shares = {s.name: s for s in self.state.shares()}
        for job in waiting:
            if job.id in self.active or job.cancel_requested:
                continue
            pending = [d for d in job.after if ended.get(d, ("", None))[0] != SUCCEEDED]
            if pending:
                reasons[job.id] = "after job " + ", ".join(str(d) for d in pending)
                continue
            since = max([job.queued_at or job.submitted] + [ended[d][1] or 0.0 for d in job.after])
            cpus, mem = job.cpus, job.mem
            share = shares.get(job.share or "")
            with_producer = False
            if share is not None and not same_process(share.pid, share.ctime):
                if share.name in self._stopping:
                    reasons[job.id] = f"share {share.name}: its previous producer is still stopping"
                    continue  # its old producer is still stopping: a new one could not take the name
                # Whichever job of the group starts first also starts its producer: each is
                # charged for it until then, so the producer never overbooks the host.
                cpus, mem = cpus + share.cpus, mem + share.mem
                with_producer = True
            gpu_mem = job.gpu_mem
            if job.gpus and gpu_mem is None:
                known = self.state.peak(job.job_key)
                if known is not None and known["peak_gpu_mem"]:
                    gpu_mem = int(known["peak_gpu_mem"] * (1 + self.limits.gpu_mem_margin))
            out.append(
                Waiting(
                    job.id,
                    job.priority,
                    job.submitted,
                    cpus,
                    mem,
                    job.gpus,
                    gpu_mem,
                    job.escalation,
                    waiting_since=since,
                    prefer_gpus=self._shared_data_gpus(job),
                    with_producer=with_producer,
                )
            )
        return out

    def _schedule(self, now: float, waiting: list[Job], deps: dict[int, tuple[str, float | None]]) -> None:
        reasons: dict[int, str] = {}
        queue = self._waiting(waiting, deps, reasons)
        if queue:
            outcome = plan(queue, self._host_slot(), self._gpu_slots(), self.policy, self.limits, now)
            reasons.update(outcome.reasons)
            for placement in outcome.placements:
                job = self.state.job(placement.job_id)
                if job is None or job.cancel_requested:
                    continue
                try:
                    self._launch(job, placement)
                except Exception as exc:
                    log.exception("could not start job %d", job.id)
                    self.state.update_job(
                        job.id, state=FAILED, ended=time.time(), cause=f"could not start: {exc}"
                    )
        # Write only what changed: a queue of thousands must not cost a write per job per tick.
        changed = {i: r for i, r in reasons.items() if self._reasons.get(i) != r}
        if changed:
            self.state.set_reasons(changed)
        self._reasons = reasons

    def _launch(self, job: Job, p: Placement) -> None:
        n = len(job.attempts) + 1
        adir = self.state.attempt_dir(job.id, n)
        adir.mkdir(parents=True, exist_ok=True)
        chosen = tuple(g for g in self.capacity.gpus if g.index in p.gpus)
        uuids = tuple(g.uuid for g in chosen)
        env = dict(job.env)
        env.update(TANDEM_JOB_ID=str(job.id), TANDEM_JOB_ATTEMPT=str(n), PYTHONUNBUFFERED="1")
        # The job sees its GPUs only (by UUID, immune to index reordering); a CPU-only job sees none.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.visible_id for g in chosen)
        if job.share:
            env["TANDEM_SHARE"] = job.share
            self._ensure_producer(job, chosen)
        mps_used = False
        if self.mps is not None and len(uuids) == 1 and not p.alone:
            server = self.mps.ensure(uuids[0])
            if server is not None:
                from tandem.place.mps import client_env

                env.update(client_env(uuids[0], server.dirs, p.gpu_mem, job.gpu_share))
                mps_used = True
        placement = {
            "gpus": list(p.gpus),
            "uuids": list(uuids),
            "gpu_mem": p.gpu_mem,
            "alone": p.alone,
            "probe": p.probe,
            "mps": mps_used,
            "device": ",".join(f"cuda:{i}" for i in p.gpus) or "cpu",
        }
        write_json(
            adir / "spec.json",
            {
                "command": job.command,
                "cwd": job.cwd,
                "env": env,
                "grace_s": self.settings.grace_s,
                "interval": self.settings.interval_s,
                "socket": str(self.socket_path),
            },
        )
        started = time.time()
        if self.ray is not None:
            placement["backend"] = "ray"
        self.state.add_attempt(Attempt(job.id, n, RUNNING, placement, started))
        self.state.update_job(job.id, state=RUNNING, started=job.started or started, reason=None)
        self.state.event(job.id, "started", f"attempt {n} on {placement['device']}")
        if self.ray is not None:
            node = self.ray.launch(
                job.id, n, str(adir), job.cpus, job.mem, chosen, p.gpu_mem, bool(job.share)
            )
            self.state.update_attempt(job.id, n, placement={**placement, "node": node})
            active = Active(job, n, p, uuids, adir, started, gpu_mem_reserved=None if p.probe else p.gpu_mem)
            self.active[job.id] = active
            return
        with open(adir / "shim.log", "ab") as shim_log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tandem.place.shim", str(adir)],
                cwd=job.cwd if os.path.isdir(job.cwd) else "/",
                stdin=subprocess.DEVNULL,
                stdout=shim_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        ctime = create_time(proc.pid)
        self.state.update_attempt(job.id, n, shim_pid=proc.pid, shim_ctime=ctime)
        active = Active(
            job, n, p, uuids, adir, started, proc.pid, ctime, gpu_mem_reserved=None if p.probe else p.gpu_mem
        )
        active.energy_start = {u: e for u in uuids if (e := self.monitor.gpus[u].energy_mj) is not None}
        self.active[job.id] = active

    # --- shared producers ---------------------------------------------------------------------

    def _ensure_producer(self, job: Job, gpus: tuple[GpuInfo, ...]) -> None:
        """Start the producer of ``job``'s share unless one runs: in the job's environment
        (so both find the same runtime directory), in a session of its own (it outlives a
        daemon crash like the jobs do). On the CPU, unless the share keeps its batches on a
        GPU (``--device cuda``, or ``--images``): then it sees the job's first GPU, as
        ``cuda:0``, and later jobs of the share prefer that GPU."""
        share = self.state.share(job.share or "")
        if share is None:
            raise RuntimeError(f"shared dataset {job.share!r} is not defined (tandem share define)")
        if same_process(share.pid, share.ctime):
            return
        logs = self.state.dir / "shares"
        logs.mkdir(exist_ok=True)
        on_gpu = bool(gpus) and slab_on_gpu(share.serve_args)
        env = dict(job.env, CUDA_VISIBLE_DEVICES=gpus[0].visible_id if on_gpu else "")
        if on_gpu:
            self._producer_gpus[share.name] = gpus[0].index
        else:
            self._producer_gpus.pop(share.name, None)
        with open(logs / f"{share.name}.log", "ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tandem.cli",
                    "share",
                    "serve",
                    share.name,
                    *share.serve_args,
                    *self._producer_workers(share),
                ],
                cwd=job.cwd if os.path.isdir(job.cwd) else "/",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._producers[share.name] = proc
        self.state.set_producer(share.name, proc.pid, create_time(proc.pid))
        self.state.event(job.id, "producer", f"started producer of {share.name!r} (pid {proc.pid})")

    def _shared_data_gpus(self, job: Job) -> tuple[int, ...]:
        """The GPU a job's shared batches are on, if its producer keeps them on one and runs."""
        index = self._producer_gpus.get(job.share or "")
        if index is None:
            return ()
        share = self.state.share(job.share or "")
        return (index,) if share is not None and same_process(share.pid, share.ctime) else ()

    @staticmethod
    def _producer_workers(share: Any) -> list[str]:
        """Size the producer's loader to the cores reserved for it, unless its definition says."""
        if "--dataset" not in share.serve_args or "--num-workers" in share.serve_args:
            return []
        from tandem.share._order import auto_workers

        return ["--num-workers", str(auto_workers(share.cpus))]

    def _stop_idle_producers(self, now: float, waiting: list[Job]) -> None:
        # (a stopped producer's GPU is forgotten by _shared_data_gpus: its process is gone)
        # ``waiting`` was read before this tick's starts: those are in self.active now.
        waiting_shares = {j.share for j in waiting if j.share}
        busy = waiting_shares | {a.job.share for a in self.active.values() if a.job.share}
        for share in self.state.shares():
            if share.name in busy or not same_process(share.pid, share.ctime):
                continue
            try:
                os.kill(share.pid or 0, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self._stopping[share.name] = (share.pid or 0, share.ctime or 0.0, now + self.settings.grace_s)
            self.state.set_producer(share.name, None, None)
            self.state.event(None, "producer", f"stopped producer of {share.name!r}: its last job ended")
        for name, (pid, ctime, deadline) in list(self._stopping.items()):
            if not same_process(pid, ctime):
                del self._stopping[name]
            elif now >= deadline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name, proc in list(self._producers.items()):
            if proc.poll() is not None:
                del self._producers[name]

    # --- after a restart ----------------------------------------------------------------------

    def adopt(self) -> None:
        """Take up the attempts a previous daemon left running."""
        for job in self.state.jobs((RUNNING,), attempts=True):
            if not job.attempts:
                self.state.update_job(job.id, state=QUEUED)
                continue
            att = job.attempts[-1]
            adir = self.state.attempt_dir(job.id, att.n)
            pl = att.placement
            placement = Placement(
                job.id,
                tuple(pl.get("gpus", ())),
                pl.get("gpu_mem"),
                bool(pl.get("alone")),
                bool(pl.get("probe")),
            )
            a = Active(
                job,
                att.n,
                placement,
                tuple(pl.get("uuids", ())),
                adir,
                att.started,
                att.shim_pid,
                att.shim_ctime,
                gpu_mem_reserved=pl.get("gpu_mem"),
            )
            shim = read_json(adir / "shim.json")
            if shim is not None:
                a.remote = shim.get("host", self.host) != self.host
                if a.shim_pid is None:
                    a.shim_pid, a.shim_ctime = shim["pid"], shim["ctime"]
            a.peak_gpu_mem = att.peak_gpu_mem or 0
            a.peak_mem = att.peak_mem or 0
            if placement.probe and not pl.get("settled"):
                a.gpu_mem_reserved = None
            self.active[job.id] = a
            self.state.event(job.id, "adopted", f"attempt {att.n} (shim pid {a.shim_pid})")
        for a in list(self.active.values()):
            self._follow(a, time.time())
