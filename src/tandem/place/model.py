"""What a job asks for and the words the job manager uses: sizes, requests, job states.

Pure data, no I/O: the daemon, the command line, the simulator and the tests share it.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any

from tandem.place.fields import column
from tandem.place.prune import Rule
from tandem.place.resources import Resources
from tandem.units import MAX_BYTES, format_size, parse_size  # noqa: F401 (re-exported: place's words)

QUEUED, RUNNING, RETRYING = "queued", "running", "retrying"
SUCCEEDED, FAILED, OOM, CANCELLED = "succeeded", "failed", "oom", "cancelled"
PRUNED = "pruned"  # stopped early by its sweep's --prune rule (tandem.place.prune): never retried
STATES = (QUEUED, RUNNING, RETRYING, SUCCEEDED, FAILED, OOM, CANCELLED, PRUNED)
FINAL_STATES = frozenset({SUCCEEDED, FAILED, OOM, CANCELLED, PRUNED})
DONE_STATES = frozenset({SUCCEEDED, PRUNED})  # ended as meant: tandem wait's 0
# What torch (intra-op threads, read at import), OpenMP, MKL and OpenBLAS read: the daemon
# sets them to a job's share of the cores (tandem.place.threads), a warm start sets the
# libraries' counts from them (tandem.place.run.supervisor.warm).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def mlflow_status(state: str) -> str:
    """The MLflow run status of a job's ending state: the one mapping (the supervisor's, the
    daemon's and the MLflow helper's runs all end by it). A pruned trial is KILLED, as Ray
    Tune and Optuna's MLflow callbacks end a stopped trial's run."""
    return {SUCCEEDED: "FINISHED", CANCELLED: "KILLED", PRUNED: "KILLED"}.get(state, "FAILED")


WAITING_STATES = frozenset({QUEUED, RETRYING})
# A job row's role: a submitted job, or a share group's producer (made by the daemon only).
JOB_ROLE, PRODUCER_ROLE = "job", "producer"
ROLES = (JOB_ROLE, PRODUCER_ROLE)


def parse_cpus(text: str | float) -> float:
    """A core count, fractional allowed (``0.5``); must be positive."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number of cores (e.g. 1, 0.5, 4)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r}: the number of cores must be above 0")
    return value


AUTO = "auto"
AUTO_CPUS = 0.0  # the stored --cpus of a job that asked for auto


def parse_job_cpus(value: str | float) -> float:
    """A job's ``--cpus``: a core count (``0.5``), or ``auto`` (0: learnt for its job key,
    else a probe: :data:`AUTO_CPUS`)."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO_CPUS
    return parse_cpus(value)


def parse_gpu_mem(value: str | int | None) -> int | None:
    """A job's ``--gpu-mem`` per GPU: a size (``10G``, bytes), or ``auto``/None (None: the
    peak measured for its job key, else a probe)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == AUTO):
        return None
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:
            raise ValueError(f"{exc}, or auto") from None
    return int(value)


def parse_mem(value: str | int | None) -> int:
    """A job's ``--mem``: a size (``4G``, bytes), or ``auto``/None/0 (0: the peak measured
    for its job key plus a margin, else none until measured)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == AUTO):
        return 0
    return parse_size(value) if isinstance(value, str) else int(value)


MAX_PRIORITY = 1_000_000
MAX_NAME = 200
# Linux refuses to start a program with one argument or variable over 128 KiB
# (MAX_ARG_STRLEN), or all of them over a quarter of the stack limit (2 MiB by default):
# a job's are bounded below both, when it is submitted rather than when it fails to start.
MAX_ARG = 128 << 10
MAX_COMMAND = 1 << 20  # the command, its environment and its params together
_STRICT = json.JSONEncoder(allow_nan=False)  # made once: json.dumps(allow_nan=False) makes one a call
_PARAM_KEY = re.compile(r"[/\w.\- :]{1,250}\Z")  # what MLflow takes as a param's name


def _size(texts: list[str], extra: int = 0) -> tuple[int, int]:
    """(the longest, all together) of ``texts`` in bytes as exec passes them (UTF-8, a NUL
    each; ``extra`` bytes more in all). Builtins only: a sweep checks every job's."""
    lengths = list(map(len, texts))
    longest, total = max(lengths, default=0), sum(lengths) + len(lengths) + extra
    if 4 * longest <= MAX_ARG and 4 * total <= MAX_COMMAND:  # the usual case: no encoding
        return longest, total
    sizes = [len(t.encode("utf-8", "replace")) for t in texts]
    return max(sizes, default=0), sum(sizes) + len(sizes) + extra


def _command_problem(command: list[str], env: dict[str, str], params: dict[str, Any]) -> str | None:
    """Too long a command or environment for exec, or a NUL in one; params that are not
    names to JSON values (NaN and infinities given as text)."""
    if not set(map(type, env.values())) <= {str} or not set(map(type, env)) <= {str}:
        return "the environment: names and values are text"
    kib = MAX_ARG >> 10
    longest, total = _size(command)
    if longest > MAX_ARG:
        return f"an argument of the command is {longest >> 10} KiB; at most {kib} KiB each (the kernel's)"
    env_longest, env_total = _size(list(env.values()), sum(map(len, env)) + len(env))  # KEY=
    if env_longest > MAX_ARG:
        key = max(env, key=lambda k: len(env[k]))
        return f"the variable {key} is {env_longest >> 10} KiB; at most {kib} KiB each (the kernel's)"
    if "\0" in "".join(command) or "\0" in "".join(env.values()) or "\0" in "".join(env):
        return "the command or its environment holds a NUL character, which no program can be given"
    if not all(isinstance(k, str) and _PARAM_KEY.match(k) for k in params):
        return "params: names of up to 250 letters, digits, _ - . / : or spaces (what MLflow takes)"
    try:
        params_size = len(_STRICT.encode(params))
    except (TypeError, ValueError) as exc:
        return f"params: values are text, numbers, bools, null, lists or objects of those ({exc})"
    if total + env_total + params_size > MAX_COMMAND:
        return (
            f"the command, its environment and its params are {(total + env_total + params_size) >> 10} KiB; "
            f"at most {MAX_COMMAND >> 10} KiB in all (pass data in files, not arguments)"
        )
    return None


@dataclass(frozen=True)
class Peer:
    """Who sent a request, as the kernel says (``SO_PEERCRED`` of the daemon's socket, the
    peer's supplementary groups from ``/proc``): never anything a client writes. A job is
    its submitter's (:attr:`owner`), run as them by a system manager. ``admin``: may act on
    any job (root, the daemon's own user, a configured admin group)."""

    uid: int
    gid: int
    pid: int = 0
    groups: tuple[int, ...] = ()
    admin: bool = False

    def may_act_on(self, owner: int | None) -> bool:
        """May this peer act on (cancel, read, wait for) a job or share of ``owner``?
        One with no owner was made before owners were kept: the daemon's own user's."""
        return self.admin or owner == self.uid


DAEMON_PEER = Peer(os.getuid(), os.getgid(), os.getpid(), admin=True)  # the daemon itself, in-process


@dataclass
class JobSpec:
    """A job as submitted: what to run and what it reserves. One record from ``tandem submit``
    through the wire (:meth:`to_dict`) and the daemon to the state file, where a stored job
    (:class:`tandem.place.state.Job`) is this plus what happened to it.

    ``gpus`` None: one where the manager has GPUs, else none. ``gpu_mem`` is per GPU; None
    means ``auto``: the peak measured for the same job key before, or, for a job never seen,
    a probe (the GPU with most free memory, which nobody joins until its memory settled).
    ``cpus`` 0 means ``auto`` (the default, here as in ``tandem submit`` and ``tandem.jobs``):
    the cores measured for the same job key, else a small probe raised to its measurement
    (:mod:`tandem.place.reserve`). ``mem`` 0 means ``auto`` too. The fields are the options of
    both front ends, with these defaults: declared here once.
    ``token``: the client's; a submit retried with it returns the job it made."""

    # Each field's storage and its place in --json are declared here, once (tandem.place.fields).
    command: list[str] = column(default_factory=list, queued=True)
    cwd: str = "/"
    env: dict[str, str] = column(default_factory=dict, listed=False, shown=False)  # secrets: never shown
    name: str | None = None
    cpus: float = column(AUTO_CPUS, queued=True, under="request")
    mem: int = column(
        0, queued=True, under="request", json_key="mem_bytes"
    )  # host RAM reserved, bytes (0: none)
    gpus: int | None = column(None, queued=True, under="request")
    gpu_mem: int | None = column(None, queued=True, under="request", json_key="gpu_mem_bytes")
    gpu_share: int | None = column(None, queued=True, under="request")  # MPS active thread percentage
    priority: int = column(0, queued=True)
    retries: int = column(2, queued=True)
    share: str | None = column(None, queued=True)
    group: str | None = column(None, queued=True)  # a pass needs it: an auto share lives with its group
    after: list[int] = column(default_factory=list, queued=True)
    token: str | None = column(None, shown=False)
    params: dict[str, Any] = field(default_factory=dict)  # the job's parameters (a sweep's point)
    # Stop it early where its group's trials do better (tandem.place.prune): asha or median,
    # by the metric NAME:min|max it logs to its MLflow run each step.
    prune: str | None = column(None, queued=True)
    metric: str | None = column(None, queued=True)

    @property
    def job_key(self) -> str:
        return job_key(self.name, self.command)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(JobSpec)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> JobSpec:
        known = {f.name for f in fields(JobSpec)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown job field(s) {', '.join(sorted(unknown))}")
        return cls(**values)

    def problem(self) -> str | None:
        """What is wrong with this request, or None: values the manager cannot keep."""
        if not self.command or not all(isinstance(a, str) for a in self.command):
            return "no command given"
        # 0: auto (tandem.place.reserve.AUTO_CPUS), what the job key was measured to use
        if not (isinstance(self.cpus, (int, float)) and math.isfinite(self.cpus) and 0 <= self.cpus <= 1e6):
            return f"--cpus {self.cpus!r}: the number of cores must be above 0"
        for what, value in (("--mem", self.mem), ("--gpu-mem", self.gpu_mem)):
            if value is not None and not (0 <= value <= MAX_BYTES):
                return f"{what} {value}: not a size any machine has"
        if not -MAX_PRIORITY <= self.priority <= MAX_PRIORITY:
            return f"--priority {self.priority}: use a number from -{MAX_PRIORITY} to {MAX_PRIORITY}"
        if not 0 <= self.retries <= 100:
            return f"--retries {self.retries}: use 0 to 100"
        if self.name is not None and (len(self.name) > MAX_NAME or not self.name.isprintable()):
            return f"--name: use up to {MAX_NAME} printable characters (no control characters)"
        if self.group is not None and (len(self.group) > MAX_NAME or not self.group.isprintable()):
            return f"--group: use up to {MAX_NAME} printable characters (no control characters)"
        if not isinstance(self.params, dict) or not isinstance(self.env, dict):
            return "params: a mapping of names to values"
        if self.prune is not None:
            try:
                prune_rule(self)
            except ValueError as exc:
                return str(exc)
        return _command_problem(self.command, self.env, self.params)


def prune_rule(spec: JobSpec) -> Rule | None:
    """The job's --prune rule (None: it is not pruned); ValueError where it is not one."""
    return None if spec.prune is None else Rule.of(spec.prune, spec.metric)


@dataclass(frozen=True)
class NodeInfo:
    """One machine of a Ray cluster as the daemon hands it out: its cores and RAM as Ray
    declares them (its GPUs are :class:`GpuInfo` with its ``node``)."""

    id: str  # Ray's node id
    name: str  # its host name: what ``ls`` and ``show`` call it
    total: Resources  # its cores and RAM
    alive: bool = True  # a node that died stays listed (its attempts were on it), offered nothing


@dataclass
class Capacity:
    """What the daemon may hand out: cores, RAM and GPUs (index, uuid, memory), and, on a
    Ray cluster, its nodes (none: one server, the figures above are its). Under Ray the
    figures are the live nodes' sums, and the daemon refreshes them each pass
    (:meth:`refresh`, the one place they change): every part that holds it sees the
    cluster as it is now."""

    total: Resources  # its cores and RAM
    gpus: tuple[GpuInfo, ...] = ()
    nodes: tuple[NodeInfo, ...] = ()

    def refresh(self, now: Capacity) -> bool:
        """Take ``now``'s figures; whether anything changed."""
        changed = (self.total, self.gpus, self.nodes) != (now.total, now.gpus, now.nodes)
        self.total, self.gpus, self.nodes = now.total, now.gpus, now.nodes
        return changed

    @property
    def largest_cpus(self) -> float:
        """The most cores one job can have: the largest live node's (one server: its own)."""
        return max((n.total.cores for n in self.nodes if n.alive), default=self.total.cores)

    @property
    def largest_mem(self) -> int:
        """The most RAM one job can have: the largest live node's (one server: its own)."""
        return max((n.total.ram for n in self.nodes if n.alive), default=self.total.ram)

    def node_name(self, node_id: str | None) -> str:
        """What a node is called (its host name; the id's start for one that is gone)."""
        return next((n.name for n in self.nodes if n.id == node_id), (node_id or "")[:12])


@dataclass(frozen=True)
class GpuInfo:
    """One GPU the daemon hands out. ``index`` is the daemon's own numbering (all nodes);
    under Ray, ``node`` is the Ray node it is on and ``local`` its index there."""

    index: int
    uuid: str
    mem_total: int
    name: str = ""
    node: str = ""
    local: int | None = None

    @property
    def visible_id(self) -> str:
        """What ``CUDA_VISIBLE_DEVICES`` names it by: the UUID, else its index on its node."""
        return self.uuid if self.local is None else str(self.local)


def param_value(value: Any) -> str:
    """A parameter's value as text, the one rule for the command, the name, the job's MLflow
    params and every ``k=v`` a person reads: a string as it is (``tandem submit`` keeps every
    value as the text given: ``1e3`` stays ``1e3``), anything else (the Python API's values)
    as JSON: ``0.1``, ``true``, ``null``, ``NaN``."""
    return value if isinstance(value, str) else json.dumps(value)


def params_text(params: dict[str, Any] | None) -> str:
    """``k=v`` pairs, space apart ("" for none)."""
    return " ".join(f"{k}={param_value(v)}" for k, v in (params or {}).items())


def python_code(command: list[str]) -> tuple[str, str] | None:
    """The code a Python interpreter's command runs: ``("-m", MODULE)`` or ``("", SCRIPT)``;
    None where the command is not an interpreter naming one (``python -c``, another program)."""
    if len(command) < 2 or not os.path.basename(command[0]).startswith("python"):
        return None
    if command[1] == "-m":
        return ("-m", command[2]) if len(command) > 2 else None
    return None if command[1].startswith("-") else ("", command[1])


def run_name(name: str | None, command: list[str], params: dict[str, Any] | None) -> str:
    """What a job's MLflow run (and the report's row of it) is called: its ``--name``, else
    its program (the script an interpreter runs: ``train.py``; ``pkg.train`` for ``-m``) and
    its sweep point, ``train.py lr=0.1``: the runs of one sweep tell apart."""
    if name:
        return name
    if (code := python_code(command)) is not None:
        kind, code_name = code
        program = code_name if kind == "-m" else os.path.basename(code_name)
    else:
        program = os.path.basename(command[0]) if command else "job"
    return " ".join(filter(None, [program, params_text(params)]))


def job_key(name: str | None, command: list[str]) -> str:
    """What identifies 'the same job' for measured peaks: its name, else its command line."""
    return f"name:{name}" if name else "cmd:" + " ".join(command)
