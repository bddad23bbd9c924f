"""The job manager's commands: ``tandem submit|ls|show|logs|cancel|wait|daemon``.

Reads (``ls``, ``show``, ``logs``, ``wait``) go to the state file and work with no daemon
running; ``submit`` starts one if needed; ``cancel`` and ``daemon stop|status`` talk to it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from tandem.place.model import (
    CANCELLED,
    FINAL_STATES,
    SUCCEEDED,
    WAITING_STATES,
    format_size,
    parse_cpus,
    parse_size,
)
from tandem.place.policies import DEFAULT_POLICY, POLICIES


def _state() -> Any:
    from tandem.place.state import State, StateError

    try:
        return State()
    except StateError as exc:
        raise click.ClickException(str(exc)) from None


def _size(_ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _gpu_mem(_ctx: click.Context, _param: click.Parameter, value: str) -> int | None:
    if value.strip().lower() == "auto":
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(f"{exc}, or auto") from None


def _cpus(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_cpus(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _ids(values: tuple[str, ...], what: str) -> list[int]:
    ids = []
    for raw in values:
        for part in raw.split(","):
            if not part.strip().isdigit():
                raise click.BadParameter(
                    f"{part!r} is not a job id (a number, as `tandem ls` shows)", param_hint=what
                )
            ids.append(int(part))
    return ids


# Exit codes of the job manager's commands (README, "Exit codes"). ``tandem wait`` of one
# job that failed exits with the job's own code.
EXIT_FAILED = 1  # a job failed (or several did not all succeed)
EXIT_USAGE = 2  # bad input, or a job refused because it can never fit
EXIT_NO_DAEMON = 3  # no daemon serves the state directory
EXIT_CANCELLED = 4  # the job was cancelled
EXIT_NO_ANSWER = 69  # the daemon did not answer in time (EX_UNAVAILABLE)
EXIT_TIMEOUT = 124  # tandem wait --timeout ran out
EXIT_INTERRUPTED = 130  # Ctrl-C


class _Exit(click.ClickException):
    """An error message with its own exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code


def daemon_call(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` with the client's errors as messages and exit codes."""
    from tandem.place.client import DaemonError, DaemonNotRunning, DaemonRefused, DaemonTimeout

    try:
        return call(*args, **kwargs)
    except DaemonTimeout as exc:
        raise _Exit(str(exc), EXIT_NO_ANSWER) from None
    except DaemonNotRunning as exc:
        raise _Exit(f"{exc}; start one with `tandem daemon start`", EXIT_NO_DAEMON) from None
    except DaemonRefused as exc:
        raise _Exit(str(exc), EXIT_USAGE) from None
    except DaemonError as exc:
        raise click.ClickException(str(exc)) from None


def _request(message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    from tandem.place.client import request
    from tandem.place.state import state_dir

    return daemon_call(request, state_dir(), message, timeout=timeout)


@click.command("submit", context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False})
@click.option("--name", help="Job name (measured peaks are remembered per name).")
@click.option(
    "--cpus", callback=_cpus, default="1", show_default=True, help="Cores to reserve (0.5 allowed)."
)
@click.option("--mem", callback=_size, metavar="SIZE", help="RAM to reserve (512M, 10G) [default: none].")
@click.option("--gpus", type=click.IntRange(min=0), help="GPUs [default: 1 if the manager has GPUs, else 0].")
@click.option(
    "--gpu-mem",
    callback=_gpu_mem,
    default="auto",
    show_default=True,
    metavar="SIZE|auto",
    help="GPU memory per GPU; auto: the peak measured for this name before, else probe.",
)
@click.option("--gpu-share", type=click.IntRange(1, 100), metavar="PCT", help="MPS: share of the GPU's SMs.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Retries after an out-of-memory ending (other failures are never retried).",
)
@click.option("--share", metavar="NAME", help="Read the shared dataset NAME (sets TANDEM_SHARE).")
@click.option("--group", metavar="G", help="Group name (shown in ls; tags the run).")
@click.option("--after", "after", multiple=True, metavar="ID,...", help="Start after these jobs succeeded.")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V", help="Set a variable (repeatable).")
@click.option(
    "--cwd", type=click.Path(file_okay=False, path_type=Path), help="Working directory [default: .]."
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(
    name: str | None,
    cpus: float,
    mem: int | None,
    gpus: int | None,
    gpu_mem: int | None,
    gpu_share: int | None,
    priority: int,
    retries: int,
    share: str | None,
    group: str | None,
    after: tuple[str, ...],
    env_pairs: tuple[str, ...],
    cwd: Path | None,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Queue COMMAND: tandem submit [OPTIONS] -- COMMAND...  Prints the job's id."""
    if not command:
        raise click.UsageError("no command given: tandem submit [OPTIONS] -- COMMAND [ARGS]...")
    env = dict(os.environ)
    for pair in env_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="'--env'")
        env[key] = value
    workdir = (cwd or Path.cwd()).resolve()
    if not workdir.is_dir():
        raise click.BadParameter(f"{workdir}: no such directory", param_hint="'--cwd'")
    from tandem.place.client import job_spec

    spec = job_spec(
        list(command),
        name=name,
        cpus=cpus,
        mem=mem or 0,
        gpus=gpus,
        gpu_mem=gpu_mem,
        gpu_share=gpu_share,
        priority=priority,
        retries=retries,
        share=share,
        group=group,
        after=_ids(after, "'--after'"),
        env=env,
        cwd=str(workdir),
    )
    from tandem.place.client import ensure_daemon
    from tandem.place.state import state_dir

    daemon_call(ensure_daemon, state_dir())
    reply = _request({"op": "submit", "job": spec})
    if as_json:
        from tandem.place.views import job_json

        job = _state().job(reply["id"])
        click.echo(json.dumps(job_json(job), indent=2))
    else:
        click.echo(reply["id"])


@click.command("ls")
@click.option("-a", "--all", "show_all", is_flag=True, help="Ended jobs too (default: the last 10 ended).")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of jobs.")
def ls(show_all: bool, as_json: bool) -> None:
    """The queue: waiting and running jobs, and recently ended ones."""
    from tandem.place.views import LS_COLUMNS, job_json, ls_row

    jobs = _state().jobs(attempts=True)
    if not show_all:
        ended = [j for j in jobs if j.state in FINAL_STATES]
        keep = {j.id for j in ended[-10:]}
        jobs = [j for j in jobs if j.state not in FINAL_STATES or j.id in keep]
    if as_json:
        click.echo(json.dumps([job_json(j) for j in jobs], indent=2))
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    if not jobs:
        console.print("no jobs")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in LS_COLUMNS:
        table.add_column(
            col,
            justify="right" if col in ("id", "tries", "wait", "run", "mem", "gpu mem") else "left",
            overflow="fold",
        )
    now = time.time()
    for j in jobs:
        table.add_row(*ls_row(j, now))
    console.print(table)
    _print_share_groups(console, jobs)


def _print_share_groups(console: Any, jobs: list[Any]) -> None:
    """One line per shared dataset that jobs here use: its producer and its jobs."""
    from tandem.place.shim import same_process

    used = {j.share for j in jobs if j.share}
    for share in _state().shares():
        if share.name not in used:
            continue
        members = [j for j in jobs if j.share == share.name]
        running = sum(j.state == "running" for j in members)
        waiting = sum(j.state in WAITING_STATES for j in members)
        producer = (
            f"producer pid {share.pid}" if same_process(share.pid, share.ctime) else "no producer running"
        )
        console.print(
            f"share {share.name}: {producer}; jobs {', '.join(str(j.id) for j in members)} "
            f"({running} running, {waiting} waiting)"
        )


@click.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def show(job_id: int, as_json: bool) -> None:
    """One job: its request, attempts, placement, how it ended (with the log line), peaks."""
    from tandem.place.views import job_json

    state = _state()
    job = state.job(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id} (see tandem ls --all)")
    data = job_json(job)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    req = data["request"]
    lines = [
        f"job {job.id}  {job.name or ''}  [{job.state}]",
        f"  command   {' '.join(job.command)}",
        f"  cwd       {job.cwd}",
        f"  request   {req['cpus']:g} cores, RAM {format_size(req['mem_bytes'] or None)}, "
        f"{job.gpus} GPU(s), GPU memory {format_size(job.gpu_mem) if job.gpu_mem else 'auto'}",
        f"  priority  {job.priority}   retries {job.retries}   group {job.grp or '-'}   "
        f"share {job.share or '-'}",
        f"  waited    {data['wait_s']:.1f} s   ran {data['run_s'] or 0:.1f} s   "
        f"peak RAM {format_size(job.peak_mem)}   peak GPU memory {format_size(job.peak_gpu_mem)}",
    ]
    if job.cause:
        code = f" (exit {job.exit_code})" if job.exit_code is not None and "exit" not in job.cause else ""
        lines.append(f"  ended     {job.cause}{code}")
    if job.cause_line:
        lines.append(f"  log       {job.cause_line}")
    for a in data["attempts"]:
        p = a["placement"]
        lines.append(
            f"  attempt {a['n']}: {a['state']} on {p['device']}{' mps' if p['mps'] else ''}"
            f"{' alone' if p['alone'] else ''}  {a['cause'] or ''}"
        )
    for e in state.events(job_id):
        lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(e['t']))} {e['kind']} {e['detail']}")
    click.echo("\n".join(lines))


@click.command("logs")
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the job writes, until it ends.")
def logs(job_id: int, follow: bool) -> None:
    """A job's output (every attempt, in order)."""
    state = _state()
    job = state.job(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id} (see tandem ls --all)")
    out = sys.stdout.buffer
    shown: dict[int, int] = {}

    def dump() -> None:
        for a in state.attempts(job_id):
            path = state.attempt_dir(job_id, a.n) / "output.log"
            if a.n not in shown and len(state.attempts(job_id)) > 1:
                out.write(f"== attempt {a.n} ==\n".encode())
            try:
                with open(path, "rb") as f:
                    f.seek(shown.get(a.n, 0))
                    data = f.read()
            except OSError:
                data = b""
            shown[a.n] = shown.get(a.n, 0) + len(data)
            out.write(data)
        out.flush()

    dump()
    while follow:
        job = state.job(job_id, attempts=False)
        if job is None or job.state in FINAL_STATES:
            dump()
            break
        time.sleep(0.5)
        dump()


@click.command("cancel")
@click.argument("ids", nargs=-1, required=True)
def cancel(ids: tuple[str, ...]) -> None:
    """Cancel jobs: a waiting job leaves the queue; a running job's whole process tree gets
    SIGTERM, then SIGKILL after a grace period."""
    reply = _request({"op": "cancel", "ids": _ids(ids, "'IDS'")})
    for i in reply["cancelled"]:
        click.echo(f"cancelled {i}")
    for i in reply["ended"]:
        click.echo(f"job {i} had already ended", err=True)
    for i in reply["unknown"]:
        click.echo(f"no job {i}", err=True)
    if reply["unknown"]:
        sys.exit(1)


@click.command("wait")
@click.argument("ids", nargs=-1)
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124).")
def wait(ids: tuple[str, ...], timeout: float | None) -> None:
    """Block until the jobs end (default: every job now waiting or running). Exit with the
    job's exit code (one job), or 1 if any of several did not succeed."""
    state = _state()
    wanted = _ids(ids, "'IDS'") if ids else [j.id for j in state.jobs() if j.state not in FINAL_STATES]
    for i in wanted:
        if state.job(i, attempts=False) is None:
            click.echo(f"Error: no job {i} (see tandem ls --all)", err=True)
            sys.exit(EXIT_USAGE)
    try:
        jobs = _wait_for(state, wanted, timeout)
    except KeyboardInterrupt:
        click.echo("tandem wait: interrupted (the jobs go on)", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if len(jobs) == 1:
        j = jobs[0]
        if j.state == SUCCEEDED:
            sys.exit(0)
        if j.state == CANCELLED:
            click.echo(
                f"job {j.id} was cancelled{f' ({j.cause})' if j.cause != 'cancelled' else ''}", err=True
            )
            sys.exit(EXIT_CANCELLED)
        click.echo(f"job {j.id} {j.state}: {j.cause or ''}", err=True)
        sys.exit(j.exit_code if j.exit_code not in (None, 0) else EXIT_FAILED)
    bad = [j for j in jobs if j.state != SUCCEEDED]
    for j in bad:
        click.echo(f"job {j.id} {j.state}: {j.cause or ''}", err=True)
    sys.exit(EXIT_FAILED if bad else 0)


def _wait_for(state: Any, wanted: list[int], timeout: float | None) -> list[Any]:
    """The jobs once all have ended; exits 124 after ``timeout`` s, 3 when no daemon runs."""
    from tandem.place.client import is_running
    from tandem.place.state import state_dir

    deadline = None if timeout is None else time.monotonic() + timeout
    next_check = time.monotonic() + 5.0
    while True:
        jobs = [state.job(i, attempts=False) for i in wanted]
        if all(j is not None and j.state in FINAL_STATES for j in jobs):
            return jobs
        if deadline is not None and time.monotonic() >= deadline:
            click.echo(f"tandem wait: jobs still running after {timeout:g} s", err=True)
            sys.exit(EXIT_TIMEOUT)
        if time.monotonic() >= next_check:
            # Only a daemon moves jobs on: without one, waiting would never end.
            next_check = time.monotonic() + 5.0
            if not daemon_call(is_running, state_dir()):
                click.echo(
                    "tandem wait: no daemon is running, so these jobs cannot end; "
                    "start one with `tandem daemon start` (it adopts running jobs)",
                    err=True,
                )
                sys.exit(EXIT_NO_DAEMON)
        time.sleep(0.3)


def _given_options(ctx: click.Context) -> list[str]:
    """The options given on this command line, for the background daemon's own."""
    from click.core import ParameterSource

    out = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in ("foreground", "as_json"):
            continue
        if ctx.get_parameter_source(param.name or "") != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name or ""]
        flag = max(param.opts, key=len)
        if param.is_flag:
            if value:
                out.append(flag)
            elif param.secondary_opts:  # --no-track and the like
                out.append(param.secondary_opts[0])
        else:
            out += [flag, str(value)]
    return out


@click.group("daemon")
def daemon() -> None:
    """The job manager's daemon (one per state directory; `tandem submit` starts one)."""


@daemon.command("start")
@click.option("--cpus", callback=_cpus, help="Cores to hand out [default: all this process may use].")
@click.option("--mem", callback=_size, metavar="SIZE", help="RAM to hand out [default: all].")
@click.option(
    "--gpus", "gpu_list", metavar="LIST", help="GPUs to use: indices or UUIDs, or none [default: all]."
)
@click.option(
    "--policy",
    default=DEFAULT_POLICY,
    show_default=True,
    type=click.Choice(list(POLICIES)),
)
@click.option("--max-per-gpu", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--settle",
    "settle_s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds a job's memory must stop growing before its GPU takes another.",
)
@click.option(
    "--window",
    "window_s",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="Seconds of SM activity / CPU use the compute gate looks at.",
)
@click.option("--sm-mean", type=click.FloatRange(0, 1), default=0.60, show_default=True)
@click.option("--sm-p95", type=click.FloatRange(0, 1), default=0.80, show_default=True)
@click.option(
    "--starve-after",
    "starve_after_s",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Seconds a job may wait before no job behind it is started past it.",
)
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when a job is cancelled.",
)
@click.option("--mps", is_flag=True, help="Collocate GPU jobs under NVIDIA MPS (one server per GPU).")
@click.option(
    "--store",
    "store_uri",
    metavar="URI",
    help="MLflow store for the jobs' runs [default: $MLFLOW_TRACKING_URI, else mlflow.db in the state dir].",
)
@click.option("--track/--no-track", default=True, show_default=True, help="Record each job as an MLflow run.")
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="ray: run jobs as Ray tasks, GPU memory reserved per GPU (tandem[ray]).",
)
@click.option(
    "--address", metavar="ADDR", help="With --backend ray: the cluster to join [default: start one]."
)
@click.option("--foreground", is_flag=True, help="Run here instead of in the background.")
@click.option("--json", "as_json", is_flag=True)
def daemon_start(
    cpus: float | None,
    mem: int | None,
    gpu_list: str | None,
    policy: str,
    max_per_gpu: int,
    settle_s: float,
    window_s: float,
    sm_mean: float,
    sm_p95: float,
    starve_after_s: float,
    grace_s: float,
    mps: bool,
    store_uri: str | None,
    track: bool,
    backend: str,
    address: str | None,
    foreground: bool,
    as_json: bool,
) -> None:
    """Start the daemon (capacity defaults to what the machine has)."""
    from tandem.place.client import DaemonError, is_running, start_daemon
    from tandem.place.state import state_dir

    if address and backend != "ray":
        raise click.UsageError("--address is for --backend ray")
    directory = state_dir()
    if not foreground:
        if daemon_call(is_running, directory):
            raise click.ClickException(f"a daemon already serves {directory} (tandem daemon status)")
        try:
            reply = start_daemon(directory, _given_options(click.get_current_context()))
        except DaemonError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(json.dumps(reply, indent=2) if as_json else f"daemon {reply['pid']} serves {directory}")
        return
    from tandem.place.daemon import Daemon, DaemonRunning, Settings
    from tandem.place.devices import Nvml, detect_capacity
    from tandem.place.policies import Limits, make_policy

    nvml = Nvml() if gpu_list != "none" else None
    try:
        capacity = detect_capacity(cpus, mem, gpu_list, nvml)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    limits = Limits(
        max_per_gpu=max_per_gpu,
        settle_s=settle_s,
        window_s=window_s,
        sm_mean=sm_mean,
        sm_p95=sm_p95,
        starve_after_s=starve_after_s,
    )
    settings = Settings(
        make_policy(policy),
        limits,
        grace_s=grace_s,
        mps=mps,
        track=track,
        store=store_uri,
        backend=backend,
        address=address,
    )
    click.echo(
        f"tandem daemon {os.getpid()}: {capacity.cpus:g} cores, {format_size(capacity.mem)} RAM, "
        f"{len(capacity.gpus)} GPU(s), policy {policy}, state {directory}",
        err=True,
    )
    try:
        Daemon(_state(), capacity, settings, nvml).serve()
    except (DaemonRunning, RuntimeError, ConnectionError) as exc:  # Ray missing or unreachable
        raise click.ClickException(str(exc)) from None


@daemon.command("stop")
@click.option("--timeout", type=float, default=30.0, show_default=True)
def daemon_stop(timeout: float) -> None:
    """Stop the daemon. Running jobs go on; the next daemon adopts them."""
    from tandem.place.client import daemon_pid, is_running
    from tandem.place.state import state_dir

    directory = state_dir()
    if not daemon_call(is_running, directory):
        click.echo(f"no daemon serves {directory}", err=True)
        return
    pid = daemon_pid(directory)
    _request({"op": "stop"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daemon_call(is_running, directory):
        time.sleep(0.1)
    if daemon_call(is_running, directory) and pid:
        os.kill(pid, signal.SIGTERM)
    click.echo("daemon stopped", err=True)


@daemon.command("status")
@click.option("--json", "as_json", is_flag=True)
def daemon_status(as_json: bool) -> None:
    """The daemon's pid, policy, capacity and what is in use."""
    from tandem.place.client import is_running
    from tandem.place.state import state_dir

    if not daemon_call(is_running, state_dir()):
        if as_json:
            click.echo(json.dumps({"running": False, "state_dir": str(state_dir())}))
        else:
            click.echo(f"no daemon serves {state_dir()}")
        sys.exit(EXIT_NO_DAEMON)
    reply = _request({"op": "status"})
    reply.pop("ok", None)
    reply["running"] = True
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    cap, used = reply["capacity"], reply["used"]
    click.echo(f"daemon {reply['pid']}  policy {reply['policy']}  state {reply['state_dir']}")
    click.echo(
        f"  cores {used['cpus']:g}/{cap['cpus']:g} reserved   RAM {format_size(used['mem_bytes'])}/"
        f"{format_size(cap['mem_bytes'])} reserved   jobs running {used['jobs']}"
    )
    for g, u in zip(cap["gpus"], used["gpus"]):
        click.echo(
            f"  GPU {g['index']} {g['uuid']}: {u['jobs']} job(s), {format_size(u['mem_reserved_bytes'])}/"
            f"{format_size(g['mem_bytes'])} reserved"
        )
    click.echo("  jobs: " + ", ".join(f"{k} {v}" for k, v in sorted(reply["jobs"].items())))


@click.command("define")
@click.argument("name")
@click.option(
    "--dataset", "dataset_ref", metavar="REF", help="MODULE:FUNCTION returning a map-style dataset."
)
@click.option(
    "--loader", "loader_ref", metavar="REF", help="MODULE:FUNCTION returning a re-iterable of batches."
)
@click.option(
    "--images",
    "images_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="An image folder, decoded and augmented once by the producer (see tandem share serve).",
)
@click.option(
    "--device",
    default=None,
    metavar="cpu|cuda:N",
    help="Where the producer keeps batches (cuda:N: that GPU, as the first job sees it).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--shuffle/--no-shuffle", default=False)
@click.option(
    "--num-workers",
    type=click.IntRange(min=0),
    default=None,
    help="Loader workers [default: the producer's reserved cores less one].",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--window", type=click.IntRange(min=2), default=8, show_default=True)
@click.option("--policy", type=click.Choice(["wait", "skip"]), default="wait", show_default=True)
@click.option(
    "--cpus", callback=_cpus, default=None, help="Cores the producer reserves [default: 1 + workers]."
)
@click.option("--mem", callback=_size, metavar="SIZE", help="RAM the producer reserves [default: none].")
def share_define(
    name: str,
    dataset_ref: str | None,
    loader_ref: str | None,
    images_dir: Path | None,
    device: str | None,
    batch_size: int,
    shuffle: bool,
    num_workers: int | None,
    seed: int,
    window: int,
    policy: str,
    cpus: float | None,
    mem: int | None,
) -> None:
    """Register NAME for the job manager: jobs submitted with --share NAME read it from one
    producer, started with the first such job and stopped after the last (same options as
    tandem share serve)."""
    from tandem.share._registry import validate_name

    if sum(ref is not None for ref in (loader_ref, dataset_ref, images_dir)) != 1:
        raise click.UsageError(
            "give exactly one of --loader or --dataset (MODULE:FUNCTION or path/to/file.py:FUNCTION) "
            "or --images DIR"
        )
    try:
        validate_name(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if images_dir is not None:
        # the producer runs in the job's directory: an absolute path
        args = ["--images", str(images_dir.resolve()), "--window", str(window), "--policy", policy]
    else:
        ref = dataset_ref or loader_ref or ""
        module, sep, attr = ref.partition(":")
        if not sep or not module or not attr:
            raise click.BadParameter(f"{ref!r} is not MODULE:FUNCTION or path/to/file.py:FUNCTION")
        if module.endswith(".py") or "/" in module:
            path = Path(module).resolve()  # the producer runs in the job's directory: keep the file findable
            if not path.is_file():
                raise click.BadParameter(f"no such file: {module}")
            ref = f"{path}:{attr}"
        args = ["--dataset" if dataset_ref else "--loader", ref, "--window", str(window), "--policy", policy]
    if dataset_ref or images_dir:
        args += ["--batch-size", str(batch_size), "--seed", str(seed)]
        args += ["--num-workers", str(num_workers)] if num_workers is not None else []
        args += ["--shuffle"] if shuffle else []
    args += ["--device", device] if device else []
    reserved = cpus if cpus is not None else 1.0 + (num_workers if num_workers is not None else 1)
    _state().define_share(name, args, reserved, mem or 0)
    click.echo(
        f"defined {name!r}: jobs submitted with --share {name} read it from one producer "
        f"(reserving {reserved:g} cores, RAM {format_size(mem or None)})"
    )


@click.command("replay")
@click.argument("trace_path", metavar="TRACE", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--policy",
    "policies",
    multiple=True,
    metavar="P",
    type=click.Choice(list(POLICIES)),
    help="A policy to compare (repeatable) [default: all five].",
)
@click.option(
    "--simulate", is_flag=True, help="Simulate instead of running the commands (seconds, any scale)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["tandem", "philly", "alibaba"]),
    default="tandem",
    show_default=True,
    help="The trace's format (Philly: cluster_job_log JSON; Alibaba 2023: pod CSV).",
)
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N jobs of the trace.")
@click.option("--gpus", type=click.IntRange(min=0), default=1, show_default=True, help="Simulated GPUs.")
@click.option("--gpu-mem", callback=_size, default="80G", show_default=True, help="Simulated memory per GPU.")
@click.option("--cpus", callback=_cpus, help="Cores (simulated; or the live daemon's --cpus).")
@click.option("--settle", "settle_s", type=click.FloatRange(min=0), default=30.0, show_default=True)
@click.option("--window", "window_s", type=click.FloatRange(min=1), default=30.0, show_default=True)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("replay-out"),
    show_default=True,
    help="Where the JSON, the plot and (live) each policy's state go.",
)
def replay(
    trace_path: Path,
    policies: tuple[str, ...],
    simulate: bool,
    fmt: str,
    limit: int | None,
    gpus: int,
    gpu_mem: int,
    cpus: float | None,
    settle_s: float,
    window_s: float,
    out: Path,
) -> None:
    """Replay TRACE under each policy and compare makespan, job completion time, queue wait,
    slowdown against running alone, utilisation, energy and OOM crashes."""
    from rich.console import Console

    from tandem.place import trace as traces
    from tandem.place.policies import Limits
    from tandem.place.replay import compare, run_simulations, write_report

    try:
        if fmt == "philly":
            jobs = traces.read_philly(trace_path, limit=limit)
        elif fmt == "alibaba":
            jobs = traces.read_alibaba(trace_path, limit=limit)
        else:
            jobs = traces.read_trace(trace_path)[:limit]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'TRACE'") from None
    chosen = list(policies) or list(POLICIES)
    limits = Limits(settle_s=settle_s, window_s=window_s)
    if simulate:
        results: dict[str, Any] = run_simulations(
            jobs, chosen, gpus=gpus, gpu_mem=gpu_mem or 0, cpus=cpus or 64, limits=limits
        )
        kind = "simulated"
    else:
        if any(not j.command for j in jobs):
            raise click.UsageError(f"{trace_path} has jobs without a command: add --simulate to simulate it")
        from tandem.place.live import replay_live

        options = ["--settle", str(settle_s), "--window", str(window_s)] + (
            ["--cpus", str(cpus)] if cpus else []
        )
        results = {}
        for policy in chosen:
            click.echo(f"replaying {len(jobs)} jobs under {policy} ...", err=True)
            results[policy] = replay_live(jobs, policy, out.resolve(), options)
        kind = "measured"
    Console(width=None if sys.stdout.isatty() else 200).print(
        compare(results, title=f"{trace_path.name} ({kind})")
    )
    json_path, png_path = write_report(results, out, f"replay-{trace_path.stem}")
    click.echo(f"wrote {json_path} and {png_path}", err=True)


COMMANDS = [submit, ls, show, logs, cancel, wait, daemon, replay]
SHARE_COMMANDS = [share_define]
