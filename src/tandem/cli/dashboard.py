"""``tandem dashboard``: the live web page of this user's jobs (:mod:`tandem.web`)."""

from __future__ import annotations

import sys

import click

from tandem.cli._common import EXIT_INTERRUPTED, require


@click.command("dashboard")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0: any free port."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to listen on. Another than loopback lets other machines reach it (with a login).",
)
@click.option("--no-open", is_flag=True, help="Do not open a browser; only print where the login page is.")
@click.option(
    "--max-streams",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Live event streams open at most (pages, scripts); past it the oldest is closed.",
)
def dashboard(port: int, host: str, no_open: bool, max_streams: int) -> None:
    """Serve a live dashboard of the jobs in $TANDEM_STATE_DIR: the queue and why each job
    waits, each GPU's timeline, jobs with their logs and metrics, share groups, energy.
    Opens a browser on its login page (a 0600 file of yours holding a one-time code; its path
    is printed) and prints its URL; works with or without a running daemon."""
    require("dashboard", "starlette", "uvicorn")
    from tandem.place import state_dir
    from tandem.web.server import binds_loopback_only, serve

    if not binds_loopback_only(host):
        click.echo(
            f"warning: listening on {host}: anyone who can reach it and has a login sees your jobs "
            "and can cancel them (the traffic is not encrypted; prefer an SSH tunnel to 127.0.0.1)",
            err=True,
        )
    try:
        serve(state_dir(), host, port, open_browser=not no_open, max_streams=max_streams)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


COMMANDS = [dashboard]
