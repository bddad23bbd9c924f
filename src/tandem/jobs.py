"""The job manager from Python: submit jobs, and handle them as futures.

::

    import tandem.jobs

    job = tandem.jobs.submit(["python", "train.py", "--lr", "0.1"], share="imagenet", group="lr")
    job.wait()                      # or job.state, job.refresh(), job.logs(), job.cancel()
    job.metrics()                   # its MLflow run's latest values: {"val_loss": 0.31, ...}

    def objective(lr):              # any picklable callable (module-level, or cloudpickle's)
        ...
        return val_loss

    job = tandem.jobs.call(objective, 0.1, cpus=1, share="imagenet")
    job.result()                    # its return value, or its exception with the job's traceback

A daemon is started where none runs, as ``tandem submit`` does. Jobs go to the state
directory of this user (``tandem.dirs``), or ``state_dir_path=``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tandem._safepath import module_command
from tandem.place import (
    FINAL_STATES,
    Cancel,
    JobSpec,
    RemoteState,
    StateReader,
    param_value,
    parse_gpu_mem,
    parse_job_cpus,
    parse_mem,
    private_dir,
    state_dir,
    system_manager,
)
from tandem.place import request as send_request
from tandem.place import submit as send
from tandem.place import submit_many as send_many

__all__ = ["Job", "JobFailed", "call", "job", "submit", "submit_many"]

_POLL_S = 0.3
# The job's options, named and defaulted as ``tandem submit``'s flags: JobSpec's fields,
# declared there once (what the CLI and the daemon take too). ``call`` keeps these names for
# the job; every other keyword argument goes to the callable.
JOB_OPTIONS = tuple(f.name for f in dataclasses.fields(JobSpec) if f.name not in ("command", "cwd", "token"))


class JobFailed(RuntimeError):
    """The job did not succeed; for :func:`call`, the callable's exception and traceback."""


class Job:
    """A handle on one job, like a future: ``state``, ``wait()``, ``result()``, ``cancel()``."""

    def __init__(self, job_id: int, directory: Path, call_dir: Path | None = None):
        self.id = job_id
        self._dir = directory
        self._call_dir = call_dir
        self._record: Any = None

    def __repr__(self) -> str:
        return f"Job({self.id}, {self.state!r})"

    def _reader(self) -> Any:
        """The state as this user reads it: through the host's system manager where one runs
        (its file is root's), else the state directory's file."""
        system = system_manager()
        return RemoteState(system) if system is not None else StateReader(self._dir)

    def refresh(self) -> Job:
        """Read the job's record again (``state`` does, too)."""
        with self._reader() as reader:
            return self._read(reader)

    def _read(self, reader: StateReader) -> Job:
        record = reader.job(self.id)
        if record is None:
            raise KeyError(f"job {self.id} is not in {self._dir} (moved aside, or another state directory)")
        self._record = record
        return self

    @property
    def record(self) -> Any:
        """The job's stored record (:class:`tandem.place.state.Job`), as last read."""
        return self._record if self._record is not None else self.refresh()._record

    @property
    def state(self) -> str:
        """``queued``, ``running``, ``retrying``, ``succeeded``, ``failed``, ``oom`` or ``cancelled``."""
        return self.refresh()._record.state

    def done(self) -> bool:
        return self.state in FINAL_STATES

    def wait(self, timeout: float | None = None) -> str:
        """Block until the job ends; its final state. ``TimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._reader() as reader:  # one reader for the whole wait, as state's
            while True:
                state = self._read(reader)._record.state
                if state in FINAL_STATES:
                    return state
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {self.id} is still {state} after {timeout:g} s")
                time.sleep(_POLL_S)

    def cancel(self) -> bool:
        """Cancel it (a running job's process tree is stopped); False if it had ended."""
        reply = send_request(self._dir, Cancel([self.id]))
        return self.id in reply.cancelled

    def logs(self) -> str:
        """Its output so far, every attempt in order (the part rotated away first)."""
        from tandem.place import log_looks

        seen: dict[int, tuple[int, int]] = {}
        written: dict[int, bytearray] = {}
        with self._reader() as st:  # or the host's manager, which reads it for its owner
            for parts in log_looks(st.log_parts, self.id, seen):
                for part in parts:
                    written.setdefault(part.n, bytearray()).extend((part.older or b"") + part.data)
                    seen[part.n] = (part.inode, part.end)
        return "".join(data.decode(errors="replace") for _, data in sorted(written.items()))

    def metrics(self) -> dict[str, float]:
        """The latest value of each metric of its last attempt's MLflow run (the job's own
        ``mlflow.log_metric`` calls land there, and tandem's ``system/*``, ``summary/*``)."""
        with self._reader() as reader:
            attempts = reader.attempts(self.id)
        run_id = next((a.mlflow_run_id for a in reversed(attempts) if a.mlflow_run_id), None)
        if run_id is None:
            return {}
        from mlflow.tracking import MlflowClient

        from tandem.dirs import mlflow_store_uri

        return dict(MlflowClient(mlflow_store_uri(self._dir)).get_run(run_id).data.metrics)

    def result(self, timeout: float | None = None) -> Any:
        """For a job of :func:`call`: wait, then its return value, or :class:`JobFailed`
        with the callable's exception and the job's traceback."""
        if self._call_dir is None:
            raise TypeError(f"job {self.id} runs a command, not a Python callable: use wait() and state")
        state = self.wait(timeout)
        outcome = self._call_dir / "result.pkl"
        if outcome.is_file():
            ok, value, trace = pickle.loads(outcome.read_bytes())
            if ok:
                return value
            raise JobFailed(f"job {self.id} raised {value!r}; its traceback:\n{trace}") from value
        cause = self.record.cause or state
        raise JobFailed(f"job {self.id} {state} ({cause}) before its callable returned; see job.logs()")


def _params(given: dict[str, Any]) -> dict[str, Any]:
    """A job's params as given (JSON values; their text, in the command, MLflow and every
    listing, is :func:`tandem.place.model.param_value`'s: ``0.1``, ``true``), a numpy scalar
    as its Python number and a NaN or infinity as its text (``"NaN"``: JSON has no such number)."""
    params = {}
    for key, value in dict(given).items():
        if type(value).__module__ == "numpy" and hasattr(value, "item"):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = param_value(value)
        params[key] = value
    return params


def _spec(command: Sequence[str] | str, cwd: str | os.PathLike | None, options: dict[str, Any]) -> JobSpec:
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv:
        raise ValueError("the command is empty")
    unknown = set(options) - set(JOB_OPTIONS)
    if unknown:
        raise TypeError(
            f"unknown job option(s): {', '.join(sorted(unknown))}; the options: {', '.join(JOB_OPTIONS)}"
        )
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (options.pop("env", None) or {}).items()})
    # Values as tandem submit's flags take them: "auto" and sizes as text, or numbers.
    for name, parse in (("cpus", parse_job_cpus), ("mem", parse_mem), ("gpu_mem", parse_gpu_mem)):
        if name in options:
            options[name] = parse(options[name] if options[name] is not None else "auto")
    if "after" in options:
        options["after"] = [a.id if isinstance(a, Job) else int(a) for a in options["after"] or ()]
    if "params" in options:
        options["params"] = _params(options["params"] or {})
    spec = JobSpec(
        argv,
        str(Path(cwd).resolve() if cwd is not None else Path.cwd()),
        env,
        **{k: v for k, v in options.items() if v is not None},
    )
    problem = spec.problem()
    if problem:
        raise ValueError(problem)
    return spec


def submit(
    command: Sequence[str] | str,
    *,
    cwd: str | os.PathLike | None = None,
    state_dir_path: str | os.PathLike | None = None,
    **options: Any,
) -> Job:
    """Queue ``command`` (a list of arguments, or one string split as a shell would) as
    ``tandem submit`` does; options as its flags, with their defaults (:data:`JOB_OPTIONS`):
    ``cpus`` (``"auto"``, or cores), ``mem`` (``"auto"``, bytes or ``"4G"``), ``gpus``,
    ``gpu_mem`` (``"auto"``, bytes or ``"10G"``), ``gpu_share``, ``priority``, ``retries``
    (2), ``share``, ``group``, ``name``, ``after`` (jobs or ids), ``env``, ``params``. The
    job's handle."""
    # The one check of every entry (tandem.dirs): a shared, foreign or linked directory is
    # refused here, before a daemon is started for it or a log written in it.
    directory = state_dir() if state_dir_path is None else private_dir(Path(state_dir_path))
    reply = send(directory, _spec(command, cwd, options))
    return Job(reply.id, directory)


def submit_many(
    commands: Iterable[Sequence[str] | str],
    *,
    params: Iterable[dict[str, Any]] | None = None,
    **options: Any,
) -> list[Job]:
    """Queue several commands with the same options (``params``: one dict per command) in
    one request: all of them or none (a refused one is named). Their handles, in order."""
    commands = list(commands)
    per_job = list(params) if params is not None else [{} for _ in commands]
    if len(per_job) != len(commands):
        raise ValueError(f"{len(commands)} commands but {len(per_job)} params")
    if not commands:
        return []
    cwd = options.pop("cwd", None)
    state_dir_path = options.pop("state_dir_path", None)
    specs = [_spec(c, cwd, {**options, "params": p}) for c, p in zip(commands, per_job)]
    directory = state_dir() if state_dir_path is None else private_dir(Path(state_dir_path))
    reply = send_many(directory, specs)
    return [Job(job_id, directory) for job_id in reply.ids]


def call(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Job:
    """Run ``fn(*args, **kwargs)`` as a job; ``Job.result()`` is its value. Keyword
    arguments named as job options (:data:`JOB_OPTIONS`: those of :func:`submit`) are the
    job's; the others go to ``fn``. ``fn`` and its arguments are pickled (with cloudpickle where it is
    installed, so a notebook's functions work too) into the state directory."""
    options = {k: kwargs.pop(k) for k in JOB_OPTIONS if k in kwargs}
    directory = state_dir()
    call_dir = directory / "calls" / uuid.uuid4().hex
    call_dir.mkdir(parents=True, mode=0o700)
    try:
        import cloudpickle as pickler
    except ImportError:
        pickler = pickle  # type: ignore[assignment]
    try:
        payload = pickler.dumps((fn, args, kwargs))
    except Exception as exc:
        raise TypeError(
            f"cannot pickle {getattr(fn, '__qualname__', fn)!r} and its arguments for the job ({exc}); "
            "use a module-level function, or install cloudpickle"
        ) from None
    (call_dir / "call.pkl").write_bytes(payload)
    # Where this process finds its own modules (a function pickled by reference to one):
    # searched by the job after its own paths, never before them.
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    (call_dir / "paths.json").write_text(json.dumps([p for p in paths if os.path.isdir(p)]))
    options.setdefault("name", getattr(fn, "__qualname__", None))
    command = module_command("tandem._callee", str(call_dir))
    reply = send(directory, _spec(command, None, options))
    return Job(reply.id, directory, call_dir)


def job(job_id: int) -> Job:
    """The handle of an existing job."""
    return Job(job_id, state_dir()).refresh()
