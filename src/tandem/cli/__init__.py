"""The ``tandem`` command line, one module per family of commands:

- ``share``: ``tandem share serve|ls|define|rm`` (:mod:`tandem.share`);
- ``watch``: ``tandem run|ui|report`` (:mod:`tandem.watch`);
- ``jobs``: ``tandem submit|ls|show|logs``, ``ending``: ``cancel|wait`` (:mod:`tandem.place`);
- ``daemon``: ``tandem daemon start|stop|status`` and ``tandem replay``;
- ``bench``: ``tandem demo`` and ``tandem bench share|io``;
- ``dashboard``: ``tandem dashboard`` (:mod:`tandem.web`);
- ``select``: ``tandem select run|ls|show|rm|report`` (:mod:`tandem.select`).

``_common`` holds what they share: exit codes, the extras check, the daemon's errors as
messages, the parsers of sizes and core counts. A family's module is imported only when
one of its commands runs (click's lazy group), and each command imports what it needs when
it runs, so that ``tandem run`` starts at once and ``tandem share ls`` needs no extra.
"""

from __future__ import annotations

import importlib
import logging
import os

import click

from tandem import __version__

# command name -> the module of its family
_FAMILIES = {
    "share": "share",
    "run": "watch",
    "ui": "watch",
    "report": "watch",
    "submit": "jobs",
    "ls": "jobs",
    "show": "jobs",
    "logs": "jobs",
    "cancel": "ending",
    "wait": "ending",
    "daemon": "daemon",
    "replay": "daemon",
    "demo": "bench",
    "bench": "bench",
    "dashboard": "dashboard",
    "select": "select",
}


class _LazyGroup(click.Group):
    """Imports a command's family module only when the command is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_FAMILIES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        family = _FAMILIES.get(cmd_name)
        if family is None:
            return None
        module = importlib.import_module(f"tandem.cli.{family}")
        return next(c for c in module.COMMANDS if c.name == cmd_name)

    def invoke(self, ctx: click.Context) -> object:
        # A state (or runtime) directory that may not be used, found by any command: its one line, exit 2
        # (never a traceback; nothing was written there).
        from tandem._ipc import RuntimeDirError
        from tandem.dirs import StateDirError

        try:
            return super().invoke(ctx)
        except (StateDirError, RuntimeDirError) as exc:
            from tandem.cli._common import EXIT_STATE_DIR, Exit

            raise Exit(str(exc), EXIT_STATE_DIR) from None


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="tandem")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """tandem: train more models on fewer resources on one server."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    _say_cluster_trouble()
    _say_which_manager(click.get_current_context().invoked_subcommand)


# The commands the host's system manager serves, where one runs, instead of the user's own daemon.
_SERVED = ("submit", "ls", "show", "logs", "wait", "cancel", "report", "dashboard")


def _say_which_manager(command: str | None) -> None:
    """Where both the host's system manager and the user's own daemon run, a command they serve
    says which one it used (the host's), on stderr; a job's own commands say nothing."""
    if command not in _SERVED or os.environ.get("TANDEM_JOB_ID"):
        return
    from tandem.dirs import state_dir_path
    from tandem.place import own_daemon_too

    try:
        own = own_daemon_too(state_dir_path())
    except Exception:  # noqa: BLE001 - the command itself says what is wrong, if anything
        return
    if own is not None:
        click.echo(
            f"tandem: the host's system manager serves this command; your own daemon of "
            f"{state_dir_path()} also runs, and serves none while it does (tandem daemon stop "
            "--own stops it)",
            err=True,
        )


def _say_cluster_trouble() -> None:
    """Every command says it while the daemon's Ray cluster does not answer (its head lost):
    the jobs there are not followed."""
    from tandem.dirs import state_dir_path
    from tandem.place import cluster_trouble

    try:
        said = cluster_trouble(state_dir_path())
    except Exception:  # no home, say: the command itself says what is wrong, if anything
        return
    if said:
        click.echo(f"warning: {said}", err=True)


__all__ = ["main"]
