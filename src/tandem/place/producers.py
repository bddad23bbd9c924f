"""The share groups' producers: started with a group's first job, stopped after its last,
and a producer that dies fails its group's jobs at once with its own error.

A share is defined once (``tandem share define``: a :class:`~tandem.share.spec.ShareSpec`
in the state file). Its producer is started from that spec with its own entry point
(``tandem share serve-spec SPEC.json``), in the first job's environment (so
both find the same runtime directory), under the same supervisor as a job
(:mod:`tandem.place.run.shim`, in ``shares/<name>/<n>/``): it outlives a daemon crash, its
loader workers end with it, and it is tracked as an MLflow run of its own (tags
``tandem.role=producer`` and ``tandem.share``), which ``tandem report`` counts with the
group it fed. Its reservation (cores, RAM) and loader workers come from the spec, sized to
the daemon's cores (:meth:`ShareSpec.producer_cpus`, :meth:`ShareSpec.loader_workers`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from tandem.place.config import DaemonConfig
from tandem.place.model import GpuInfo
from tandem.place.reserve import Learned, producer_key, producer_reservation
from tandem.place.run import tracking, weights
from tandem.place.run.files import AttemptSpec, Result, load, read_json, save, write_json
from tandem.place.run.launch import Launch, LocalLauncher
from tandem.place.run.proctrack import same_process
from tandem.place.state import Job, Share, State

log = logging.getLogger(__name__)
LEARN_AFTER_S = 10.0  # a producer's run shorter than this teaches nothing of its use


class Producers:
    def __init__(
        self,
        state: State,
        capacity_cpus: float,
        config: DaemonConfig,
        tracked: bool,
        learned: Learned | None = None,
    ) -> None:
        self.state = state
        self.learned = learned if learned is not None else Learned()  # what producers used (reserve.py)
        self.capacity_cpus = capacity_cpus
        self.config = config
        self.tracked = tracked
        self._launcher = LocalLauncher()
        self._runs: dict[str, Path] = {}  # share -> the directory of the producer this daemon started
        self._gpus: dict[str, int] = {}  # share -> the GPU its producer keeps batches on
        self._stopping: dict[str, tuple[int, float, float]] = {}  # name -> pid, ctime, SIGKILL deadline
        self._weights: dict[str, tuple[int, int]] = {}  # name -> its supervisor's pid, its CPU weight

    def _dir(self, name: str) -> Path | None:
        """The directory of the share's newest producer (``shares/<name>/<n>``)."""
        known = self._runs.get(name)
        if known is not None:
            return known
        folder = self.state.dir / "shares" / name
        numbered = [int(p.name) for p in folder.glob("*") if p.name.isdigit()] if folder.is_dir() else []
        return folder / str(max(numbered)) if numbered else None

    def log_path(self, name: str) -> Path:
        folder = self._dir(name)
        return folder / "output.log" if folder is not None else self.state.dir / "shares" / name

    def reservation(self, share: Share, running: bool | None = None) -> tuple[float, int]:
        """Cores and RAM a producer of ``share`` reserves (the running one's, else a new one's).
        ``running``: whether its producer runs, where the caller has just looked."""
        if running is None:
            running = self.running(share)
        if share.cpus is not None and running:
            return share.cpus, share.spec.mem
        return self._cores(share)[0], share.spec.mem

    def _cores(self, share: Share) -> tuple[float, str]:
        """What a new producer of ``share`` reserves and why (tandem.place.reserve)."""
        defined = share.spec.producer_cpus(self.capacity_cpus)
        return producer_reservation(defined, share.spec.cpus is not None, self.learned, share.name)

    def _learn(self, name: str, folder: Path | None) -> None:
        """What the share's producer that ended used: its mean cores over its run (a run of a
        few seconds is mostly its start-up, and says nothing of its use)."""
        result = load(folder, Result) if folder is not None else None
        if result is None or not result.cpu_seconds or result.ended - result.started < LEARN_AFTER_S:
            return
        self.learned.seen(producer_key(name), result.cpu_seconds / (result.ended - result.started))

    @staticmethod
    def running(share: Share) -> bool:
        return same_process(share.pid, share.ctime)

    def stopping(self, name: str) -> bool:
        return name in self._stopping

    def ensure(self, job: Job, gpus: tuple[GpuInfo, ...]) -> None:
        """Start the producer of ``job``'s share unless one runs. On the CPU, unless the share
        keeps its batches on a GPU: then it sees the job's first GPU, as ``cuda:0``, and later
        jobs of the share prefer that GPU."""
        share = self.state.share(job.share or "")
        if share is None:
            raise RuntimeError(f"shared dataset {job.share!r} is not defined (tandem share define)")
        if self.running(share):
            return
        spec = share.spec
        on_gpu = bool(gpus) and spec.slab_on_gpu
        env = dict(job.env, CUDA_VISIBLE_DEVICES=gpus[0].visible_id if on_gpu else "")
        if on_gpu:
            self._gpus[share.name] = gpus[0].index
        else:
            self._gpus.pop(share.name, None)
        cpus, why = self._cores(share)
        last = self._dir(share.name)
        n = int(last.name) + 1 if last is not None else 1
        folder = self.state.dir / "shares" / share.name / str(n)
        folder.mkdir(parents=True, exist_ok=True)
        # The selection it serves is the state's (given at define, or made by its selection
        # job). A share whose selection job left none (one from before tandem kept it in the
        # state): its producer makes it, or finds it stored (the same inputs, the same one).
        served = (
            dataclasses.replace(spec, selection=share.selection, select=None) if share.selection else spec
        )
        if spec.source != "loader":
            served = dataclasses.replace(served, num_workers=spec.loader_workers(self.capacity_cpus))
        write_json(folder / "share.json", dataclasses.asdict(served))
        command = [
            sys.executable,
            "-m",
            "tandem.cli",
            "share",
            "serve-spec",
            str(folder / "share.json"),
        ]
        cwd = job.cwd if os.path.isdir(job.cwd) else "/"
        c = self.config
        save(
            folder,
            AttemptSpec(
                command,
                cwd,
                env,
                job_id=0,
                attempt=n,
                name=f"producer {share.name}",
                grace_s=c.grace_s,
                interval_s=c.interval_s,
                log_max=c.log_max,
                socket=None,
                track=self.tracked,
            ),
        )
        handle = _Handle(0, n)
        self._launcher.start(handle, Launch(folder, cwd, cpus))
        self._runs[share.name] = folder
        self.state.set_producer(share.name, handle.shim_pid, handle.shim_ctime, cpus=cpus)
        self.state.event(
            job.id,
            "producer",
            f"started producer of {share.name!r} (pid {handle.shim_pid}), reserving {cpus:g} cores ({why})",
        )
        if self.tracked:
            tags = {"tandem.role": "producer", "tandem.share": share.name, "group": job.group or ""}
            spool = folder / "metrics.jsonl"
            tracking.run_started(
                self.state.dir,
                _run_key(share.name, folder),
                f"producer {share.name}",
                tags,
                spool,
                time.time(),
            )

    def prefer_gpus(self, name: str) -> tuple[int, ...]:
        """The GPU a running producer of share ``name`` keeps its batches on, if any."""
        index = self._gpus.get(name)
        return () if index is None else (index,)

    def _end_run(self, name: str, status: str) -> None:
        """Close the MLflow run of the share's newest producer (one a previous daemon started too)."""
        folder = self._dir(name)
        self._runs.pop(name, None)
        if folder is not None and self.tracked:
            tracking.run_ended(self.state.dir, _run_key(name, folder), status, {}, {}, folder / "output.log")

    def dead(self) -> list[tuple[Share, str]]:
        """Producers that died on their own (not stopped by us): each share with the error
        it ended with. Their record is cleared and the error kept with the share."""
        out = []
        for share in self.state.shares():
            if share.pid is None or share.name in self._stopping or self.running(share):
                continue
            folder = self._dir(share.name)
            result = load(folder, Result) if folder is not None else None
            if result is not None:
                error = f"the producer of share {share.name!r} ended ({result.cause})"
                error += f": {result.line}" if result.line and result.line not in (result.cause or "") else ""
            else:
                error = f"the producer of share {share.name!r} died (its supervisor was killed)"
            self.state.set_producer(share.name, None, None, error=error)
            self._end_run(share.name, "FAILED")
            out.append((share, f"{error}; its log: {self.log_path(share.name)}"))
        return out

    def stop_idle(self, now: float, busy: set[str]) -> None:
        """Stop the producers whose shares no waiting or running job reads."""
        for share in self.state.shares():
            if share.name in busy or not self.running(share):
                continue
            try:
                os.kill(share.pid or 0, signal.SIGTERM)  # its supervisor stops it and its workers
            except ProcessLookupError:
                pass
            self._stopping[share.name] = (
                share.pid or 0,
                share.ctime or 0.0,
                now + 2 * self.config.grace_s + 5,
            )
            self.state.set_producer(share.name, None, None)
            self.state.event(None, "producer", f"stopped producer of {share.name!r}: its last job ended")
        for name, (pid, ctime, deadline) in list(self._stopping.items()):
            if not same_process(pid, ctime):
                del self._stopping[name]
                self._learn(name, self._dir(name))
                self._end_run(name, "FINISHED")
            elif now >= deadline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    @staticmethod
    def start_weights() -> None:
        """At the daemon's start: sweep the CPU cgroups a killed daemon's attempts left, and
        say once how jobs and producers are weighted (:mod:`tandem.place.run.weights`)."""
        weights.sweep()
        weighted, how = weights.available()
        (log.info if weighted else log.warning)("CPU weights: %s", how)

    def weigh(self, running_shares: Iterable[str | None]) -> None:
        """Each running producer weighs as much as the running jobs of its share (one
        ``running_shares`` entry each), at least one; set again only when that changes."""
        jobs = collections.Counter(running_shares)
        for share in self.state.shares():
            if not self.running(share) or share.pid is None:
                continue
            want = (share.pid, max(1, jobs[share.name]))
            # kept only once written: a supervisor just started may not have entered its
            # cgroup yet, and the next pass tries again
            if self._weights.get(share.name) != want and weights.set_weight(*want):
                self._weights[share.name] = want

    def shutdown(self) -> None:
        """The daemon stops: the producers it told to stop have their MLflow runs ended now
        (their group is done; no later daemon knows it stopped them), so that nothing waits
        on them; producers still serving jobs go on, as the jobs do. What one that ended used
        is learnt (kept in the state: the next daemon reserves it)."""
        for name in list(self._stopping):
            del self._stopping[name]
            self._learn(name, self._dir(name))
            self._end_run(name, "FINISHED")


def _run_key(name: str, folder: Path) -> str:
    """The tracking queue's key of the producer of ``name`` started in ``folder``."""
    return f"share-{name}-{folder.name}"


class _Handle:
    """What the launcher fills in for a producer's supervisor."""

    def __init__(self, job_id: int, n: int) -> None:
        self.job_id, self.n = job_id, n
        self.shim_pid: int | None = None
        self.shim_ctime: float | None = None
        self.remote = False


def selections_made(state: State, job_id: int, adir: Path) -> dict[str, str | None]:
    """The selections a share's selection job made, by share: the id ``tandem select run``
    leaves in its directory (``selection.json``), None where it left none."""
    made: dict[str, str | None] = {}
    for share in state.shares():
        if share.spec.select_job != job_id:
            continue
        found = read_json(adir / "selection.json")
        sel_id = found.get("id") if found is not None else None
        made[share.name] = (
            sel_id if isinstance(sel_id, str) and re.fullmatch(r"[0-9a-f]{16}", sel_id) else None
        )
    return made
