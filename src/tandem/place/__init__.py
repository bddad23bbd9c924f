"""tandem.place: a collocation-aware job manager for one server, and on Ray for several.

``tandem submit -- COMMAND`` queues a job; a daemon (started on first use) places jobs on
the server's cores, RAM and GPUs with a policy (:mod:`tandem.place.policies`), runs each
under a supervisor that outlives the daemon (:mod:`tandem.place.run.supervisor.shim`),
classifies how it ended (:mod:`tandem.place.run.supervisor.failures`) and retries
out-of-memory endings with escalating placements. State lives in SQLite
(:mod:`tandem.place.state`).

Rooms, each with a docstring of what it owns and may import:

- ``tandem.place`` itself: the daemon and what it decides with. ``model`` (sizes, requests,
  states), ``resources`` (a reservation and where its figures came from), ``policies``,
  ``scheduler``, ``decide``, ``retry`` and ``fairshare`` (pure: the same code runs in the daemon
  and the simulator), ``devices`` (capacity and measurements), ``records`` and ``state`` (the one
  writer of the state file), ``protocol``, ``client`` and ``remote`` (the socket, and the
  state read through a system manager), ``daemon``,
  ``requests``, ``admission``, ``attempts``, ``producers`` and ``views``.
- :mod:`tandem.place.run`: the processes of a job and beside jobs (the supervisor, the
  launchers, the MLflow helper, the Ray head and MPS), a subpackage each with its doors. It
  never imports the daemon or its state.
- :mod:`tandem.place.sim`: traces, the simulator and replays. The live manager never
  imports it.

This module is the manager's face: what the other packages (the CLI, the dashboard,
``tandem.jobs``, ``tandem.select``) use of it, by the name they use, and nothing else of it
(``tests/test_house.py`` checks that they import only this). Each name is imported from its
module on first use (PEP 562), so that ``import tandem.place`` costs nothing: a command
that only reads the queue never imports the daemon, the simulator or NumPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names as _FACE, for type checkers (the house test checks it)
    from tandem.place import protocol
    from tandem.place.client import (
        DaemonDiskFull,
        DaemonError,
        DaemonNotRunning,
        DaemonRefused,
        DaemonTimeout,
        daemon_pid,
        ensure_daemon,
        is_running,
        own_daemon_too,
        request,
        request_at,
        start_daemon,
        submit,
        submit_many,
        submit_sweep,
        system_manager,
    )
    from tandem.place.config import CONFIG_FILE, DaemonConfig
    from tandem.place.daemon import DaemonRunning, run_daemon
    from tandem.place.devices import Nvml, detect_capacity
    from tandem.place.fairshare import UserLimits
    from tandem.place.identity import check_may_start, restore_saved
    from tandem.place.model import (
        CANCELLED,
        DONE_STATES,
        FINAL_STATES,
        JOB_ROLE,
        MAX_PRIORITY,
        PRODUCER_ROLE,
        PRUNED,
        RUNNING,
        STATES,
        SUCCEEDED,
        WAITING_STATES,
        JobSpec,
        format_size,
        param_value,
        params_text,
        parse_cpus,
        parse_gpu_mem,
        parse_job_cpus,
        parse_mem,
        parse_size,
    )
    from tandem.place.outside import report as outside_report
    from tandem.place.paths import cluster_trouble
    from tandem.place.policies import POLICIES, Limits
    from tandem.place.producers import SPEC_ENV as SHARE_SPEC_ENV
    from tandem.place.producers import ended as producer_ended
    from tandem.place.producers import error as producer_error
    from tandem.place.producers import status as producer_status
    from tandem.place.protocol import Cancel, Status, Stop
    from tandem.place.reads import StateReads, log_looks
    from tandem.place.records import Attempt, Job, Share
    from tandem.place.remote import RemoteState
    from tandem.place.resources import Cap
    from tandem.place.run.metrics.as_user import read_store
    from tandem.place.run.metrics.tracking import helper_pid, manager_store
    from tandem.place.run.metrics.tracking_ends import open_runs
    from tandem.place.run.metrics.users import system_user_store
    from tandem.place.run.supervisor.cgroups import Cgroups
    from tandem.place.run.supervisor.files import DaemonFile
    from tandem.place.sim import trace as traces
    from tandem.place.sim.live_replay import replay_live
    from tandem.place.sim.replay import compare as compare_policies
    from tandem.place.sim.replay import run_simulations, write_report
    from tandem.place.state import StateError, StateReader, private_dir, state_dir, state_dir_path
    from tandem.place.sweep import (
        SweepError,
        grid_points,
        job_of,
        parse_grid,
        read_params,
    )
    from tandem.place.sweep import (
        unused as unused_params,
    )
    from tandem.place.sweep_report import ReportError, energy_by_kind, group_report, own_metrics, parse_best
    from tandem.place.views import (
        LS_COLUMNS,
        job_json,
        json_safe,
        ls_row,
        strict_json,
        strict_json_lines,
        user_name,
    )
    from tandem.place.views import (
        starting as is_starting,
    )

# Each name of the face -> "MODULE:ATTRIBUTE" (or "MODULE", the module itself), below tandem.place.
_FACE: dict[str, str] = {
    "DaemonDiskFull": "client:DaemonDiskFull",
    "DaemonError": "client:DaemonError",
    "DaemonNotRunning": "client:DaemonNotRunning",
    "DaemonRefused": "client:DaemonRefused",
    "DaemonTimeout": "client:DaemonTimeout",
    "daemon_pid": "client:daemon_pid",
    "ensure_daemon": "client:ensure_daemon",
    "is_running": "client:is_running",
    "own_daemon_too": "client:own_daemon_too",
    "request": "client:request",
    "request_at": "client:request_at",
    "start_daemon": "client:start_daemon",
    "submit": "client:submit",
    "submit_many": "client:submit_many",
    "submit_sweep": "client:submit_sweep",
    "system_manager": "client:system_manager",
    "CONFIG_FILE": "config:CONFIG_FILE",
    "DaemonConfig": "config:DaemonConfig",
    "DaemonRunning": "daemon:DaemonRunning",
    "run_daemon": "daemon:run_daemon",
    "Nvml": "devices:Nvml",
    "detect_capacity": "devices:detect_capacity",
    "UserLimits": "fairshare:UserLimits",
    "check_may_start": "identity:check_may_start",
    "restore_saved": "identity:restore_saved",
    "CANCELLED": "model:CANCELLED",
    "DONE_STATES": "model:DONE_STATES",
    "PRUNED": "model:PRUNED",
    "PRODUCER_ROLE": "model:PRODUCER_ROLE",
    "RUNNING": "model:RUNNING",
    "FINAL_STATES": "model:FINAL_STATES",
    "JOB_ROLE": "model:JOB_ROLE",
    "JobSpec": "model:JobSpec",
    "MAX_PRIORITY": "model:MAX_PRIORITY",
    "STATES": "model:STATES",
    "SUCCEEDED": "model:SUCCEEDED",
    "WAITING_STATES": "model:WAITING_STATES",
    "format_size": "model:format_size",
    "param_value": "model:param_value",
    "params_text": "model:params_text",
    "parse_cpus": "model:parse_cpus",
    "parse_gpu_mem": "model:parse_gpu_mem",
    "parse_job_cpus": "model:parse_job_cpus",
    "parse_mem": "model:parse_mem",
    "parse_size": "model:parse_size",
    "outside_report": "outside:report",
    "cluster_trouble": "paths:cluster_trouble",
    "Limits": "policies:Limits",
    "POLICIES": "policies:POLICIES",
    "producer_error": "producers:error",
    "producer_ended": "producers:ended",
    "producer_status": "producers:status",
    "SHARE_SPEC_ENV": "producers:SPEC_ENV",
    "Cancel": "protocol:Cancel",
    "Status": "protocol:Status",
    "Stop": "protocol:Stop",
    "protocol": "protocol",
    "StateReads": "reads:StateReads",
    "log_looks": "reads:log_looks",
    "Attempt": "records:Attempt",
    "Job": "records:Job",
    "Share": "records:Share",
    "RemoteState": "remote:RemoteState",
    "Cap": "resources:Cap",
    "helper_pid": "run.metrics.tracking:helper_pid",
    "manager_store": "run.metrics.tracking:manager_store",
    "open_runs": "run.metrics.tracking_ends:open_runs",
    "read_store": "run.metrics.as_user:read_store",
    "system_user_store": "run.metrics.users:system_user_store",
    "Cgroups": "run.supervisor.cgroups:Cgroups",
    "DaemonFile": "run.supervisor.files:DaemonFile",
    "replay_live": "sim.live_replay:replay_live",
    "compare_policies": "sim.replay:compare",
    "run_simulations": "sim.replay:run_simulations",
    "write_report": "sim.replay:write_report",
    "traces": "sim.trace",
    "StateError": "state:StateError",
    "StateReader": "state:StateReader",
    "private_dir": "state:private_dir",
    "state_dir": "state:state_dir",
    "state_dir_path": "state:state_dir_path",
    "SweepError": "sweep:SweepError",
    "grid_points": "sweep:grid_points",
    "job_of": "sweep:job_of",
    "parse_grid": "sweep:parse_grid",
    "read_params": "sweep:read_params",
    "unused_params": "sweep:unused",
    "ReportError": "sweep_report:ReportError",
    "energy_by_kind": "sweep_report:energy_by_kind",
    "group_report": "sweep_report:group_report",
    "own_metrics": "sweep_report:own_metrics",
    "parse_best": "sweep_report:parse_best",
    "LS_COLUMNS": "views:LS_COLUMNS",
    "is_starting": "views:starting",
    "job_json": "views:job_json",
    "user_name": "views:user_name",
    "json_safe": "views:json_safe",
    "ls_row": "views:ls_row",
    "strict_json": "views:strict_json",
    "strict_json_lines": "views:strict_json_lines",
}

__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    target = _FACE.get(name)
    if target is None:
        raise AttributeError(f"module 'tandem.place' has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    found = importlib.import_module(f"tandem.place.{module}")
    value = getattr(found, attribute) if attribute else found
    globals()[name] = value  # the next use is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACE})
