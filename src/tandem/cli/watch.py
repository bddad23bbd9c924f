"""Hardware tracking from the command line: ``tandem run``, ``tandem ui``, ``tandem report``."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from tandem._safepath import module_command
from tandem.cli._common import EXIT_INTERRUPTED, require


def _parse_tags(values: tuple[str, ...], group: str | None) -> dict[str, str]:
    from tandem.watch.checks import check_tags  # standard library only: a usage error comes at once

    tags = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{raw!r} is not KEY=VALUE", param_hint="'--tag'")
        tags[key.strip()] = value
    if group is not None:
        tags["group"] = group
    try:
        return check_tags(tags)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--tag'") from None


def _check_interval(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    from tandem.watch.checks import check_interval  # standard library only: a usage error comes at once

    try:
        return check_interval(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _make_store(sink: str, store_uri: str | None, out: Path, experiment: str) -> Any:
    from tandem.watch.stores import FileStore, MlflowStore

    if sink == "mlflow":
        return MlflowStore(store_uri, experiment=experiment)
    if store_uri is not None:
        raise click.UsageError("--store is for --sink mlflow; use --out DIR with --sink csv|parquet")
    return FileStore(out, fmt=sink)


@click.command("run", context_settings={"allow_interspersed_args": False})
@click.option(
    "-e",
    "--experiment",
    help="MLflow experiment [default: $MLFLOW_EXPERIMENT_NAME, else tandem]. The command is told it "
    "(MLFLOW_EXPERIMENT_NAME), with MLFLOW_TRACKING_URI and MLFLOW_RUN_ID of its run.",
)
@click.option("-n", "--name", help="Run name (default: the command's name).")
@click.option(
    "-i",
    "--interval",
    type=float,
    default=1.0,
    show_default=True,
    callback=_check_interval,
    help="Seconds between samples (0.1 to 3600).",
)
@click.option("-t", "--tag", "tag_values", multiple=True, metavar="KEY=VALUE", help="A tag (repeatable).")
@click.option("-g", "--group", help="Group tag: collocated runs with the same group are shown together.")
@click.option("--sink", type=click.Choice(["mlflow", "csv", "parquet"]), default="mlflow", show_default=True)
@click.option(
    "--store",
    "store_uri",
    metavar="URI",
    help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db].",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("tandem-runs"),
    show_default=True,
    help="Directory for --sink csv|parquet (and the fall-back if MLflow fails).",
)
@click.option(
    "--mlflow-env/--no-mlflow-env",
    default=True,
    show_default=True,
    help="Make the MLflow run before COMMAND starts (MLflow's import: seconds) and tell COMMAND "
    "its MLFLOW_TRACKING_URI and MLFLOW_RUN_ID; --no-mlflow-env starts it at once, told nothing.",
)
@click.option("-q", "--quiet", is_flag=True, help="No summary table.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cmd(
    experiment: str | None,
    name: str | None,
    interval: float,
    tag_values: tuple[str, ...],
    group: str | None,
    sink: str,
    store_uri: str | None,
    out: Path,
    mlflow_env: bool,
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND and track its processes' hardware use and energy: tandem run [OPTIONS] -- COMMAND...

    With MLflow, the run is made before COMMAND starts and COMMAND gets its
    MLFLOW_TRACKING_URI and MLFLOW_RUN_ID: mlflow.log_metric, mlflow.start_run() and
    Lightning's MLFlowLogger(run_id=os.environ["MLFLOW_RUN_ID"]) in it write to that run.
    """
    tags = _parse_tags(tag_values, group)  # usage errors first, before the tracker's imports
    experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "tandem"
    if sink == "mlflow":
        require("run", "mlflow")
    store = _make_store(sink, store_uri, out, experiment)
    from tandem.watch.runner import CommandNotExecutable, CommandNotFound, SignalForwarder, start

    # Process-wide signal handlers: this entry point tracks one command, so its signals are
    # the command's (the library's start() and wait() install none). From before the start,
    # so that none is missed while the command and its tracking start.
    with SignalForwarder() as signals:
        try:
            cmd = start(
                list(command),
                name=name,
                experiment=experiment,
                tags=tags,
                interval=interval,
                store=store,
                quiet=quiet,
                fallback_dir=out,
                mlflow_env=mlflow_env,
            )
        except (CommandNotFound, CommandNotExecutable) as exc:
            click.echo(f"tandem run: {exc}", err=True)
            sys.exit(exc.exit_code)
        except ValueError as exc:  # a bad setting, such as TANDEM_WATTS_PER_CORE
            raise click.UsageError(str(exc)) from None
        signals.attach(cmd)
        sys.exit(cmd.wait())


@click.command("ui")
@click.option(
    "--store",
    "store_uri",
    metavar="URI",
    help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db].",
)
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True)
def ui(store_uri: str | None, port: int) -> None:
    """Serve the MLflow UI for the tracked runs on 127.0.0.1, to you alone: MLflow listens on
    a socket in your private runtime directory, behind a gate that lets in only your own
    connections, with this server's Host and Origin (tandem.web.gate)."""
    require("ui", "mlflow")
    from tandem import _ipc
    from tandem.watch.stores import default_store_uri
    from tandem.watch.stores.mlflow_store import create_store
    from tandem.web.server import bind

    uri = store_uri or default_store_uri()
    try:
        upstream = _ipc.socket_file(f"mlflow-{port}.sock", "ui")
        listener = bind("127.0.0.1", port)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        create_store(uri)  # a new SQLite file 0600 (not MLflow's 0644), its tables made under the lock
    except OSError as exc:
        listener.close()
        raise click.ClickException(f"cannot make the store {uri}: {exc}") from None
    with contextlib.suppress(FileNotFoundError):
        upstream.unlink()  # a socket left by a server of this user's that was killed
    click.echo(f"MLflow UI for {uri} at http://127.0.0.1:{port} (yours alone; Ctrl-C to stop)", err=True)
    argv = module_command(  # nothing imported from the folder it is started in
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--uvicorn-opts",
        f"--uds {shlex.quote(str(upstream))}",  # uvicorn binds the socket, not host:port
        "--artifacts-destination",  # MLflow's default (./mlartifacts) of where it was started
        os.path.abspath("mlartifacts"),
    )
    # MLflow's job runner (GenAI evaluation jobs; nothing a tracked run uses) keeps its queue
    # in a new /dev/shm/tmpXXXXXXXX directory per launch and never removes it.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    # Nothing of this folder is imported by the server's interpreters: it starts its own
    # `python -m uvicorn`, which puts its app dir (its cwd) first on its path; so they run in
    # the private folder of its socket, with a safe path (-P is the first one's only).
    env["PYTHONSAFEPATH"] = "1"
    # The server and its uvicorn in a process group of their own, ended by this process
    # whatever ends it (Ctrl-C, SIGTERM, SIGHUP, the server's own exit); what they write
    # (an artifact sent through the UI) is this user's alone.
    stopped: list[int] = []  # the signals that came; once ending, they are only noted

    def interrupt(signum: int, _frame: Any) -> None:
        stopped.append(signum)
        if len(stopped) == 1:
            raise KeyboardInterrupt

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, interrupt) for s in signals}
    try:
        server = subprocess.Popen(argv, env=env, cwd=upstream.parent, process_group=0, umask=0o077)
        try:
            code = _gate_until_exit(listener, upstream, server)
        except KeyboardInterrupt:
            code = 128 + stopped[0] if stopped and stopped[0] != signal.SIGINT else EXIT_INTERRUPTED
            click.echo("tandem ui: stopped", err=True)
        finally:
            stopped.append(0)  # from here, a signal interrupts nothing
            _end_group(server)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            upstream.unlink()
    sys.exit(code)


def _end_group(server: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End ``server`` and every process of its group or below it (MLflow's uvicorn, still
    there where the server itself died): SIGTERM, then SIGKILL to what is left after
    ``grace_s``."""
    import psutil

    def members() -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(server.pid)
            found = {p.pid: p for p in [top, *top.children(recursive=True)]}
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(proc.pid) == server.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    found.setdefault(proc.pid, proc)
        return list(found.values())

    tree = members()
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=grace_s)  # reaped: no zombie left


def _gate_until_exit(listener: Any, upstream: Path, server: subprocess.Popen) -> int:
    """Serve the gate in front of ``server`` until it exits; its exit status."""
    import asyncio
    import threading

    from tandem.web import gate

    async def run() -> int:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future = loop.create_future()

        def wait() -> None:  # a daemon thread: Ctrl-C is never held up waiting on it
            code = server.wait()
            with contextlib.suppress(RuntimeError):  # the loop is gone already
                loop.call_soon_threadsafe(lambda: None if exited.done() else exited.set_result(code))

        threading.Thread(target=wait, daemon=True).start()
        await gate.serve(listener, upstream, exited)
        return exited.result()

    return asyncio.run(run())


@click.command("report")
@click.argument("runs", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("tandem-report.png"),
    show_default=True,
    help="FILE.png, .pdf or .svg (a figure) or FILE.html (figure and table).",
)
@click.option(
    "-m",
    "--metric",
    "metrics",
    multiple=True,
    metavar="KEY",
    help="Plot this metric (a full key or a regex; repeatable) instead of the default panels; "
    "for group:G, also the metric columns of its table [default: every metric the jobs logged].",
)
@click.option(
    "--best",
    metavar="KEY:min|max",
    help="For group:G: mark the job with the lowest (min) or highest (max) last KEY.",
)
@click.option(
    "--store",
    "store_uri",
    metavar="URI",
    help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db].",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the runs' summaries and each group's sweep report as JSON (a figure only with -o).",
)
@click.pass_context
def report(
    ctx: click.Context,
    runs: tuple[str, ...],
    output: Path,
    metrics: tuple[str, ...],
    best: str | None,
    store_uri: str | None,
    as_json: bool,
) -> None:
    """Plot RUNS over time (collocated groups side by side) and print their summaries.

    A RUN is an MLflow run id, a run name, group:NAME (every run with that group tag),
    job:ID (a submitted job's runs) or the directory of a run kept with --sink csv|parquet.
    Without --store, runs are looked up in $MLFLOW_TRACKING_URI or ./mlflow.db and in the
    job manager's store: a group's or a job's runs are gathered from both.

    For a group of the job manager (a sweep), a table follows: a row per job with its
    parameters, state, run time, CPU-seconds, energy and the last value of each metric it
    logged; the producers that fed it; the group's totals with them; and what sharing saved
    against each job loading for itself (measured, or estimated and said so).
    """
    require("report", "matplotlib")  # every output format is drawn
    from rich.console import Console

    from tandem.cli._group_report import print_sweep, sweep_html, sweep_reports
    from tandem.place import ReportError, parse_best
    from tandem.watch.report import (
        DEFAULT_PANELS,
        RunNotFound,
        load_runs,
        panels_for,
        plot,
        summary_rich,
        write_html,
    )

    if output.suffix.lower() not in (".png", ".pdf", ".svg", ".html"):
        raise click.BadParameter(f"{output}: use a .png, .pdf, .svg or .html file", param_hint="'-o'")
    try:
        parse_best(best)
    except ReportError as exc:
        raise click.BadParameter(str(exc), param_hint="'--best'") from None
    panels = panels_for(metrics) if metrics else DEFAULT_PANELS
    sweeps = sweep_reports(runs, metrics, best)
    if best and not sweeps:
        raise click.BadParameter("applies to group:G, a group of the job manager", param_hint="'--best'")
    stores = [store_uri] if store_uri else _stores()
    try:
        loaded = load_runs(runs, stores[0], also=stores[1:])
    except RunNotFound as exc:
        if not sweeps or len(runs) > len(sweeps):  # a group's jobs untracked: its table stands alone
            click.echo(f"tandem report: {exc}", err=True)
            sys.exit(2)
        loaded = []
    drawn = bool(loaded) and (not as_json or ctx.get_parameter_source("output") != ParameterSource.DEFAULT)
    try:
        if drawn and output.suffix.lower() == ".html":
            write_html(loaded, output, panels, "".join(sweep_html(s) for s in sweeps))
        elif drawn:
            plot(loaded, output, panels)
    except ValueError as exc:
        if not sweeps:
            raise click.ClickException(str(exc)) from None
        # A group's jobs just ended: their tracked metrics reach their runs as the manager's
        # MLflow helper writes them, a moment later. The tables stand; the figure waits.
        click.echo(
            f"tandem report: no figure yet: {exc} (the manager writes each job's metrics to its "
            "run as it ends: run it again in a few seconds)",
            err=True,
        )
        drawn = False
    if as_json:
        summaries = [
            {"run_id": r.run_id, "name": r.name, "group": r.group, "status": r.status, "summary": r.summary}
            for r in loaded
        ]
        from tandem.place import strict_json  # a NaN metric is null: strict JSON

        click.echo(strict_json({"runs": summaries, "groups": sweeps}, indent=2))
    else:
        # Piped or redirected: no terminal width to wrap to, so keep each row on one line.
        console = Console(width=None if sys.stdout.isatty() else 240)
        if loaded:
            console.print(summary_rich(loaded))
        for sweep in sweeps:
            print_sweep(sweep, console)
    if drawn:
        click.echo(f"wrote {output}", err=True)


COMMANDS = [run_cmd, ui, report]


def _stores() -> list[str]:
    """Where ``tandem report`` looks without --store: ``$MLFLOW_TRACKING_URI`` or
    ``./mlflow.db`` first, then the job manager's store (where its submitted jobs' runs are,
    whatever the working directory holds): under the host's system manager, this user's there."""
    from tandem.dirs import state_dir, state_dir_path
    from tandem.watch.stores import default_store_uri
    from tandem.watch.stores.base import absolute_uri

    stores = [absolute_uri(default_store_uri())]
    from tandem.place import system_manager, system_user_store

    if system_manager() is not None:  # the host's manager's jobs: in a store of theirs (root's: its own)
        mine = system_user_store(os.getuid())
        return stores if mine in stores else [*stores, mine]
    if os.path.lexists(state_dir_path()):  # none made here; one it may not use is refused
        from tandem.place import manager_store

        manager = manager_store(state_dir())
        if manager not in stores:
            stores.append(manager)
    return stores
