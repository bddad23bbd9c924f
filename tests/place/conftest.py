"""A private state and runtime directory per test, and a ``tandem`` CLI runner; daemons
started by a test are stopped (and their jobs cancelled) after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from tests.place.inproc import InProc
from tests.timing import scaled

if TYPE_CHECKING:
    from tandem.bench.ray_nodes import NodesCluster

TANDEM = [sys.executable, "-m", "tandem.cli"]
# Commands that serve, or run a program until it ends: run as a process of their own (the
# others run in the test's process, :meth:`Cli.here_is_enough`).
OWN_PROCESS = frozenset({"run", "ui", "dashboard", "demo", "bench", ("share", "serve"), ("select", "run")})


class Cli:
    def __init__(self, env: dict[str, str], state: Path, tmp: Path) -> None:
        self.env = env
        self.state = state
        self.tmp = tmp

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 60, process: bool = False
    ) -> subprocess.CompletedProcess:
        """``tandem ARGS`` in ``tmp`` with ``env``: in this process where the command only asks
        a serving daemon or reads the state (:meth:`here`), else (``process``, or a command
        that may start a daemon or serve) as its own interpreter."""
        if not process and self.here_is_enough(args):
            proc = self.here(args)
        else:
            proc = subprocess.run(
                [*TANDEM, *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=scaled(timeout),
                cwd=self.tmp,
            )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"tandem {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def here_is_enough(self, args: tuple[str, ...]) -> bool:
        """Whether ``tandem ARGS`` may run in this process: every command but those that serve
        or run a program until it ends (an interpreter a call costs about a tenth of a
        core-second, and the place tests make hundreds). A daemon such a call starts is this
        process's child: once it has ended it is a zombie until the next process this one starts
        reaps it, which tandem takes for ended (never alive)."""
        words = tuple(a for a in args if not a.startswith("-"))[:2]
        return bool(words) and words[0] not in OWN_PROCESS and words not in OWN_PROCESS

    def here(self, args: tuple[str, ...]) -> subprocess.CompletedProcess:
        """``tandem ARGS`` run by click in this process, with this runner's environment (all
        of it, nothing else) and working directory; its exit code, stdout and stderr as a
        process's. An exception the CLI lets out is raised here: the test fails on it (a user
        would have seen a traceback)."""
        from click.testing import CliRunner

        from tandem.cli import main

        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        os.environ.clear()
        os.environ.update(self.env)
        try:
            os.chdir(self.tmp)
            result = CliRunner().invoke(main, list(args), prog_name="tandem", catch_exceptions=False)
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
        return subprocess.CompletedProcess([*TANDEM, *args], result.exit_code, result.stdout, result.stderr)

    def json(self, *args: str) -> object:
        return json.loads(self(*args, "--json").stdout)

    def submit(self, *args: str) -> int:
        return int(self("submit", *args).stdout.strip())

    def job(self, job_id: int) -> dict:
        """What ``tandem show JOB --json`` says, read in this process through the same view
        (tests poll it: an interpreter per poll costs a third of a core-second); through the
        CLI where that read fails or finds no such job (the CLI's error is the test's)."""
        try:
            job = self._shown(job_id)
        except Exception:
            job = None
        return job if job is not None else self.json("show", str(job_id))  # type: ignore[return-value]

    def rows(self) -> list[dict]:
        """Every job row, oldest first, as ``tandem ls --all --json`` gives them, read in this
        process through the same view."""
        from tandem.place.views import job_json

        if not (self.state / "place.db").exists():
            return []
        return self._read(lambda reader: [job_json(j) for j in reader.jobs(attempts=True)])

    def _read(self, what: Callable[[Any], object]) -> Any:
        """``what(reader)`` on a read-only reader of the state, as a ``--json`` prints it."""
        from tandem.place.state import StateReader
        from tandem.place.views import strict_json

        reader = StateReader(self.state)
        try:
            return json.loads(strict_json(what(reader)))
        finally:
            reader.close()

    def wait_state(self, job_id: int, states: set[str], timeout: float = 30) -> dict:
        """Until job ``job_id``'s state is one of ``states``: then what ``tandem show --json``
        says. It reads the state file in this process, read-only and through the same view as
        ``show`` (no interpreter started for each poll); through the CLI where that read fails."""
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                job = self._shown(job_id)
            except Exception:  # lost, unreadable: the CLI says so (its error is the test's)
                job = self.job(job_id)
            if job is not None and job["state"] in states:
                return job
            if time.monotonic() > deadline:
                state = job["state"] if job is not None else None
                raise AssertionError(f"job {job_id} is {state}, not in {states}, after {timeout} s")
            time.sleep(0.05)

    def _shown(self, job_id: int) -> dict | None:
        """``tandem show JOB --json``'s object, read in this process (None: no such job)."""
        from tandem.place.views import job_json

        def shown(reader: Any) -> dict | None:
            job = reader.job(job_id)
            if job is None:
                return None
            data = job_json(job)
            share = reader.share(job.share) if job.share else None
            data["selection"] = share.selection if share is not None else None
            return data

        return self._read(shown)

    def status(self) -> dict:
        """What ``tandem daemon status --json`` says of a serving daemon, asked from this
        process (tests poll it: an interpreter a look costs a third of a core-second);
        through the CLI where the request fails (its error is the test's)."""
        import dataclasses

        from tandem.place import Status
        from tandem.place.client import DaemonError, request

        try:
            reply = request(self.state, Status())
        except DaemonError:
            return json.loads(self("daemon", "status", "--json").stdout)
        return {**dataclasses.asdict(reply), "running": True}

    def events(self, job_id: int) -> list[str]:
        """Job ``job_id``'s events as ``tandem show`` lists them (kind: text), read in this
        process."""
        return self._read(lambda reader: [f"{e['kind']}: {e['detail']}" for e in reader.events(job_id)])

    def stop_daemon(self) -> None:
        """Cancel the jobs still listed and stop the daemon, if one is running: the requests
        ``tandem cancel --all`` and ``tandem daemon stop`` send, sent from this process (every
        test with a daemon ends here: three interpreters cost about a core-second), then until
        its process has ended, as ``daemon stop`` waits; through the CLI where a request fails."""
        pid = self.daemon_pid()
        if pid is None:  # no daemon ever started here (no CLI to start to say so)
            return
        from tandem.place import Cancel, Stop
        from tandem.place.client import DaemonError, DaemonNotRunning, request

        try:
            # every waiting and running job, as `ls` lists them
            request(self.state, Cancel([], everything=True), timeout=scaled(40))
            request(self.state, Stop())
        except DaemonNotRunning:
            return
        except DaemonError:  # it answered wrongly, or not at all: what the CLI says is the teardown's
            if self("daemon", "status", check=False).returncode == 0:
                self("cancel", "--all", check=False)
                self("daemon", "stop", check=False)
            return
        try:
            daemon = psutil.Process(pid)
            daemon.wait(timeout=scaled(10))
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:  # as `daemon stop` does past its timeout
            daemon.terminate()

    def daemon_pid(self) -> int | None:
        try:
            return json.loads((self.state / "daemon.json").read_text())["pid"]
        except OSError:
            return None


def attempt_dir(state: Path, job_id: int | str, n: int = 1) -> Path:
    """The folder of job ``job_id``'s attempt ``n`` (``jobs/<id>/<n>.<random>``), made or not."""
    found = sorted((state / "jobs" / str(job_id)).glob(f"{n}.*"))
    assert len(found) <= 1, found
    return found[0] if found else state / "jobs" / str(job_id) / f"{n}.not-yet"


def _cli_in(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cli]:
    state = tmp_path / "state"
    runtime = Path(f"/tmp/tt-{os.getpid()}-{tmp_path.name[-12:]}")  # short: a Unix socket path
    env = dict(os.environ, TANDEM_STATE_DIR=str(state), TANDEM_RUNTIME_DIR=str(runtime))
    # Python jobs start warm only in the tests marked so (their files: sweeps, MLflow runs, a
    # share's producers, tests/place/test_warm.py): the fork server's imports ahead cost each
    # daemon about 3.4 CPU-s, paid back from a sweep's second trial but not by a test's one
    # or two jobs (the place tests took 412 s with every daemon warm, 318 s without).
    if request.node.get_closest_marker("warm") is None:
        env["TANDEM_WARM"] = "0"
    runner = Cli(env, state, tmp_path)
    yield runner
    # Cancel what is still going, stop the daemon, then make sure nothing is left behind.
    runner.stop_daemon()
    leftovers = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(p.info.get("cmdline") or [])
            mine = str(state) in cmdline or str(tmp_path) in cmdline
            mine = mine or p.environ().get("TANDEM_STATE_DIR") == str(state)
        except psutil.Error:
            continue
        if mine and p.pid != os.getpid():
            leftovers.append(p)
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
    psutil.wait_procs(leftovers, timeout=10)
    subprocess.run(["rm", "-rf", str(runtime)], check=False)


@pytest.fixture
def cli(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cli]:
    yield from _cli_in(tmp_path, request)


@pytest.fixture(scope="module")
def module_cli(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Cli]:
    """One state directory (and daemon) for a module's tests, where each test makes and reads
    only its own jobs: a daemon and its MLflow helper started once, not per test."""
    yield from _cli_in(tmp_path_factory.mktemp("module"), request)


@pytest.fixture
def inproc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., InProc]]:
    """``inproc(*daemon_args)``: a daemon in this process (tests/place/inproc.py), as
    ``tandem daemon start ARGS`` configures it; closed after the test."""
    made: list[InProc] = []

    def start(*daemon_args: str) -> InProc:
        made.append(InProc(tmp_path, monkeypatch, daemon_args))
        return made[-1]

    yield start
    for daemon in made:
        daemon.close()


# The Ray tests on separate nodes (tests/place/nodes.py): a module's cluster, a daemon on it
# for each test. Here so that both modules of them share one definition.
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodesCluster]:
    from tandem.bench.ray_nodes import NodesCluster
    from tests.leftovers import note_cluster

    root = tmp_path_factory.mktemp("nodes")
    note_cluster(root)  # undone at the session's end if this process cannot (interrupted)
    c = NodesCluster(root)
    try:
        c.add_node("head")
        c.add_node("worker")
        yield c
    finally:
        c.close()


@pytest.fixture
def on_cluster(cluster: NodesCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cli]:
    """A state directory whose daemon (started in the head's network) runs on ``cluster``:
    its jobs tracked in MLflow where the test is marked ``tracked`` (as users get it), else
    ``--no-track`` (an MLflow helper's import is seconds of a core, and no other test there
    reads MLflow)."""
    from tests.place.nodes import DATASET, READER, start_daemon

    gen = _cli_in(tmp_path, request)
    cli = next(gen)
    cli.env.update(RAY_AUTH_MODE="disabled", **cluster.ray_env)  # as the nodes have it
    (tmp_path / "data.py").write_text(DATASET)
    (tmp_path / "reader.py").write_text(READER)
    untracked = () if request.node.get_closest_marker("tracked") else ("--no-track",)
    start_daemon(cli, cluster, ("--backend", "ray", "--address", cluster.address, *untracked))
    try:
        yield cli
    finally:
        next(gen, None)
