"""Hand-off to Ray: ``tandem daemon start --backend ray [--address ADDR]``.

The daemon keeps deciding (the same :func:`tandem.place.scheduler.plan`, the same policies
and reservations); Ray becomes how an attempt reaches a node and how its reservation is
enforced there. Each attempt is a Ray task that runs the same supervisor
(:mod:`tandem.place.run.shim`) on its node, in a session of its own, and waits for it.

GPU memory: Ray's fractional ``num_gpus`` only sets ``CUDA_VISIBLE_DEVICES`` and counts
nothing (its GPU-memory scheduling proposal is unmerged; users hit OOMs with fractional
GPUs). So each node declares each GPU's memory as a custom resource,
``tandem_gpu_mem_mib_<i>`` (MiB of GPU ``i`` on that node), and a job reserves
``gpu_mem`` of the GPU the daemon chose for it, pinned to that node. A node is declared
like this::

    ray start --head --num-gpus 2 --resources '{"tandem_gpu_mem_mib_0": 81559, "tandem_gpu_mem_mib_1": 81559}'

Without ``--address`` the daemon starts a local Ray instance and declares this machine's
GPUs (NVML) that way itself. The task asks Ray for ``num_cpus`` and ``memory`` (the job's
cores and RAM) and no ``num_gpus``: the GPU is the daemon's choice, named to the job in
``CUDA_VISIBLE_DEVICES``.

A share group runs on the daemon's node, where its producer runs (node affinity: a
placement group's bundles are fixed when it is made, and a group's jobs come and go).

Limits, stated: the state directory must be on a filesystem every node sees (the shim
writes its files there) and, for a cancel or a restart to reach a job, the job must run on
the daemon's host (local head, or ``ray.cluster_utils.Cluster`` nodes on one machine);
the compute gate needs NVML readings, which the daemon has only for its own host, so
elsewhere admission is by reservations only.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from typing import Any

from tandem.place.model import GpuInfo

log = logging.getLogger(__name__)

GPU_MEM_RESOURCE = "tandem_gpu_mem_mib_{}"
_RESOURCE = re.compile(r"^tandem_gpu_mem_mib_(\d+)$")
MIB = 1 << 20


def _run_attempt(attempt_dir: str) -> dict[str, Any]:
    """The Ray task: run the shim for ``attempt_dir`` and wait for it. A cancel (Ray raises
    KeyboardInterrupt in the task) is passed on to the shim as SIGTERM, which stops the job's
    tree; the shim runs in its own session so that it outlives a killed worker."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.place.run.shim", attempt_dir],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait()
    return {"shim_exit": code, "node": os.uname().nodename}


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail at once, clearly, where nothing listens at ``HOST:PORT`` (Ray itself retries
    for minutes). Other forms (``auto``, ``ray://...``) are left to Ray."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RuntimeError(
            f"no Ray cluster answers at {address} ({exc}); start one with `ray start --head` "
            "or leave out --address to let the daemon start a local one"
        ) from None


class RayBackend:
    """The daemon's connection to Ray: the cluster's GPUs, and starting attempts as tasks."""

    def __init__(
        self, address: str | None, local_gpus: tuple[GpuInfo, ...] = (), cpus: float | None = None
    ) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError("--backend ray needs Ray: pip install 'tandem[ray]'") from None
        self.ray = ray
        options: dict[str, Any] = {"namespace": "tandem", "log_to_driver": False, "configure_logging": False}
        if address:
            _check_reachable(address)
            ray.init(address=address, **options)
        else:
            resources: dict[str, float] = {
                GPU_MEM_RESOURCE.format(i): g.mem_total // MIB for i, g in enumerate(local_gpus)
            }
            ray.init(
                num_cpus=cpus,  # type: ignore[arg-type]  # a node's CPUs may be fractional; Ray says int
                num_gpus=len(local_gpus),
                resources=resources,
                include_dashboard=False,
                **options,
            )
        self.head_node = ray.get_runtime_context().get_node_id()
        self._task = ray.remote(_run_attempt)
        self.refs: dict[tuple[int, int], Any] = {}

    def cluster(self) -> tuple[float, int, tuple[GpuInfo, ...]]:
        """Cores, RAM and GPUs of the live nodes (GPUs: those that declare their memory)."""
        cpus, mem, gpus = 0.0, 0, list[GpuInfo]()
        for node in sorted(self.ray.nodes(), key=lambda n: n["NodeID"]):
            if not node.get("Alive"):
                continue
            res = node.get("Resources", {})
            cpus += res.get("CPU", 0.0)
            mem += int(res.get("memory", 0))
            declared = sorted((int(m.group(1)), v) for k, v in res.items() if (m := _RESOURCE.match(k)))
            for local, mib in declared:
                gpus.append(
                    GpuInfo(
                        len(gpus),
                        f"{node['NodeID'][:12]}:{local}",
                        int(mib) * MIB,
                        node=node["NodeID"],
                        local=local,
                    )
                )
        return cpus, mem, tuple(gpus)

    def launch(
        self,
        job_id: int,
        n: int,
        attempt_dir: str,
        cpus: float,
        mem: int,
        gpus: tuple[GpuInfo, ...],
        gpu_mem: int | None,
        pin_to_head: bool,
    ) -> str:
        """Start the attempt as a Ray task; the node it is pinned to (or "")."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        resources = {GPU_MEM_RESOURCE.format(g.local): max(1, (gpu_mem or 0) // MIB) for g in gpus if gpu_mem}
        node = gpus[0].node if gpus else (self.head_node if pin_to_head else "")
        options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": 0, "resources": resources, "max_retries": 0}
        if mem:
            options["memory"] = mem
        if node:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        self.refs[(job_id, n)] = self._task.options(**options).remote(attempt_dir)
        return node

    def pending(self, job_id: int, n: int) -> bool:
        """Is the attempt's task still queued or running in Ray?"""
        ref = self.refs.get((job_id, n))
        if ref is None:
            return False
        done, _ = self.ray.wait([ref], timeout=0)
        return not done

    def cancel(self, job_id: int, n: int) -> None:
        ref = self.refs.get((job_id, n))
        if ref is not None:
            self.ray.cancel(ref)

    def forget(self, job_id: int, n: int) -> None:
        self.refs.pop((job_id, n), None)

    def shutdown(self) -> None:
        self.ray.shutdown()
