"""``tandem run -- COMMAND...``: start a command, track its process tree, keep its output.

The command's stdout and stderr are passed through as they come and also written to
``output.log``, stored with the run. Signals: Ctrl-C in a terminal already reaches the
command (it is in the same foreground process group), so while the wrapper is in a
terminal's foreground it does not send SIGINT a second time; otherwise (no terminal, in the
background, under a scheduler) SIGINT is forwarded. SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
SIGUSR2 are always forwarded. Once the command has ended they are ignored until the run is
stored (at most a couple of minutes for a slow store), so the record is not cut short.
The wrapper waits for the command to end and exits with its exit code (128 + N if a
signal N ended it, as shells do); 127 if the command does not exist, 126 if it cannot be
executed.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from tandem.watch.samplers.energy import watts_per_core
from tandem.watch.tracker import Run

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


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


def run_command(
    argv: Sequence[str],
    name: str | None = None,
    experiment: str = "tandem",
    tags: Mapping[str, Any] | None = None,
    interval: float = 1.0,
    store: Any = None,
    quiet: bool = False,
    env: Mapping[str, str] | None = None,
    fallback_dir: str | Path = "tandem-runs",
) -> int:
    """Run and track ``argv``; return the exit code ``tandem run`` should exit with."""
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
        writer="thread",
        cpu_since_start=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="tandem-run-"))
    log_path = workdir / "output.log"
    forwarded: list[int] = []
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env)
    except FileNotFoundError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise CommandNotFound(f"{argv[0]}: {exc.strerror}") from None
    except OSError as exc:  # permission, a script without #!, a binary for another machine
        shutil.rmtree(workdir, ignore_errors=True)
        raise CommandNotExecutable(f"{argv[0]}: {exc.strerror}") from None

    reaped = False

    def forward(signum: int, _frame: Any) -> None:
        if reaped:
            return  # the pid may belong to another process by now
        forwarded.append(signum)
        if signum == signal.SIGINT and _in_terminal_foreground():
            return  # the terminal sent it to the command too
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    run.pid = proc.pid
    lock = threading.Lock()
    status = "FAILED"
    try:
        with log_path.open("wb") as log:
            pumps = [
                threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, log, lock), daemon=True),
                threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, log, lock), daemon=True),
            ]
            for t in pumps:
                t.start()
            run.start()
            # wait4 (retried by Python after each signal handler runs) gives the kernel's
            # CPU totals for the command and the descendants it reaped.
            _, wait_status, usage = os.wait4(proc.pid, 0)
            reaped = True
            proc.returncode = os.waitstatus_to_exitcode(wait_status)
            for t in pumps:
                t.join(5)  # a detached grandchild that keeps the output open is not waited for
        code = proc.returncode
        status = "FINISHED" if code == 0 else ("KILLED" if code < 0 or forwarded else "FAILED")
        exit_code = code if code >= 0 else 128 - code
        run.log_artifact(log_path)
        run.stop(status, tags={"tandem.exit_code": str(code)}, final_cpu=(usage.ru_utime, usage.ru_stime))
        return exit_code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.returncode is None:  # we are leaving abnormally: do not leave the command behind
            proc.kill()
            proc.wait()
        run.stop("FAILED")  # does nothing if the run ended above or never started
        shutil.rmtree(workdir, ignore_errors=True)
