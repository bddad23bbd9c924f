"""Hand-off to Ray: ``tandem daemon start --backend ray [--address ADDR]``.

The daemon keeps deciding (the same :func:`tandem.place.scheduler.plan_nodes`, the same
policies and reservations), now per node: each pass reads the live nodes from Ray
(:meth:`RayBackend.cluster`: a node that joins is used, one that dies is dropped) and places
each job on one node where it fits. Ray becomes how an attempt reaches its node and how its
reservation is held there.

Each attempt is a **detached, named Ray actor** (:class:`Supervisor`), pinned to the node
chosen and holding its cores, RAM and GPU memory there, which starts the attempt's
supervisor (:mod:`tandem.place.run.supervisor.shim`) once and answers for it. Detached, it outlives
the daemon (Ray ends a driver's tasks and their children when the driver dies); named from
the attempt's directory (state directory, job and attempt), it is created only if absent,
so a start is never repeated, and a restarted daemon finds it again by name to follow,
stop or collect it. When its node dies, Ray fails it at once: the daemon runs the job
again elsewhere (:meth:`tandem.place.attempts.Attempts.follow`), not counted as a failure.

Cores: Ray's CPUs are a hard reservation, tandem's cores elastic (a share group's jobs
start past their cores, a job of learnt cores on measured room), so an actor asks Ray for
the part of its cores that Ray still has unreserved on its node
(:attr:`~tandem.place.scheduler.Placement.cores_held`): Ray never queues what tandem
started. RAM and GPU memory are strict on both sides and asked for as reserved.

GPU memory: Ray's fractional ``num_gpus`` only sets ``CUDA_VISIBLE_DEVICES`` and counts
nothing (its GPU-memory scheduling proposal is unmerged). So each node declares each GPU's
memory as a custom resource, ``tandem_gpu_mem_mib_<i>`` (MiB of GPU ``i`` on that node),
and a job reserves ``gpu_mem`` of the GPU the daemon chose for it. A node is declared::

    ray start --head --num-gpus 2 --resources '{"tandem_gpu_mem_mib_0": 81559, "tandem_gpu_mem_mib_1": 81559}'

Without ``--address`` the daemon starts a Ray head of its own on this machine, which
declares its GPUs (NVML) that way and outlives the daemon (:mod:`.ray_head`).

Measurements: an agent on each live node (:class:`NodeAgent`, an actor of no CPU, owned by
the daemon: it ends with it) reads its host (psutil, its cgroup's limits) and GPUs (NVML)
each second and hands the daemon its last sample when asked (:meth:`RayBackend.samples`,
never waited for): the compute gate, the measured free RAM, learnt cores on measured room
and ``--gpu-mem auto`` probes work on every node, as on one server. A node whose agent has
not answered is admitted on reservations.

Limits, stated: the state directory must be on a filesystem every node sees (the
supervisor writes its files there).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tandem._safepath import module_command
from tandem.place.devices import NodeSample
from tandem.place.model import Capacity, GpuInfo, NodeInfo
from tandem.place.resources import Resources
from tandem.place.run.supervisor.fence import FENCE_GCS, unreachable
from tandem.place.run.supervisor.files import ORPHAN_PARENT, SHIM_LOG

log = logging.getLogger(__name__)

GPU_MEM_RESOURCE = "tandem_gpu_mem_mib_{}"
_RESOURCE = re.compile(r"^tandem_gpu_mem_mib_(\d+)$")
MIB = 1 << 20
NAMESPACE = "tandem"

PENDING, RUNNING, ENDED, GONE = "pending", "running", "ended", "gone"
NODES_WAIT_S = 5.0  # the longest a pass waits for Ray's list of nodes
# A poll answers in milliseconds; one unanswered this long has its actor looked up by name
# again (a dead actor's name is freed at once), lest a death Ray never told this driver
# leave the attempt running for good (seen once, on a busy CI machine)
POLL_STALE_S = 10.0


class Supervisor:
    """One attempt's Ray actor: starts its supervisor process once, in a session of its
    own, and answers for it (still running, its exit, a stop)."""

    def __init__(self, attempt_dir: str, cwd: str) -> None:
        self.dir, self.cwd = attempt_dir, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start the supervisor (once: a second call finds it started); this node's name."""
        if self.proc is None:
            with open(Path(self.dir) / SHIM_LOG, "ab") as shim_log:
                self.proc = subprocess.Popen(
                    module_command("tandem.place.run.supervisor.shim", self.dir),
                    cwd=self.cwd if os.path.isdir(self.cwd) else "/",
                    stdin=subprocess.DEVNULL,
                    stdout=shim_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    # it stops its job when this actor's process dies (files.ORPHAN_SIGNAL)
                    # and fences itself where it loses both the cluster and the disk (fence.py)
                    env={**os.environ, ORPHAN_PARENT: str(os.getpid()), FENCE_GCS: _gcs_address()},
                )
        return os.uname().nodename

    def poll(self) -> int | None:
        """The supervisor's exit status; None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        """Tell the supervisor to stop its job (SIGTERM: it stops the job's tree, then ends)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


class NodeAgent:
    """One node's measurer: a :class:`~tandem.place.devices.Monitor` of that node sampled
    each second in a thread of its own, its last sample handed out when asked."""

    def __init__(self, window_s: float, host_window_s: float, every_s: float = 1.0, lib: Any = None) -> None:
        from tandem.place.devices import Monitor, Nvml, usable_cpus, usable_mem

        nvml = Nvml(lib)  # lib: NVML's Python module (None: pynvml's)
        gpus = nvml.gpus
        if not gpus:  # no driver or no GPU here: host figures only
            nvml.close()
        capacity = Capacity(Resources(usable_cpus()[0], usable_mem()[0]), gpus)
        self.monitor = Monitor(capacity, window_s, nvml if gpus else None)
        self.host_window_s, self.every_s = host_window_s, every_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.monitor.sample()
        self._last, self._at = self.monitor.sample_of(host_window_s), time.monotonic()
        threading.Thread(target=self._sample_forever, name="tandem-agent", daemon=True).start()

    def _sample_forever(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.monitor.sample()
                sample = self.monitor.sample_of(self.host_window_s)
            except Exception as exc:  # a reading that fails: the last one stays, and ages
                log.warning("cannot measure this node: %s", exc)
                continue
            with self._lock:
                self._last, self._at = sample, time.monotonic()

    def read(self) -> NodeSample:
        """The last sample, with its age: one that fails to renew is not taken for new."""
        with self._lock:
            return dataclasses.replace(self._last, age_s=time.monotonic() - self._at)

    def stop(self) -> None:
        self._stop.set()


def _gcs_address() -> str:
    """The address of the Ray head this worker's cluster has ("" where it cannot be read)."""
    try:
        import ray

        return str(ray.get_runtime_context().gcs_address or "")
    except Exception:
        return ""


def actor_name(attempt_dir: str | Path) -> str:
    """An attempt's actor's name: its directory (state directory, job, attempt), unique."""
    return f"tandem:{attempt_dir}"


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail at once, clearly, where nothing listens at ``HOST:PORT`` (Ray itself retries
    for minutes). Other forms (``auto``, ``ray://...``) are left to Ray."""
    why = unreachable(address, timeout)
    if why is not None:
        raise RuntimeError(
            f"no Ray cluster answers at {address} ({why}); start one with `ray start --head` "
            "or leave out --address to let the daemon start a local one"
        )


class RayBackend:
    """The daemon's connection to Ray: the live nodes, and each attempt's actor."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError("--backend ray needs Ray: pip install 'tandem[ray]'") from None
        self.ray = ray
        _check_reachable(address)
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
        self.head_node = ray.get_runtime_context().get_node_id()
        self._actor: Any = ray.remote(Supervisor)
        self._agent: Any = ray.remote(NodeAgent)
        self.agents: dict[str, Any] = {}  # node id -> its agent
        self.agent_reads: dict[str, Any] = {}  # node id -> its read() in flight
        self.handles: dict[str, Any] = {}  # actor name -> handle
        self.starts: dict[str, Any] = {}  # actor name -> its start() (done: the supervisor runs)
        self.polls: dict[str, Any] = {}  # actor name -> its poll() in flight
        self.polled: dict[str, float] = {}  # actor name -> when its poll in flight was sent
        self.lost: dict[str, str] = {}  # actor name -> why its node is gone
        self.ended: set[str] = set()  # actor names whose supervisor exited
        self._gpu_index: dict[tuple[str, int], int] = {}  # (node, its GPU) -> the daemon's index
        self._alive: set[str] = set()
        self._asker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ray-nodes")
        self._asking: concurrent.futures.Future[Any] | None = None
        self._asked = 0.0
        self._names: dict[str, str] = {}  # node id -> host name, the dead kept

    # --- the cluster ---------------------------------------------------------------------

    def _nodes(self) -> list[dict[str, Any]]:
        """Ray's list of nodes, asked in a thread of its own: where Ray's head is gone the
        call blocks until Ray gives up on it (a minute), and the daemon must answer meanwhile.
        TimeoutError where it has not answered within :data:`NODES_WAIT_S`."""
        if self._asking is None or self._asking.done():
            self._asking = self._asker.submit(self.ray.nodes)
            self._asked = time.monotonic()
        try:
            return list(self._asking.result(timeout=max(0.0, self._asked + NODES_WAIT_S - time.monotonic())))
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"Ray's head has not answered for {time.monotonic() - self._asked:.0f} s"
            ) from None

    def cluster(self) -> Capacity:
        """The live nodes' cores, RAM and GPUs (those that declare their memory), each GPU
        numbered once for good (a node that joins later gets new numbers)."""
        nodes, gpus = [], []
        for node in sorted(self._nodes(), key=lambda n: n["NodeID"]):
            node_id = node["NodeID"]
            self._names[node_id] = node.get("NodeManagerHostname") or node_id[:12]
            res = node.get("Resources", {})
            name, cpus, mem = self._names[node_id], res.get("CPU", 0.0), int(res.get("memory", 0))
            nodes.append(NodeInfo(node_id, name, Resources(cpus, mem), alive=bool(node.get("Alive"))))
            if not node.get("Alive"):  # listed, as gone; offered nothing
                continue
            declared = sorted((int(m.group(1)), v) for k, v in res.items() if (m := _RESOURCE.match(k)))
            for local, mib in declared:
                index = self._gpu_index.setdefault((node_id, local), len(self._gpu_index))
                uuid = f"{node_id[:12]}:{local}"
                gpus.append(GpuInfo(index, uuid, int(mib) * MIB, node=node_id, local=local))
        self._alive = {n.id for n in nodes if n.alive}
        total = sum((n.total for n in nodes if n.alive), Resources())
        return Capacity(total, tuple(sorted(gpus, key=lambda g: g.index)), tuple(nodes))

    # --- the nodes' agents -----------------------------------------------------------------

    def samples(self, window_s: float, host_window_s: float) -> dict[str, NodeSample]:
        """The samples the live nodes' agents sent since the last call, by node; an agent
        is made on each live node without one (and again where one failed). Never waits."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        got: dict[str, NodeSample] = {}
        for node in self._alive - set(self.agents):
            where = NodeAffinitySchedulingStrategy(node, soft=False)
            options = {"num_cpus": 0, "max_restarts": 0, "scheduling_strategy": where}
            self.agents[node] = self._agent.options(**options).remote(window_s, host_window_s)
        for node, agent in list(self.agents.items()):
            ref = self.agent_reads.get(node)
            if node not in self._alive:  # gone with its node
                self.agents.pop(node)
                self.agent_reads.pop(node, None)
                continue
            if ref is not None and not self._ready(ref):
                continue
            if ref is not None:
                try:
                    got[node] = self.ray.get(ref)
                except self.ray.exceptions.RayError as exc:
                    log.warning("the agent on node %s failed: %s", self._names.get(node, node[:12]), exc)
                    self.agents.pop(node)
                    self.agent_reads.pop(node, None)
                    continue
            self.agent_reads[node] = agent.read.remote()
        return got

    # --- an attempt's actor ---------------------------------------------------------------

    def launch(
        self, attempt_dir: str, cwd: str, node: str, cpus: float, mem: int, gpu_mem: dict[int, int]
    ) -> None:
        """Start the attempt's actor on ``node`` (if no actor of its name is there already),
        holding ``cpus`` cores, ``mem`` bytes of RAM and ``gpu_mem`` MiB of its GPUs there."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = actor_name(attempt_dir)
        options: dict[str, Any] = {
            "name": name,
            "namespace": NAMESPACE,
            "lifetime": "detached",
            "get_if_exists": True,
            "max_restarts": 0,
            "num_cpus": cpus,
            "num_gpus": 0,
            "resources": {GPU_MEM_RESOURCE.format(i): max(1, mib) for i, mib in gpu_mem.items()},
        }
        if mem:
            options["memory"] = mem
        if node:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        actor: Any = self._actor.options(**options).remote(attempt_dir, cwd)
        self.handles[name] = actor
        self.starts[name] = actor.start.remote()

    def _find(self, name: str) -> Any:
        """The actor of ``name``: the one this daemon made, or (after a restart) found by name."""
        actor = self.handles.get(name)
        if actor is None:
            try:
                actor = self.handles[name] = self.ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:  # none of that name: it never started, or it was ended
                return None
        return actor

    def _ready(self, ref: Any) -> bool:
        done, _ = self.ray.wait([ref], timeout=0)
        return bool(done)

    def status(self, name: str, node: str | None) -> str:
        """Where the attempt's actor is: ``pending`` (Ray has not placed it, or its
        supervisor is not started yet), ``running``, ``ended`` (its supervisor exited) or
        ``gone`` (no actor: never made, ended, or lost with its node, see :attr:`lost`).
        Never waits: each poll is answered by a later call."""
        if name in self.ended:  # said once, said again: every caller of a tick hears it
            return ENDED
        if name in self.lost:  # its node is gone: nothing to ask (a poll of it waits on Ray's nodes)
            return GONE
        actor = self._find(name)
        if actor is None:
            return self._lose(name, node) if node and node not in self._alive else GONE
        if name not in self.starts:
            self.starts[name] = actor.start.remote()  # adopted: answered at once if it ran
        try:
            if not self._ready(self.starts[name]):
                return PENDING if not node or node in self._alive else self._lose(name, node)
            self.ray.get(self.starts[name])
            poll = self.polls.get(name)
            if poll is None or not self._ready(poll):
                if poll is None:
                    self.polls[name], self.polled[name] = actor.poll.remote(), time.monotonic()
                # Ray has its node for dead (this pass's list): a poll of it may wait for minutes
                if node and node not in self._alive:
                    return self._lose(name, node)
                return GONE if self._vanished(name) else RUNNING
            code = self.ray.get(self.polls.pop(name))
        except self.ray.exceptions.ActorUnavailableError:  # unreachable for now: asked again
            self.polls.pop(name, None)
            return RUNNING if not node or self._node_alive(node) else self._lose(name, node)
        except self.ray.exceptions.RayActorError as exc:
            if node and not self._node_alive(node):
                return self._lose(name, node)
            log.warning("the actor of %s failed: %s", name, exc)
            return GONE
        except self.ray.exceptions.RayError as exc:  # its own code failed (a start it could not make)
            log.warning("the actor of %s: %s", name, exc)
            return GONE
        if code is None:
            self.polls[name], self.polled[name] = actor.poll.remote(), time.monotonic()
            return RUNNING
        self.ended.add(name)
        return ENDED

    def _vanished(self, name: str) -> bool:
        """Has the actor of ``name`` died unheard: its poll unanswered for
        :data:`POLL_STALE_S` and no live actor of its name in Ray's registry (asked again
        each :data:`POLL_STALE_S`)?"""
        sent = self.polled.get(name)
        if sent is None or time.monotonic() - sent < POLL_STALE_S:
            return False
        self.polled[name] = time.monotonic()
        try:
            self.ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:  # no actor of that name: it died, and its poll was never failed
            log.warning("the actor of %s died without its poll being answered: taken for ended", name)
            self.polls.pop(name, None)
            return True
        except Exception as exc:  # Ray does not answer: the poll stands
            log.debug("looking up the actor of %s: %s", name, exc)
        return False

    def _node_alive(self, node: str) -> bool:
        """Is ``node`` alive, as Ray says now (read again: an actor's death on a node's
        death reaches us once Ray has marked the node dead)."""
        self._alive = {n["NodeID"] for n in self._nodes() if n.get("Alive")}
        return node in self._alive

    def _lose(self, name: str, node: str | None) -> str:
        self.lost[name] = f"node {self._names.get(node or '', (node or '')[:12])} is gone"
        return GONE

    def stop(self, name: str) -> None:
        """Stop the attempt: its supervisor told to stop its job. An actor answers in order,
        so a stop sent while its start is still on the way comes after it (ending the actor
        instead could leave a supervisor it had just started running unseen)."""
        actor = self._find(name)
        if actor is not None:
            actor.stop.remote()

    def forget(self, name: str) -> None:
        """The attempt is over and recorded: its actor ends (its reservation freed)."""
        actor = self._find(name)
        for table in (self.handles, self.starts, self.polls, self.polled, self.lost):
            table.pop(name, None)
        self.ended.discard(name)
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception as exc:  # already gone with its node
                log.debug("ending the actor of %s: %s", name, exc)

    def shutdown(self) -> None:
        """The daemon leaves Ray; the attempts' actors, detached, run on."""
        self._asker.shutdown(wait=False, cancel_futures=True)
        self.ray.shutdown()
