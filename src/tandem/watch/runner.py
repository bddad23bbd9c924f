"""Track a command: ``start()`` it with its run, ``wait()`` for it; ``tandem run -- COMMAND...``.

:func:`start` launches the command and its tracking and returns at once with a
:class:`TrackedCommand` handle (its ``pid`` and ``run``); :meth:`TrackedCommand.wait` waits
for the command, stores the run and returns the exit code. Neither touches the process's
signal handlers, so one process (a job manager) can start several tracked commands and wait
on each separately. ``tandem run`` (in ``tandem.cli``) is: start, forward signals
(:class:`SignalForwarder`, for a command-line entry point only), wait.

The command's stdout and stderr are passed through as they come and also written to
``output.log``, stored with the run. Signals, under ``tandem run``: Ctrl-C in a terminal
already reaches the command (it is in the same foreground process group), so while the
wrapper is in a terminal's foreground it does not send SIGINT a second time; otherwise (no
terminal, in the background, under a scheduler) SIGINT is forwarded. SIGTERM, SIGHUP,
SIGQUIT, SIGUSR1 and SIGUSR2 are always forwarded. Once the command has ended they are
ignored until the run is stored (at most a couple of minutes for a slow store), so the
record is not cut short. The exit code is the command's (128 + N if a signal N ended it, as
shells do); 127 if the command does not exist, 126 if it cannot be executed.

One run per command: with an MLflow store, the run is created before the command starts,
and the command gets ``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID`` and ``MLFLOW_EXPERIMENT_NAME``
of it (:func:`~tandem.watch.stores.base.run_env`), so that ``mlflow.log_metric``,
``mlflow.start_run()``, Lightning's ``MLFlowLogger(run_id=...)`` and Hugging Face's
``MLflowCallback`` in it write to that same run. The command may end the run itself
(``mlflow.end_run()`` at its exit marks it FINISHED); the status stored last is the one
tandem sets from the exit code, once the command has ended. Where the run is not in MLflow
(a file store, MLflow unreachable), none of these is set.

The exact CPU time of the tree comes from the kernel when the command is reaped
(``wait4``: the command and every descendant it waited for), so a child that lived and died
between two samples is still counted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from tandem.watch.samplers.energy import watts_per_core
from tandem.watch.stores import RunStore
from tandem.watch.tracker import Run

RUN_OPEN_S = 120.0  # how long a command waits for its MLflow run to be created (a slow server)


class CommandNotFound(Exception):
    exit_code = 127


class CommandNotExecutable(Exception):
    exit_code = 126


def resolve(argv: Sequence[str]) -> str:
    """The executable ``argv[0]`` names, or a clear error (exit codes 127 and 126)."""
    if not argv:
        raise CommandNotFound("no command given: tandem run [OPTIONS] -- COMMAND [ARGS]...")
    cmd = argv[0]
    if os.sep in cmd:
        if not os.path.exists(cmd):
            raise CommandNotFound(f"{cmd}: no such file")
        if os.path.isdir(cmd) or not os.access(cmd, os.X_OK):
            raise CommandNotExecutable(f"{cmd}: not an executable file")
        return cmd
    found = shutil.which(cmd)
    if found is None:
        raise CommandNotFound(f"{cmd}: command not found (not on PATH)")
    return found


def _pump(src: BinaryIO, dest: BinaryIO, log: BinaryIO, lock: threading.Lock) -> None:
    """Copy the command's output to ours and to the log until it ends. Keep draining even
    when our side fails (a closed pipe, a hung-up terminal): a full pipe would stall the command."""
    fd = src.fileno()
    to_dest, to_log = True, True
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            if to_dest:
                try:
                    dest.write(chunk)
                    dest.flush()
                except (OSError, ValueError):
                    to_dest = False
            if to_log:
                with lock:
                    try:
                        log.write(chunk)
                        log.flush()
                    except (OSError, ValueError):
                        to_log = False  # the log was closed: only a grandchild is still writing
    finally:
        src.close()


def _in_terminal_foreground() -> bool:
    """True if a Ctrl-C from our terminal reaches our whole process group (and the command)."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            continue
    return False


class TrackedCommand:
    """A command started by :func:`start`, with its run: ``pid``, ``run``, ``wait()``."""

    def __init__(
        self, proc: subprocess.Popen, run: Run, workdir: Path, pumps: list[threading.Thread], log: BinaryIO
    ) -> None:
        self.pid = proc.pid
        self.run = run
        self.exit_code: int | None = None  # once waited for: what ``tandem run`` exits with
        self.signalled = False  # a signal was sent to it through :meth:`send_signal`
        self._proc = proc
        self._workdir = workdir
        self._pumps = pumps
        self._log = log
        self._reaped = False

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the command, unless it has ended (its pid may be reused)."""
        if self._reaped:
            return
        self.signalled = True
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    @property
    def reaped(self) -> bool:
        return self._reaped

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to end, store the run, return the exit code ``tandem run``
        exits with. With ``timeout``: ``TimeoutError`` if it is still running then (call
        again later); an exception other than that stops the command and fails the run."""
        if self.exit_code is not None:
            return self.exit_code
        try:
            usage = self._reap(timeout)
        except TimeoutError:
            raise
        except BaseException:
            self._abandon()
            raise
        try:
            for t in self._pumps:
                t.join(5)  # a detached grandchild that keeps the output open is not waited for
            self._log.close()
            code = self._proc.returncode
            status = "FINISHED" if code == 0 else ("KILLED" if code < 0 or self.signalled else "FAILED")
            self.run.log_artifact(self._workdir / "output.log")
            self.run.stop(
                status, tags={"tandem.exit_code": str(code)}, final_cpu=(usage.ru_utime, usage.ru_stime)
            )
            self.exit_code = code if code >= 0 else 128 - code
            return self.exit_code
        finally:
            self.run.stop("FAILED")  # does nothing if the run ended above
            shutil.rmtree(self._workdir, ignore_errors=True)

    def _reap(self, timeout: float | None) -> Any:
        # wait4 (retried by Python after each signal handler runs) gives the kernel's CPU
        # totals for the command and the descendants it reaped.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pid, wait_status, usage = os.wait4(self.pid, 0 if deadline is None else os.WNOHANG)
            if pid == self.pid:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"command {self.pid} still running after {timeout} s")
            time.sleep(0.05)
        self._reaped = True
        self._proc.returncode = os.waitstatus_to_exitcode(wait_status)
        return usage

    def _abandon(self) -> None:
        """Leaving abnormally (an exception in ``wait``): do not leave the command behind."""
        if not self._reaped:
            self._proc.kill()
            self._proc.wait(60)  # SIGKILL: at once, unless the kernel is stuck on its I/O
            self._reaped = True
        self._log.close()
        self.run.stop("FAILED")
        shutil.rmtree(self._workdir, ignore_errors=True)


def start(
    argv: Sequence[str],
    name: str | None = None,
    experiment: str = "tandem",
    tags: Mapping[str, Any] | None = None,
    interval: float = 1.0,
    store: RunStore | None = None,
    quiet: bool = False,
    env: Mapping[str, str] | None = None,
    fallback_dir: str | Path = "tandem-runs",
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    open_timeout: float = RUN_OPEN_S,
    mlflow_env: bool = True,
) -> TrackedCommand:
    """Start ``argv`` and its tracking; return once it runs. Its output goes to ``stdout`` and
    ``stderr`` (default: this process's) and to ``output.log``. Raises
    :class:`CommandNotFound` or :class:`CommandNotExecutable` (checked before any run is made).

    With an MLflow store the run is created first (MLflow's import, in the writer helper:
    a few seconds; at most ``open_timeout``), so that the command is told its id (see the
    module docstring); ``mlflow_env=False`` starts the command at once, told nothing."""
    resolve(argv)  # fail before creating a run for a command that cannot start
    watts_per_core()  # a bad TANDEM_WATTS_PER_CORE is a usage error, before anything starts
    child_env = dict(os.environ if env is None else env)
    # Pipes make Python buffer its output in blocks: ask for it to flow as it is printed.
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    run_tags = {"tandem.command": " ".join(argv)[:5000], **(tags or {})}
    run = Run(
        pid=None,
        name=name or Path(argv[0]).name,
        experiment=experiment,
        tags=run_tags,
        interval=interval,
        store=store,
        quiet=quiet,
        env=child_env,
        fallback_dir=fallback_dir,
        cpu_since_start=True,  # the command was just started: count all of its CPU time
    )
    try:
        # The run exists before the command: it is told its id.
        ids = run.child_env(open_timeout) if mlflow_env else {}
    except BaseException:
        run.stop("FAILED")
        raise
    if ids:
        child_env.pop("MLFLOW_EXPERIMENT_ID", None)  # it would contradict the run's experiment
        child_env.update(ids)
    elif mlflow_env and run.recorder is not None and not run.recorder.wait_open(0):
        print(
            f"tandem: warning: the MLflow run was not open after {open_timeout:g} s; the command "
            "starts without MLFLOW_RUN_ID (what it logs to MLflow itself goes to a run of its own)",
            file=sys.stderr,
            flush=True,
        )
    workdir = Path(tempfile.mkdtemp(prefix="tandem-run-"))
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env)
    except FileNotFoundError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        run.stop("FAILED")
        raise CommandNotFound(f"{argv[0]}: {exc.strerror}") from None
    except OSError as exc:  # permission, a script without #!, a binary for another machine
        shutil.rmtree(workdir, ignore_errors=True)
        run.stop("FAILED")
        raise CommandNotExecutable(f"{argv[0]}: {exc.strerror}") from None
    run.pid = proc.pid
    log = (workdir / "output.log").open("wb")
    lock = threading.Lock()
    pumps = [
        threading.Thread(
            target=_pump, args=(proc.stdout, stdout or sys.stdout.buffer, log, lock), daemon=True
        ),
        threading.Thread(
            target=_pump, args=(proc.stderr, stderr or sys.stderr.buffer, log, lock), daemon=True
        ),
    ]
    for t in pumps:
        t.start()
    cmd = TrackedCommand(proc, run, workdir, pumps, log)
    try:
        run.start()
    except BaseException:
        cmd._abandon()
        raise
    return cmd


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class SignalForwarder:
    """For a command-line entry point that tracks one command (``tandem run``): while in the
    ``with`` block, the signals that would stop this process go to the command instead (see
    the module docstring for the terminal rule), and once it has ended they are ignored
    until the block ends (the run is stored). Process-wide, so from the main thread only, as
    Python requires.

    Enter it before :func:`start` and :meth:`attach` the command after: a signal that comes
    while the command and its tracking start is held and sent to it once attached.
    """

    def __init__(self) -> None:
        self._cmd: TrackedCommand | None = None
        self._pending: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalForwarder:
        self._previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def attach(self, cmd: TrackedCommand) -> None:
        self._cmd = cmd
        pending, self._pending = self._pending, []
        for signum in pending:
            cmd.send_signal(signum)  # it came before the command existed: a terminal's did not reach it

    def _on_signal(self, signum: int, _frame: Any) -> None:
        cmd = self._cmd
        if cmd is None:
            self._pending.append(signum)
        elif signum == signal.SIGINT and _in_terminal_foreground() and not cmd.reaped:
            cmd.signalled = True  # the terminal sent it to the command too
        else:
            cmd.send_signal(signum)  # ignored once the command has ended
