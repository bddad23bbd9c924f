"""Whether a job's program is there: found at submit, not a minute later when it runs.

A mistyped program (``python trian.py``, ``pyhton train.py``) used to queue, wait its turn,
start a supervisor and fail with exit 2. The request handler asks :func:`missing_program`
of every job it queues, as the job would run: its first word looked up on the job's own
``PATH`` (as ``subprocess`` does with the job's environment) or, given with a ``/``, from its
working directory; and where that program is a Python interpreter or a shell, the script
it is given, from the same directory. Only what can be known without running anything is
checked: a script that exists but fails is the job's own failure."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# The interpreters whose first argument that is not an option is a script file: the options
# of each that take a value (``python -W error train.py``: ``error`` is not the script) and
# the short flags after which no script file follows (``-c CODE``, ``-m MODULE``, ``sh -s``;
# alone or among others: ``sh -ec '...'``), ``-`` being stdin.
_PYTHON = (frozenset({"-W", "-X", "-Q"}), "cm")
_SHELL = (frozenset({"-o", "+o", "-O", "+O"}), "cs")


def _interpreter(program: str) -> tuple[frozenset[str], str] | None:
    base = os.path.basename(program)
    version = base.removeprefix("python").removeprefix("pypy")
    if base != version and (not version or version.replace(".", "").isdigit()):
        return _PYTHON  # python, python3, python3.11, pypy3
    return _SHELL if base in ("sh", "bash", "dash", "zsh", "ksh") else None


def _script(args: list[str], valued: frozenset[str], no_script: str) -> str | None:
    """The script file an interpreter is given in ``args`` (its arguments), if any."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "-":
            return None
        elif arg in valued:
            skip = True
        elif arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) & set(no_script):
            return None
        elif not arg.startswith(("-", "+")):
            return arg
    return None


def missing_program(command: list[str], cwd: str, env: dict[str, str]) -> str | None:
    """Why ``command`` cannot run from ``cwd`` with ``env``, in words that say what to fix;
    None where its program (and the script given to its interpreter) is there."""
    if not command:
        return None
    program, where = command[0], Path(cwd)
    if "/" in program:
        path = where / program
        if not path.is_file():
            return f"no program {program!r} in {cwd} (the job's directory): check its path"
        if not os.access(path, os.X_OK):
            return f"{program!r} is not executable: chmod +x {program}, or run it with its interpreter"
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        return (
            f"no program {program!r} on the job's PATH: check its spelling, or give its path "
            f"(the job runs with the PATH tandem submit was given)"
        )
    interpreter = _interpreter(program)
    script = None if interpreter is None else _script(command[1:], *interpreter)
    if script is not None and not (where / script).exists():
        return f"no script {script!r} in {cwd} (the job's directory): check its name and path"
    return None
