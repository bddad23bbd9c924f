"""The job manager's daemon commands: ``tandem daemon start|stop|status|restore`` and ``tandem replay``.

``daemon start`` keeps its configuration in the state directory
(:class:`tandem.place.config.DaemonConfig`), so that any later daemon of that directory,
one that ``tandem submit`` starts after a crash included, runs with it. The limits'
defaults come from :class:`tandem.place.policies.Limits`, named there once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tandem.cli._common import EXIT_NO_DAEMON, daemon_call, request, to_cpus, to_size
from tandem.place import POLICIES, Cap, DaemonConfig, Limits, format_size, user_name
from tandem.units import format_cores

_DEFAULT = DaemonConfig()
_LIMITS = Limits()


@click.group("daemon")
def daemon() -> None:
    """The job manager's daemon (one per state directory; `tandem submit` starts one)."""


# Options the daemon and replay (which runs daemons, or simulates them) both take: defined once.
settle_option = click.option(
    "--settle",
    "settle_s",
    type=click.FloatRange(min=0),
    default=_LIMITS.settle_s,
    show_default=True,
    help="Seconds a job of unknown GPU memory must stop growing before its GPU takes another.",
)
window_option = click.option(
    "--window",
    "window_s",
    type=click.FloatRange(min=1),
    default=_LIMITS.window_s,
    show_default=True,
    help="Seconds of SM activity / CPU use the compute gate looks at.",
)


@daemon.command("start")
@click.option("--cpus", callback=to_cpus, help="Cores to hand out [default: all this process may use].")
@click.option("--mem", callback=to_size, metavar="SIZE", help="RAM to hand out [default: all].")
@click.option("--gpus", metavar="LIST", help="GPUs to use: indices or UUIDs, or none [default: all].")
@click.option("--policy", default=_DEFAULT.policy, show_default=True, type=click.Choice(list(POLICIES)))
@click.option("--max-per-gpu", type=click.IntRange(min=1), default=_LIMITS.max_per_gpu, show_default=True)
@settle_option
@window_option
@click.option("--sm-mean", type=click.FloatRange(0, 1), default=_LIMITS.sm_mean, show_default=True)
@click.option("--sm-p95", type=click.FloatRange(0, 1), default=_LIMITS.sm_p95, show_default=True)
@click.option(
    "--starve-after",
    "starve_after_s",
    type=click.FloatRange(min=0),
    default=_LIMITS.starve_after_s,
    show_default=True,
    help="Seconds a job may wait before no job behind it is started past it.",
)
@click.option(
    "--host-load/--no-host-load",
    default=_LIMITS.host_load,
    show_default=True,
    help="Hold jobs back while the host's measured load, beyond what jobs reserved, leaves no room "
    "(load from outside the manager counts). --no-host-load: the reservations alone decide.",
)
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(min=0),
    default=_DEFAULT.grace_s,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when a job is cancelled.",
)
@click.option(
    "--producer-linger",
    "producer_linger_s",
    type=click.FloatRange(min=0),
    default=_DEFAULT.producer_linger_s,
    show_default=True,
    help="Seconds a share's producer keeps serving after its group's last job, for the next ones "
    "(a tuner's next trials) to find it serving.",
)
@click.option(
    "--log-max",
    callback=to_size,
    default=str(_DEFAULT.log_max),
    metavar="SIZE",
    help="A job's output kept on disk; beyond it the log rotates (the newest half kept) [default: 64M].",
)
@click.option("--mps", is_flag=True, help="Collocate GPU jobs under NVIDIA MPS (one server per GPU).")
@click.option(
    "--store",
    metavar="URI",
    help="MLflow store for the jobs' runs [default: $MLFLOW_TRACKING_URI, else mlflow.db in the state dir].",
)
@click.option("--track/--no-track", default=True, show_default=True, help="Record each job as an MLflow run.")
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    default=_DEFAULT.backend,
    show_default=True,
    help="ray: place jobs on the nodes of a Ray cluster, GPU memory reserved per GPU (tandem[ray]).",
)
@click.option(
    "--address",
    metavar="ADDR",
    help="With --backend ray: the cluster to join [default: a head of its own here, which outlives it].",
)
@click.option(
    "--system",
    is_flag=True,
    help="Manage the whole host for every user (run as root): state in /var/lib/tandem, socket "
    "/run/tandem/daemon.sock ($TANDEM_SYSTEM_DIR moves both); each job runs as its submitter.",
)
@click.option(
    "--admin-group", metavar="GROUP", help="With --system: its members may act on any job, as root may."
)
@click.option(
    "--max-jobs-per-user", type=click.IntRange(min=1), help="With --system: a user's jobs running at once."
)
@click.option(
    "--max-cores-per-user",
    callback=to_cpus,
    help="With --system: the cores a user's running jobs reserve at most.",
)
@click.option(
    "--max-gpu-mem-per-user",
    callback=to_size,
    metavar="SIZE",
    help="With --system: the GPU memory a user's running jobs reserve at most.",
)
@click.option("--foreground", is_flag=True, help="Run here instead of in the background.")
@click.option("--json", "as_json", is_flag=True)
def daemon_start(foreground: bool, as_json: bool, **options: Any) -> None:
    """Start the daemon (capacity defaults to what the machine has). Its configuration is
    kept in the state directory for every later daemon there."""
    from tandem.place import (
        DaemonError,
        DaemonRunning,
        check_may_start,
        is_running,
        run_daemon,
        start_daemon,
        state_dir,
    )

    config = _config(options)
    directory = _system_dir(config) if config.system else state_dir()
    if daemon_call(is_running, directory):
        raise click.ClickException(f"a daemon already serves {directory} (tandem daemon status)")
    check_may_start(directory)  # read-only, or a kept copy to restore: exit 2, nothing written
    config = _kept_backend(directory, config)
    if config.backend == "local":  # what this machine can give, checked before it is kept
        from tandem.place import Nvml, detect_capacity

        nvml = Nvml() if config.gpus != "none" else None
        try:
            detect_capacity(config.cap, config.gpus, nvml)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        finally:
            if nvml is not None:
                nvml.close()
    config.save(directory)
    if not foreground:
        try:
            reply = start_daemon(directory)
        except DaemonError as exc:
            raise click.ClickException(str(exc)) from None
        as_dict = {**dataclasses.asdict(reply), "running": True}
        click.echo(json.dumps(as_dict, indent=2) if as_json else f"daemon {reply.pid} serves {directory}")
        return
    try:
        run_daemon(directory, config)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except (DaemonRunning, RuntimeError, ConnectionError) as exc:  # Ray missing or unreachable
        raise click.ClickException(str(exc)) from None


def _kept_backend(directory: Path, config: DaemonConfig) -> DaemonConfig:
    """The backend a start runs with. Not given (``--backend``): the kept one, with its
    address (a flag-less start after a Ray daemon died brings the same daemon back, never a
    local one that would run the cluster's queue on one machine). Given and not the kept
    one: refused while jobs run on the kept one (the new daemon would lose sight of them),
    saying how to start it, and how to switch."""
    from tandem.place import CONFIG_FILE

    if not (directory / CONFIG_FILE).exists():
        return config
    kept = DaemonConfig.load(directory)
    source = click.get_current_context().get_parameter_source("backend")
    if source != click.core.ParameterSource.COMMANDLINE:
        return dataclasses.replace(config, backend=kept.backend, address=config.address or kept.address)
    if kept.backend == config.backend:
        return config
    from tandem.place import StateReader

    try:
        reader = StateReader(directory)
    except Exception:  # no jobs were ever kept there
        return config
    try:
        running = reader.counts().get("running", 0)
    finally:
        reader.close()
    if not running:
        return config  # nothing runs on the kept backend: switched
    flags = f"--backend {kept.backend}" + (f" --address {kept.address}" if kept.address else "")
    raise click.UsageError(
        f"{running} job(s) of {directory} run with {flags}: a daemon with --backend {config.backend} would "
        f"lose sight of them. Start it so (tandem daemon start {flags}); to switch, let them end or "
        f"cancel them (tandem cancel --all) under it, then start with --backend {config.backend}"
    )


def _system_dir(config: DaemonConfig) -> Path:
    """A system manager's state directory, made (root's, 0700) with its socket's folder (which
    every user may pass through to the socket, never list)."""
    from tandem.dirs import system_paths
    from tandem.place import private_dir

    if os.geteuid() != 0:
        raise click.UsageError(
            "--system manages the host for every user and runs each job as its submitter: start it "
            "as root (sudo tandem daemon start --system), or through its systemd unit "
            "(docs/howto/lab-server.md)"
        )
    directory, socket = system_paths()
    for folder in {directory.parent, socket.parent}:
        folder.mkdir(mode=0o711, parents=True, exist_ok=True)
        if folder.stat().st_uid != 0:
            raise click.UsageError(f"{folder}: not root's; a system manager's folders must be root's only")
        os.chmod(folder, 0o711 if folder == socket.parent else folder.stat().st_mode & 0o7755)
    try:
        return private_dir(directory)
    except Exception as exc:  # StateError: another owner, a link, open to others
        raise click.UsageError(str(exc)) from None


def _config(options: dict[str, Any]) -> DaemonConfig:
    if options["address"] and options["backend"] != "ray":
        raise click.UsageError("--address is for --backend ray")
    system = options["system"]
    per_user = ("admin_group", "max_jobs_per_user", "max_cores_per_user", "max_gpu_mem_per_user")
    for name in per_user:
        if options[name] is not None and not system:
            raise click.UsageError(f"--{name.replace('_', '-')} is for --system")
    admin_group = options.pop("admin_group")
    if admin_group is not None:
        import grp

        try:
            options["admin_gid"] = grp.getgrnam(admin_group).gr_gid
        except KeyError:
            raise click.BadParameter(
                f"no group {admin_group!r} on this host", param_hint="'--admin-group'"
            ) from None
    if system:
        from tandem.dirs import system_paths

        options["socket"] = str(system_paths()[1])
    from tandem.place import UserLimits

    options["user_limits"] = UserLimits(
        options.pop("max_jobs_per_user"),
        options.pop("max_cores_per_user"),
        options.pop("max_gpu_mem_per_user"),
    )
    limits = dataclasses.replace(
        _LIMITS,
        **{
            k: options.pop(k)
            for k in (
                "max_per_gpu",
                "settle_s",
                "window_s",
                "sm_mean",
                "sm_p95",
                "starve_after_s",
                "host_load",
            )
        },
    )
    if options.get("store"):  # the daemon runs in /: a relative store is the one meant here
        from tandem.watch.stores.base import absolute_uri

        options["store"] = absolute_uri(options["store"])
    cap = Cap(options.pop("cpus"), options.pop("mem"))
    return DaemonConfig(cap=cap, limits=limits, **options)


@daemon.command("stop")
@click.option("--timeout", type=float, default=30.0, show_default=True)
@click.option(
    "--own",
    is_flag=True,
    help="Stop your own daemon (of your state directory) while the host's system manager runs, "
    "which every other command uses instead.",
)
def daemon_stop(timeout: float, own: bool) -> None:
    """Stop the daemon. Running jobs go on; the next daemon adopts them."""
    from tandem.dirs import system_paths
    from tandem.place import (
        Stop,
        daemon_pid,
        helper_pid,
        is_running,
        open_runs,
        own_daemon_too,
        request_at,
        state_dir,
        system_manager,
    )

    host = system_manager()
    running: Callable[[], bool]
    if own and host is not None:  # beside the host's manager: asked at its own socket
        directory = state_dir()
        socket = own_daemon_too(directory)
        if socket is None:
            click.echo(f"your own daemon of {directory} does not run", err=True)
            return

        pid = daemon_pid(directory)
        daemon_call(request_at, socket, Stop(), 10.0)

        def running() -> bool:
            return socket.is_socket() and own_daemon_too(directory) is not None

    else:
        # The host's system manager where one serves (every command goes to it): its own
        # folder, where its pid is (only root may stop it, and read that).
        directory = system_paths()[0] if host is not None and os.geteuid() == 0 else state_dir()
        if not daemon_call(is_running, directory):
            click.echo(f"no daemon serves {directory}", err=True)
            return
        pid = daemon_pid(directory)
        request(Stop())

        def running() -> bool:
            return bool(daemon_call(is_running, directory))

    deadline = time.monotonic() + timeout
    # Stopped is when its process has ended (not when its socket closed), and its helper with it.
    while time.monotonic() < deadline and (running() or _alive(pid)):
        time.sleep(0.1)
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        while time.monotonic() < deadline + 10 and _alive(pid):
            time.sleep(0.1)
    helper = helper_pid(directory)
    # It ends once it has written every run it has open; the runs of jobs still running stay
    # open until they end (then it closes them and ends): waiting for those would wait for the jobs.
    while helper is not None and not open_runs(directory) and time.monotonic() < deadline and _alive(helper):
        time.sleep(0.1)
    if _alive(pid):
        raise click.ClickException(f"the daemon (pid {pid}) did not stop within {timeout:g} s")
    if helper is not None and _alive(helper):
        click.echo(
            f"daemon stopped; its MLflow helper (pid {helper}) goes on writing the runs of the jobs "
            "still running, and ends after them",
            err=True,
        )
        return
    click.echo("daemon stopped", err=True)


@daemon.command("restore")
def daemon_restore() -> None:
    """Put back the records a daemon kept when its database was removed under it
    (place.db.saved-*), so that the next daemon goes on with their queued and running jobs."""
    from tandem.place import restore_saved, state_dir

    click.echo(restore_saved(state_dir()), err=True)


def _alive(pid: int | None) -> bool:
    """Is ``pid`` a live process (not a zombie)?"""
    import psutil

    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@daemon.command("status")
@click.option("--system", is_flag=True, help="The host's system manager's (its users, by fair share).")
@click.option("--json", "as_json", is_flag=True)
def daemon_status(system: bool, as_json: bool) -> None:
    """The daemon's pid, policy, capacity and what is in use (a system manager: by user)."""
    from tandem.place import is_running, state_dir, system_manager

    if system and system_manager() is None:
        from tandem.dirs import system_paths

        click.echo(f"no system manager serves this host (socket {system_paths()[1]})", err=True)
        sys.exit(EXIT_NO_DAEMON)
    if not daemon_call(is_running, state_dir()):
        if as_json:
            click.echo(json.dumps({"running": False, "state_dir": str(state_dir())}))
        else:
            click.echo(f"no daemon serves {state_dir()}")
        sys.exit(EXIT_NO_DAEMON)
    from tandem.place import Status

    reply = request(Status())
    if as_json:
        click.echo(json.dumps({**dataclasses.asdict(reply), "running": True}, indent=2))
        return
    cap, used = reply.capacity, reply.used
    host_manager = system_manager()
    if host_manager is not None:  # the host's manager serves this user's commands: say so, and of their own
        click.echo(f"the host's system manager (socket {host_manager}) serves your commands")
        from tandem.place import own_daemon_too

        if own_daemon_too(state_dir()) is not None:
            click.echo(
                f"  your own daemon of {state_dir()} also runs; it serves no command while this one does"
            )
    click.echo(f"daemon {reply.pid}  policy {reply.policy}  state {reply.state_dir}")
    free = f", {format_size(used.measured_free.ram)} free" if used.measured_free is not None else ""
    held, total = used.reserved, cap.total
    click.echo(
        f"  cores {format_cores(held.cores)}/{total.cores:g} reserved   RAM {format_size(held.ram)}/"
        f"{format_size(total.ram)} reserved{free}   jobs running {used.jobs}"
    )
    if reply.users:
        click.echo("  users (fair share: the first goes next)")
        for u in reply.users:
            gpu = f", {format_size(u.gpu_mem)} GPU memory" if u.gpu_mem else ""
            click.echo(
                f"    {user_name(u.uid)}: {u.running} running ({format_cores(u.cores)} cores{gpu}), "
                f"{u.waiting} waiting; use {u.use:g} host-s"
            )
    for g, u in zip(cap.gpus, used.gpus):
        click.echo(
            f"  GPU {g.index} {g.uuid}: {u.jobs} job(s), {format_size(u.mem_reserved_bytes)}/"
            f"{format_size(g.mem_bytes)} reserved"
        )
    for n in reply.nodes:
        if not n.alive:
            click.echo(f"  node {n.name}: gone")
            continue
        gpus = f", GPUs {','.join(map(str, n.gpus))}" if n.gpus else ""
        measured = (
            f"; measured {n.total.cores - n.measured_free.cores:.1f} cores busy, "
            f"{format_size(n.measured_free.ram)} free"
            if n.measured_free is not None
            else "; not measured yet"
        )
        click.echo(
            f"  node {n.name}: {n.jobs} job(s), cores {format_cores(n.reserved.cores)}/{n.total.cores:g} "
            f"reserved ({format_cores(n.cpus_held)} held in Ray), RAM {format_size(n.reserved.ram)}/"
            f"{format_size(n.total.ram)} reserved{gpus}{measured}"
        )
    click.echo("  jobs: " + ", ".join(f"{k} {v}" for k, v in sorted(reply.jobs.items())))


@click.command("replay")
@click.argument("trace_path", metavar="TRACE", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--policy",
    "policies",
    multiple=True,
    metavar="P",
    type=click.Choice(list(POLICIES)),
    help=f"A policy to compare (repeatable) [default: all {len(POLICIES)}: {', '.join(POLICIES)}].",
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
@click.option(
    "--gpu-mem", callback=to_size, default="80G", show_default=True, help="Simulated memory per GPU."
)
@click.option("--cpus", callback=to_cpus, help="Cores (simulated; or the live daemon's --cpus).")
@settle_option
@window_option
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

    from tandem.place import compare_policies as compare
    from tandem.place import run_simulations, traces, write_report

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
    limits = dataclasses.replace(_LIMITS, settle_s=settle_s, window_s=window_s)
    if simulate:
        results: dict[str, Any] = run_simulations(
            jobs, chosen, gpus=gpus, gpu_mem=gpu_mem or 0, cpus=cpus or 64, limits=limits
        )
        kind = "simulated"
    else:
        if any(not j.spec.command for j in jobs):
            raise click.UsageError(f"{trace_path} has jobs without a command: add --simulate to simulate it")
        from tandem.place import replay_live

        results = {}
        for policy in chosen:
            click.echo(f"replaying {len(jobs)} jobs under {policy} ...", err=True)
            config = DaemonConfig(cap=Cap(cpus), policy=policy, limits=limits, track=False)
            results[policy] = replay_live(jobs, out.resolve(), config)
        kind = "measured"
    Console(width=None if sys.stdout.isatty() else 200).print(
        compare(results, title=f"{trace_path.name} ({kind})")
    )
    json_path, png_path = write_report(results, out, f"replay-{trace_path.stem}")
    click.echo(f"wrote {json_path} and {png_path}", err=True)


COMMANDS = [daemon, replay]
