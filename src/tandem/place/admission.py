"""What one scheduling pass of the daemon sees, and what it says about the jobs it leaves
waiting.

From the running attempts, the live producers and the measurements it builds the host and
GPU slots (:class:`~tandem.place.policies.HostSlot`, ``GpuSlot``); from the waiting jobs
the scheduler's :class:`~tandem.place.scheduler.Waiting`, through the pure decisions the
simulator makes too (:mod:`tandem.place.decide`: what a job reserves, the views),
adding what is the daemon's own: dependencies and share groups (a job of a share group whose
producer is not running carries its charge apart: the pass charges it to whichever job of
the group it starts first, which starts the producer); it resolves dependencies (a job
after one that failed is cancelled); and it keeps why each waiting job waits, writing only
what changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tandem.place import clock
from tandem.place.active import Active, Startup
from tandem.place.decide import HOST_WINDOW_S, Pass, Peak, gpu_views, host_view
from tandem.place.devices import Monitor
from tandem.place.model import FINAL_STATES, QUEUED, SUCCEEDED, Capacity
from tandem.place.outside import serving
from tandem.place.policies import GpuSlot, HostSlot, Limits
from tandem.place.producers import Producers, is_producer, newest, node_of
from tandem.place.scheduler import NodeSlot, Waiting
from tandem.place.state import Job, Share, State

Ended = dict[int, tuple[str, float | None]]  # job id -> (state, ended) of dependencies


class Admission:
    def __init__(
        self,
        state: State,
        capacity: Capacity,
        limits: Limits,
        monitor: Monitor,
        producers: Producers,
        startup: Startup,
        weighted: bool = False,
    ) -> None:
        self.state, self.capacity, self.limits = state, capacity, limits
        self.monitor, self.producers, self.startup = monitor, producers, startup
        self.weighted = weighted  # this host's jobs run under CPU weights (decide.host_view)
        self._reasons: dict[int, str] = {}  # as last written
        self._peaks: dict[str, Peak] = {}
        self._peaks_version: tuple[int, int] | None = None

    def peaks(self) -> dict[str, Peak]:
        """The measured peaks of every job key (read again only when the state changed):
        looked up once a pass, then for each waiting job from this."""
        version = self.state.version()
        if version != self._peaks_version:
            self._peaks = {r["job_key"]: Peak(r["peak_mem"], r["peak_gpu_mem"]) for r in self.state.peaks()}
            self._peaks_version = version
        return self._peaks

    def host_slot(self, active: Iterable[Active]) -> HostSlot:
        return host_view(
            self.capacity.total,
            active,
            self.startup,
            clock.now(),
            mem_available=self.monitor.mem_available,
            cpu_mean=self.monitor.cpu.mean(HOST_WINDOW_S),
            cpu_p95=self.monitor.cpu.p95(HOST_WINDOW_S),
            weighted=self.weighted,
        )

    def node_slots(self, active: Iterable[Active]) -> list[NodeSlot]:
        """Each node as this pass sees it: on one server the host and its GPUs; on a Ray
        cluster each live node with the attempts on it (what Ray holds there too), measured
        by its agent (:meth:`Monitor.node`): where none has answered, its free RAM and busy
        cores are unknown and its GPUs take jobs of unknown memory as no probe (no reading
        will come to settle one)."""
        active = list(active)
        if not self.capacity.nodes:
            return [NodeSlot("", self.host_slot(active), self.gpu_slots(active))]
        now, out, readings = clock.now(), [], self.monitor.readings()
        for node in (n for n in self.capacity.nodes if n.alive):
            on = [a for a in active if a.placed.node == node.id]
            sample = self.monitor.node(node.id)
            # its busy share is of the cores its agent measured; Ray's count may differ
            cores = node.total.cores
            scale = sample.cpus / cores if sample is not None and sample.cpus and cores else 1.0
            host = host_view(
                node.total,
                on,
                self.startup,
                now,
                mem_available=sample.mem_available if sample is not None else None,
                cpu_mean=None if sample is None or sample.cpu_mean is None else sample.cpu_mean * scale,
                cpu_p95=None if sample is None or sample.cpu_p95 is None else sample.cpu_p95 * scale,
            )
            mine = [g for g in self.capacity.gpus if g.node == node.id]
            gpus = gpu_views(mine, on, readings, self.limits.settle_s, now)
            for g in gpus:
                g.unmeasured = g.uuid not in readings
            held = sum(a.placed.ray_cpus or 0.0 for a in on)
            out.append(NodeSlot(node.id, host, gpus, node.name, held))
        return out

    def gpu_slots(self, active: Iterable[Active]) -> list[GpuSlot]:
        readings = self.monitor.readings()
        return gpu_views(self.capacity.gpus, active, readings, self.limits.settle_s, clock.now())

    def decisions(self, active: Iterable[Active]) -> Pass:
        """This pass's decisions on what waiting jobs reserve (tandem.place.decide)."""
        return Pass(active, self.startup.learned, self.peaks(), self.startup, self.limits.gpu_mem_margin)

    def waiting(
        self, jobs: list[Job], ended: Ended, active: dict[int, Active], reasons: dict[int, str]
    ) -> list[Waiting]:
        """The jobs the scheduler may consider; why each other one waits goes into ``reasons``.
        A job of a share group waits for its producer (a job row, made here when none is
        queued or running) until that runs; then it joins its group."""
        out = []
        shares = {s.name: s for s in self.state.shares()}
        queued, running = self.producers.rows(jobs, active.values())
        outside: dict[str, int | None] = {}  # auto share -> the pid serving it outside the manager
        in_share: dict[tuple[str, str], int] = {}  # its running jobs, per share and node (not its producer)
        in_group: dict[tuple[str, str], int] = {}  # running jobs per group and node (an auto share's readers)
        for a in active.values():
            if is_producer(a.job):
                continue
            if a.job.share:
                key = (a.job.share, node_of(a))
                in_share[key] = in_share.get(key, 0) + 1
            if a.job.group is not None:
                key = (a.job.group, node_of(a))
                in_group[key] = in_group.get(key, 0) + 1
        decide = self.decisions(active.values())
        for job in jobs:
            if job.id in active or job.cancel_requested:
                continue
            since = job.queued_at or job.submitted
            if job.after:
                pending = [d for d in job.after if ended.get(d, ("", None))[0] != SUCCEEDED]
                if pending:
                    reasons[job.id] = "after job " + ", ".join(str(d) for d in pending)
                    continue
                since = max([since] + [ended[d][1] or 0.0 for d in job.after])
            share = shares.get(job.share or "")
            if share is None and is_producer(job):  # its share was removed: cancelled (Producers.tend)
                reasons[job.id] = f"share {job.share}: not defined"
                continue
            why = self._producer_wait(job, share, queued, running, outside) if share is not None else None
            if why is not None:
                reasons[job.id] = why
                continue
            reserved = decide.reserve(job)
            fields = self._group(job, share, running, in_share, in_group)
            if isinstance(fields, str):
                reasons[job.id] = fields
                continue
            out.append(decide.waiting(job, reserved, since, **fields))
        return out

    def _group(
        self,
        job: Job,
        share: Share | None,
        running: dict[str, list[Active]],
        in_share: dict[tuple[str, str], int],
        in_group: dict[tuple[str, str], int],
    ) -> dict[str, Any] | str:
        """``job``'s share-group fields of :class:`~tandem.place.scheduler.Waiting`, or why it
        waits: a job of a share joins its group where a producer of it runs (its batches are
        there, in a GPU slab's case on that GPU), counted with its group's jobs there; under
        Ray a share's next producer goes to a node none of its producers' hosts is."""
        if share is None:
            return {}
        ray = bool(self.capacity.nodes)
        producers = running.get(share.name, [])
        if not is_producer(job):
            feeding = [a for a in producers if not self.producers.stopping(a.job.id)]
            counts = {node_of(a): in_share.get((share.name, node_of(a)), 0) for a in feeding}
            return dict(
                prefer_gpus=tuple(g for a in feeding for g in a.gpus),
                share=share.name,
                share_jobs=sum(counts.values()),
                nodes=counts if ray else None,
            )
        if share.spec.source == "auto":
            # A drop-in loader's producer (one server: a job under Ray is told no starter):
            # the running jobs that asked for it wait for it, idle, holding their cores: it
            # starts as a job of their group would.
            return dict(share_jobs=sum(c for (g, _), c in in_group.items() if g == job.group) or None)
        if not producers:
            return {}
        nodes = self.producers.free_nodes(share.name, producers)
        if not nodes:
            where = ", ".join(sorted(self.producers.hosts(producers)))
            return f"share {share.name}: its producers run on every host ({where})"
        return dict(nodes=nodes)

    def _producer_wait(
        self,
        job: Job,
        share: Share,
        queued: dict[str, list[int]],
        running: dict[str, list[Active]],
        outside: dict[str, int | None],
    ) -> str | None:
        """Why ``job`` of ``share`` waits for the group's producer (made here, queued, if
        none is queued or running), or None: a producer of it runs (or it is a producer), or,
        an auto share's, one outside the manager serves it (``outside``, this pass's answers:
        :mod:`tandem.place.outside`), which its jobs read."""
        producers = running.get(share.name, [])
        if is_producer(job) or any(not self.producers.stopping(a.job.id) for a in producers):
            return None
        if producers:  # a new producer could not take the share's name yet
            ids = ", ".join(str(a.job.id) for a in producers)
            return f"share {share.name}: its previous producer (job {ids}) is still stopping"
        rows = queued.get(share.name)
        if not rows and share.spec.source == "auto":
            if share.name not in outside:
                outside[share.name] = serving(share.name, newest(self.state, share.name, live=True))
            if outside[share.name] is not None:
                return None
        if not rows:
            rows = queued[share.name] = [self.producers.make(share, job)]
        return f"waits for its share's producer (job {rows[0]})"

    def write_reasons(self, reasons: dict[int, str]) -> None:
        """Store why each job waits: only what changed (a long queue costs no write per tick)."""
        changed = {i: r for i, r in reasons.items() if self._reasons.get(i) != r}
        if changed:
            self.state.set_reasons(changed)
        self._reasons = reasons

    def dependencies(self, waiting: list[Job]) -> Ended:
        """``id -> (state, ended)`` of every job a waiting job depends on (one query)."""
        return self.state.ended_of({d for j in waiting for d in j.after})

    def resolve(self, waiting: list[Job], deps: Ended) -> list[Job]:
        """Cancel the queued jobs one of whose dependencies ended other than succeeded; the
        jobs still waiting."""
        still = []
        for job in waiting:
            if not job.after:
                still.append(job)
                continue
            failed = next(
                (d for d in job.after if deps.get(d, ("", None))[0] in FINAL_STATES - {SUCCEEDED}), None
            )
            if job.state != QUEUED or failed is None:
                still.append(job)
                continue
            why = f"dependency {failed} ended {deps[failed][0]}"
            self.state.cancel(job.id, why, why, clock.now())
        return still
