"""Starting a placed job: the environment its attempt runs with, and where it runs.

What the daemon decided (:class:`~tandem.place.scheduler.Placement`) becomes the job's
environment here: the GPUs it sees (by UUID, or by index on its Ray node), its threads, its
share, how its drop-in loaders reach this daemon, its MPS server; then
:meth:`tandem.place.attempts.Attempts.start` records the attempt and starts its supervisor.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tandem.place.active import Active
from tandem.place.attempts import Attempts
from tandem.place.config import DaemonConfig
from tandem.place.model import Capacity
from tandem.place.producers import SPEC_ENV, Producers, auto_share_command, is_producer, public_socket
from tandem.place.scheduler import Placement
from tandem.place.state import Job
from tandem.place.threads import thread_env
from tandem.share.spec import PUBLIC_SOCKET_ENV, SHARE_OWNER_ENV

# Under Ray, what a job takes from the node it runs on, not from the shell it was submitted
# from: where that node's sockets are (its share's producer runs there, and is found there).
NODE_ENV = ("XDG_RUNTIME_DIR", "TANDEM_RUNTIME_DIR", "TMPDIR")


def start_job(
    job: Job,
    p: Placement,
    on_host: int,
    *,
    capacity: Capacity,
    config: DaemonConfig,
    state_dir: Path,
    producers: Producers,
    attempts: Attempts,
    mps: Any,
) -> None:
    """Start ``job`` where ``p`` says; ``on_host``: the jobs running once this pass's are."""
    chosen = tuple(g for g in capacity.gpus if g.index in p.gpus)
    ray = config.backend == "ray"
    env = dict(job.env)
    env.update(TANDEM_JOB_ID=str(job.id), TANDEM_JOB_ATTEMPT=str(len(job.attempts) + 1), PYTHONUNBUFFERED="1")
    # The job sees its GPUs only (by UUID, immune to index reordering); a CPU-only job sees none.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(g.visible_id for g in chosen)
    node_cpus = next((n.total.cores for n in capacity.nodes if n.id == p.node), capacity.total.cores)
    if is_producer(job):
        env[SPEC_ENV] = producers.prepare(job)  # the spec it serves (its loader workers are its own)
    else:  # on_host counts its share's producer: its jobs start once it runs
        env.update(thread_env(job.env, job.cpus, node_cpus, on_host))
    if job.share and not is_producer(job):
        env["TANDEM_SHARE"] = job.share
        share = producers.state.share(job.share)
        if share is not None and share.spec.public:  # its producer listens where every user reaches it
            env[PUBLIC_SOCKET_ENV] = str(public_socket(share))
            env[SHARE_OWNER_ENV] = str(share.owner)  # whose producer it must be (its peer's uid)
    if not is_producer(job) and not ray:  # on this host: its drop-in loaders ask this daemon
        # for a producer job (tandem.share.loader), not start their own
        env["TANDEM_SHARE_STARTER"] = json.dumps(auto_share_command(state_dir, config.system))
    with_mps = False
    if mps is not None and len(chosen) == 1 and not p.alone:
        server = mps.ensure(chosen[0].uuid)
        if server is not None:
            from tandem.place.run.services.mps import client_env

            env.update(client_env(chosen[0].uuid, server.dirs, p.reservation.gpu_mem, job.gpu_share))
            with_mps = True
    node_env = NODE_ENV if ray else ()
    attempts.start(job, p, chosen, env, mps=with_mps, backend="ray" if ray else None, node_env=node_env)


def jobs_per_node(active: Iterable[Active], placements: Iterable[Placement]) -> dict[str, int]:
    """The jobs on each node ("" on one server) once ``placements`` run beside ``active``:
    what a job's threads are sized by (:func:`~tandem.place.threads.thread_env`), its own
    node's, not the cluster's."""
    on: dict[str, int] = {}
    for node in [a.placed.node or "" for a in active] + [p.node for p in placements]:
        on[node] = on.get(node, 0) + 1
    return on
