"""Hardware tracking from the command line: ``tandem run``, ``tandem ui``, ``tandem report``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

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
@click.option("-e", "--experiment", default="tandem", show_default=True, help="MLflow experiment.")
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
@click.option("-q", "--quiet", is_flag=True, help="No summary table.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cmd(
    experiment: str,
    name: str | None,
    interval: float,
    tag_values: tuple[str, ...],
    group: str | None,
    sink: str,
    store_uri: str | None,
    out: Path,
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND and track its processes' hardware use and energy: tandem run [OPTIONS] -- COMMAND..."""
    tags = _parse_tags(tag_values, group)  # usage errors first, before the tracker's imports
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
    """Serve the MLflow UI for the tracked runs on 127.0.0.1 (this machine only)."""
    require("ui", "mlflow")
    from tandem.watch.stores import default_store_uri

    uri = store_uri or default_store_uri()
    click.echo(f"MLflow UI for {uri} at http://127.0.0.1:{port} (Ctrl-C to stop)", err=True)
    argv = [
        sys.executable,
        "-m",
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
    ]
    # MLflow's job runner (GenAI evaluation jobs; nothing a tracked run uses) keeps its queue
    # in a new /dev/shm/tmpXXXXXXXX directory per launch and never removes it.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    server = subprocess.Popen(argv, env=env)
    try:
        sys.exit(server.wait())
    except KeyboardInterrupt:  # the server got the terminal's SIGINT too: let it finish quietly
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        click.echo("tandem ui: stopped", err=True)
        sys.exit(EXIT_INTERRUPTED)


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
    help="Plot this metric (a full key or a regex; repeatable) instead of the default panels.",
)
@click.option(
    "--store",
    "store_uri",
    metavar="URI",
    help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db].",
)
def report(runs: tuple[str, ...], output: Path, metrics: tuple[str, ...], store_uri: str | None) -> None:
    """Plot RUNS over time (collocated groups side by side) and print their summaries.

    A RUN is an MLflow run id, a run name, group:NAME (every run with that group tag) or
    the directory of a run kept with --sink csv|parquet.
    """
    require("report", "matplotlib")  # every output format is drawn
    from rich.console import Console

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
    panels = panels_for(metrics) if metrics else DEFAULT_PANELS
    store_uri = store_uri or _find_store()
    try:
        loaded = load_runs(runs, store_uri)
    except RunNotFound as exc:
        click.echo(f"tandem report: {exc}", err=True)
        sys.exit(2)
    try:
        if output.suffix.lower() == ".html":
            write_html(loaded, output, panels)
        else:
            plot(loaded, output, panels)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    # Piped or redirected: no terminal width to wrap to, so keep each row on one line.
    Console(width=None if sys.stdout.isatty() else 240).print(summary_rich(loaded))
    click.echo(f"wrote {output}", err=True)


COMMANDS = [run_cmd, ui, report]


def _find_store() -> str | None:
    """With no --store and no $MLFLOW_TRACKING_URI: ./mlflow.db if there is one, else the job
    manager's store (its submitted jobs' runs), saying so; None leaves the default's error."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    from tandem.dirs import state_dir

    here, manager = Path("mlflow.db").resolve(), state_dir() / "mlflow.db"
    if here.is_file() or not manager.is_file():
        return None  # the default (./mlflow.db), or its error naming where it looked
    click.echo(f"tandem report: no ./mlflow.db here; reading the job manager's store {manager}", err=True)
    return f"sqlite:///{manager}"
