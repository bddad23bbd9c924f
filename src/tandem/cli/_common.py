"""What the command families share: the extras check, exit codes, errors that carry their
own exit code, the daemon's errors as messages, and the value parsers of shared options."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # the state is imported when a command needs it: tandem --help stays light
    from tandem.place import StateReader

# Exit codes: one table for every command (docs/concepts/place-reliability.md), applied here: by
# daemon_call (the daemon's answers), by the command group (a state or runtime directory that
# may not be used) and by the commands through these names. `tandem wait` of one job that
# failed exits with the job's own code; these are tandem's own answers.
EXIT_FAILED = 1  # a job failed (or several did not all succeed); any other error
EXIT_USAGE = 2  # bad input, or a job refused because it can never fit
EXIT_UNKNOWN_JOB = 2  # no such job (show, logs, wait, cancel alike): bad input
EXIT_STATE_DIR = 2  # the state directory may not be used (shared, another user's, a link)
EXIT_NO_DAEMON = 3  # no daemon serves the state directory
EXIT_CANCELLED = 4  # the job was cancelled
EXIT_NO_ANSWER = 69  # the daemon did not answer in time (EX_UNAVAILABLE)
EXIT_DISK_FULL = 75  # the state's disk would not take the write: nothing was done, try again (EX_TEMPFAIL)
EXIT_TIMEOUT = 124  # tandem wait --timeout ran out
# tandem wait's own failure (no such job, bad input, no daemon), apart from any code a job
# exits with, which wait passes on (as docker run's 125 is apart from its container's codes).
EXIT_WAIT_ERROR = 125
EXIT_INTERRUPTED = 130  # Ctrl-C

# The extra each command needs ([bench] includes [watch]); pyproject.toml lists what each brings.
_EXTRA_OF_COMMAND = {"run": "watch", "ui": "watch", "report": "watch", "demo": "bench", "bench": "bench"}
_EXTRA_OF_COMMAND["dashboard"] = "web"


def require(command: str, *modules: str) -> None:
    """Fail at once, naming the extra to install, if a module ``command`` needs is missing
    (before any work, and before a lookup could fail for another reason)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            extra = _EXTRA_OF_COMMAND[command]
            raise click.ClickException(
                f"`tandem {command}` needs {module!r}, which is not installed; it comes with the "
                f"{extra!r} extra: pip install 'tandem[{extra}]'"
            )


class Exit(click.ClickException):
    """An error message with its own exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code  # type: ignore[misc]  # click reads it from the instance; types say ClassVar


def daemon_call(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` with the job manager client's errors as messages and exit codes."""
    from tandem.place import DaemonDiskFull, DaemonError, DaemonNotRunning, DaemonRefused, DaemonTimeout

    try:
        return call(*args, **kwargs)
    except DaemonDiskFull as exc:
        raise Exit(str(exc), EXIT_DISK_FULL) from None
    except DaemonTimeout as exc:
        raise Exit(str(exc), EXIT_NO_ANSWER) from None
    except DaemonNotRunning as exc:
        raise Exit(f"{exc}; start one with `tandem daemon start`", EXIT_NO_DAEMON) from None
    except DaemonRefused as exc:
        raise Exit(str(exc), EXIT_USAGE) from None
    except DaemonError as exc:
        raise click.ClickException(str(exc)) from None


def open_state() -> StateReader:
    """The job manager's state, read-only (:class:`tandem.place.reads.StateReader`: it
    makes, migrates and moves nothing), or a clear error. Where the host's system manager
    runs, its state as it lets this user see it (:class:`tandem.place.RemoteState`)."""
    from tandem.place import RemoteState, StateError, StateReader, state_dir, system_manager

    system = system_manager()
    if system is not None:
        return RemoteState(system)  # type: ignore[return-value]  # the reads the commands make

    directory = state_dir()  # one that may not be used: the command group's exit 2
    try:
        return StateReader(directory)
    except StateError as exc:  # its file cannot be read (corrupt, newer, lost): an error of its own
        raise click.ClickException(str(exc)) from None


def request(message: Any, timeout: float = 10.0) -> Any:
    """One request to the daemon of this state directory: its reply record
    (:mod:`tandem.place.protocol`)."""
    from tandem.place import request as send
    from tandem.place import state_dir

    return daemon_call(send, state_dir(), message, timeout=timeout)


# --- value parsers (click callbacks) ------------------------------------------------------


def to_size(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    from tandem.place import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def to_gpu_mem(_ctx: click.Context, _param: click.Parameter, value: str) -> int | None:
    from tandem.place import parse_gpu_mem

    try:
        return parse_gpu_mem(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def to_job_cpus(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    from tandem.place import parse_job_cpus

    try:
        return parse_job_cpus(value)
    except ValueError as exc:
        raise click.BadParameter(f"{exc}, or auto") from None


def to_cpus(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    from tandem.place import parse_cpus

    if value is None:
        return None
    try:
        return parse_cpus(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def job_ids(values: tuple[str, ...], what: str) -> list[int]:
    """``3 4,5`` -> [3, 4, 5]; a usage error naming the bad one otherwise."""
    ids = []
    for raw in values:
        for part in raw.split(","):
            if not part.strip().isdigit() or len(part.strip()) > 18:
                raise click.BadParameter(
                    f"{part!r} is not a job id (a number, as `tandem ls` shows)", param_hint=what
                )
            ids.append(int(part))
    return ids


def printable(text: str | None, keep: str = "") -> str:
    """``text`` with control characters (escape sequences in a job's name, say) shown, not
    sent to the terminal (``keep``: those let through, a log's tabs)."""
    if text is None:
        return "-"
    if text.isprintable():  # nearly always: no character by character
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def unknown_job(job_id: int) -> Exit:
    """The error of a job id that names no job: the same words and code for every command."""
    return Exit(f"no job {job_id} (see tandem ls --all)", EXIT_UNKNOWN_JOB)
