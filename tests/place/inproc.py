"""The daemon in the test's process: its real state (SQLite in tmp), requests, scheduler and
admission, with a fake launcher and a fake clock the test advances.

For tests whose behaviour under test is the scheduler's, the state's or a handler's: no
supervisor, job or daemon process is started, and no test waits on a wall clock.

- :class:`FakeClock` is the daemon's clock (:mod:`tandem.place.clock`: ``time()`` and
  ``monotonic()`` move only when the test advances them; a ``sleep`` advances them);
- :class:`FakeLauncher` is the daemon's :class:`~tandem.place.run.launchers.launch.Launcher`: an attempt
  "runs" until the test (or the script it was given) ends it with an exit code and a log
  tail, classified by the supervisor's own :func:`~tandem.place.run.supervisor.failures.classify`; while
  it runs it reports the cores and memory the test says it uses (``usage.json``, as a
  supervisor writes it), and the host's measured use is what the running attempts use plus
  what the test says runs outside;
- :meth:`InProc.cli` runs the real ``tandem`` CLI in a thread of this process (click's
  runner), its requests answered through the daemon's real socket and request handling
  (``Daemon._accept``/``_answer``) by this thread, which pumps the daemon meanwhile.
"""

from __future__ import annotations

import os
import selectors
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from click.testing import CliRunner

from tandem.place.model import Capacity
from tandem.place.run.launchers.launch import Launch, Launched
from tandem.place.run.supervisor.failures import classify
from tandem.place.run.supervisor.files import Result, ShimInfo, Usage, save
from tandem.place.run.supervisor.proctrack import host_id


class FakeClock:
    """``time()`` and ``monotonic()`` that move only when the test says so."""

    def __init__(self) -> None:
        self.wall = time.time()
        self.mono = 1000.0
        self.process_time = time.process_time  # what a pass costs is real CPU time
        self.perf_counter = time.perf_counter

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def install(self, monkeypatch: Any) -> None:
        """The clock of the daemon's modules until the test ends (the daemon is given it too:
        this also covers what runs before it is made, and puts the system's back after)."""
        from tandem.place import clock

        monkeypatch.setattr(clock, "_clock", self)


@dataclass
class Step:
    """How one attempt of a fake job goes: it runs ``run_s`` (None: until the test ends it),
    using ``cores`` and ``mem`` (``burst_cores`` for its first ``burst_s``: a program's
    imports at its start), then exits with ``exit_code`` having logged ``log``."""

    run_s: float | None = None
    exit_code: int = 0
    log: str = ""
    cores: float = 0.1
    mem: int = 50 << 20
    burst_s: float = 0.0
    burst_cores: float = 1.0

    def cores_at(self, elapsed: float) -> float:
        """The cores it uses ``elapsed`` seconds after its start."""
        return self.burst_cores if elapsed < self.burst_s else self.cores

    def cpu_s(self, elapsed: float) -> float:
        """The CPU-seconds it used in its first ``elapsed`` seconds."""
        burst = min(elapsed, self.burst_s)
        return self.burst_cores * burst + self.cores * (elapsed - burst)


@dataclass
class FakeRun:
    job_id: int
    n: int
    dir: Path
    launch: Launch
    step: Step
    started: float
    ended: float | None = None
    cancelled: bool = False
    samples: int = 0
    sampled: float = 0.0  # when its last usage was written


@dataclass
class FakeLauncher:
    """The daemon's launcher: attempts that run in this process's bookkeeping only."""

    clock: FakeClock
    interval_s: float = 1.0  # between an attempt's samples, as the supervisor takes them
    scripts: dict[int, list[Step]] = field(default_factory=dict)  # job id: its attempts, in turn
    default: Step = field(default_factory=Step)  # how a job without a script runs
    runs: dict[tuple[int, int], FakeRun] = field(default_factory=dict)
    trouble: str | None = None

    def start(self, a: Launched, what: Launch) -> str:
        script = self.scripts.get(a.job_id) or [self.default]
        step = script[min(a.n, len(script)) - 1]
        # The supervisor's own record of itself (this process stands in for it).
        a.shim_pid, a.shim_ctime = os.getpid(), psutil.Process().create_time()
        save(what.dir, ShimInfo(a.shim_pid, a.shim_ctime, host_id()))
        now = self.clock.time()
        self.runs[(a.job_id, a.n)] = FakeRun(a.job_id, a.n, what.dir, what, step, now, sampled=now)
        return ""

    def missing(self, command: list[str], cwd: str, env: dict[str, str]) -> str | None:
        return None  # its jobs are steps, not programs: each one is there

    def alive(self, a: Launched) -> bool:
        run = self.runs.get((a.job_id, a.n))
        return run is not None and run.ended is None

    def pending(self, a: Launched) -> bool:
        return False

    def cancel(self, a: Launched) -> None:
        run = self.runs.get((a.job_id, a.n))
        if run is not None and run.ended is None:
            run.cancelled = True
            self.end(run, -15)  # the supervisor's SIGTERM, as it reports it

    def lost(self, a: Launched) -> str | None:
        return None

    def forget(self, a: Launched) -> None:
        pass

    def refresh(self, capacity: Capacity) -> bool:
        return False

    def samples(self) -> dict[str, Any]:
        return {}  # one server: no Ray node's agent

    def shutdown(self) -> None:
        pass

    # --- what the test drives -----------------------------------------------------------

    def running(self) -> list[FakeRun]:
        return [r for r in self.runs.values() if r.ended is None]

    def end(self, run: FakeRun, code: int, log: str | None = None) -> None:
        """The attempt exits with ``code`` (negative: that signal) having logged ``log``:
        its output and result written as its supervisor writes them."""
        text = run.step.log if log is None else log
        if text:
            with open(run.dir / "output.log", "a") as out:
                out.write(text if text.endswith("\n") else text + "\n")
        ending = classify(code, text, cancelled=run.cancelled)
        run.ended = self.clock.time()
        result = Result(
            ending.kind,
            ending.state,
            ending.exit_code,
            ending.signal,
            ending.cause,
            ending.line,
            run.started,
            run.ended,
            run.step.mem,
            run.step.cpu_s(run.ended - run.started),
        )
        save(run.dir, result)

    def sample(self) -> None:
        """Each running attempt's usage, as its supervisor writes it once a second; the
        attempts whose script says they are done, ended."""
        now = self.clock.time()
        for run in self.running():
            if run.step.run_s is not None and now - run.started >= run.step.run_s:
                self.end(run, run.step.exit_code)
                continue
            if now - run.sampled < self.interval_s:
                continue
            run.samples, run.sampled = run.samples + 1, now
            cpu_s = run.step.cpu_s(now - run.started)
            # The first sample has no rate.
            pct = run.step.cores_at(now - run.started) * 100.0 if run.samples > 1 else None
            save(run.dir, Usage(now, [], run.step.mem, run.step.mem, cpu_s, pct))


@dataclass
class CliResult:
    """What a ``tandem`` command did, shaped as ``subprocess.CompletedProcess``."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class InProc:
    """One daemon in this process over ``state`` (see the module's docstring)."""

    def __init__(
        self,
        tmp: Path,
        monkeypatch: Any,
        daemon_args: Iterable[str],
        launcher: FakeLauncher | None = None,
        clock: FakeClock | None = None,
    ) -> None:
        from tandem.cli.daemon import _config, daemon_start
        from tandem.place.daemon import Daemon
        from tandem.place.devices import detect_capacity
        from tandem.place.state import State

        self.tmp, self.state_dir = tmp, tmp / "state"
        self.monkeypatch, self.daemon_args, self.closed = monkeypatch, tuple(daemon_args), False
        self.env = {"TANDEM_STATE_DIR": str(self.state_dir)}
        monkeypatch.setenv("TANDEM_STATE_DIR", str(self.state_dir))
        monkeypatch.chdir(tmp)  # where jobs are submitted from, as the CLI fixture runs it
        self.clock = clock or FakeClock()
        self.clock.install(monkeypatch)
        self.outside_cores = 0.0  # the host's use by processes the manager does not run
        # The configuration as `tandem daemon start ARGS` makes it (not tracked in MLflow:
        # a helper process; the tests of tracking run a real daemon).
        ctx = daemon_start.make_context("start", [*self.daemon_args, "--no-track"])
        options = {k: v for k, v in ctx.params.items() if k not in ("foreground", "as_json")}
        self.config = _config(options)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.config.save(self.state_dir)
        # A restarted daemon's (restart): the attempts go on, as their supervisors do.
        self.launcher = launcher or FakeLauncher(self.clock, self.config.interval_s)
        capacity = detect_capacity(self.config.cap, "none", None)
        # A producer's CPU weight, as the daemon sets it (its fake supervisor is this process,
        # whose own cgroup must not be reweighed): supervisor pid -> weight.
        self.weights: dict[int, float] = {}
        monkeypatch.setattr(
            "tandem.place.run.supervisor.weights.set_weight",
            lambda pid, w: self.weights.update({pid: w}) or True,
        )
        self.daemon = Daemon(
            State(self.state_dir), capacity, self.config, clock=self.clock, launcher=self.launcher
        )
        assert self.daemon.launcher is self.launcher
        self.daemon.monitor.sample = self._measure  # type: ignore[method-assign]
        self.sel = selectors.DefaultSelector()
        self.listener = self.daemon._listen(self.sel)
        self.daemon.attempts.adopt()
        self.step(0.0)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()
        self.daemon.socket_path.unlink(missing_ok=True)
        self.daemon.state.close()

    def restart(self) -> InProc:
        """This daemon killed and a new one started over the same state directory: the fake
        attempts go on (as supervisors outlive their daemon), and the new one adopts them."""
        self.close()
        return InProc(self.tmp, self.monkeypatch, self.daemon_args, self.launcher, self.clock)

    # --- the clock and the loop ----------------------------------------------------------

    def _measure(self) -> None:
        """The monitor's sample: the running attempts' use and the outside load, no psutil."""
        m = self.daemon.monitor
        now = self.clock.time()
        used = self.outside_cores + sum(r.step.cores_at(now - r.started) for r in self.launcher.running())
        m.cpu.add(self.clock.monotonic(), min(1.0, used / max(m.capacity.total.cores, 1e-3)))
        m.mem_available = m.capacity.total.ram - sum(r.step.mem for r in self.launcher.running())

    def step(self, seconds: float = 0.25) -> None:
        """``seconds`` pass: the attempts report (or end), then the daemon's tick."""
        self.clock.advance(seconds)
        self.launcher.sample()
        self._serve(0)
        self.daemon.tick()

    def run_until(self, done: Callable[[], Any], within: float = 600.0, every: float = 0.25) -> Any:
        """Step until ``done()`` is true (its value returned); ``within`` fake seconds at most."""
        deadline = self.clock.time() + within
        while not (value := done()):
            assert self.clock.time() < deadline, f"not done within {within} s (fake time)"
            self.step(every)
        return value

    def _serve(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            if key.fileobj is self.listener:
                self.daemon._accept(self.sel, self.listener)
            else:
                self.daemon._answer(self.sel, key.fileobj)
        if self.daemon.wake:
            self.daemon.wake = False

    # --- what tests call ---------------------------------------------------------------

    def cli(
        self, *args: str, check: bool = True, stepping: bool = False, answering: bool = True
    ) -> CliResult:
        """``tandem ARGS`` in a thread of this process; its requests are answered here
        meanwhile (``stepping``: the clock moves on and the daemon ticks as it waits, for
        ``tandem wait``; not ``answering``: as a stopped daemon, whose socket takes the
        connection and never answers)."""
        out: dict[str, Any] = {}

        def invoke() -> None:
            from tandem.cli import main

            out["r"] = CliRunner().invoke(main, list(args), env=self.env, catch_exceptions=True)

        thread = threading.Thread(target=invoke, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120  # real seconds: a hang guard
        while thread.is_alive():
            assert time.monotonic() < deadline, f"tandem {shlex.join(args)} did not return"
            if stepping:
                self.step()
            if answering:
                self._serve(0.005)
            thread.join(0.001 if answering else 0.05)
        r = out["r"]
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            raise r.exception
        result = CliResult(args, r.exit_code, r.stdout, r.stderr)
        if check and result.returncode != 0:
            raise AssertionError(f"tandem {shlex.join(args)} -> {result.returncode}\n{r.stdout}\n{r.stderr}")
        return result

    def json(self, *args: str) -> Any:
        import json

        return json.loads(self.cli(*args, "--json").stdout)

    def submit(self, *args: str, steps: list[Step] | Step | None = None) -> int:
        """``tandem submit ARGS``; its attempts go as ``steps`` say (one for each, the last
        for the rest)."""
        job_id = int(self.cli("submit", *args).stdout.strip())
        if steps is not None:
            self.launcher.scripts[job_id] = [steps] if isinstance(steps, Step) else steps
        return job_id

    def job(self, job_id: int) -> dict[str, Any]:
        return self.json("show", str(job_id))  # type: ignore[no-any-return]

    def jobs(self) -> dict[int, Any]:
        """Every job as the state has it now (no CLI: for conditions checked each step)."""
        return {j.id: j for j in self.daemon.state.jobs()}

    def state_of(self, job_id: int) -> str:
        job = self.daemon.state.job(job_id, attempts=False)
        assert job is not None, job_id
        return job.state

    def wait_state(self, job_id: int, states: set[str], within: float = 600.0) -> str:
        return self.run_until(lambda: (s := self.state_of(job_id)) in states and s, within)  # type: ignore[no-any-return]

    def ended(self, *ids: int) -> bool:
        from tandem.place.model import WAITING_STATES

        return all(self.state_of(i) not in (*WAITING_STATES, "running") for i in ids)

    def run_of(self, job_id: int, n: int = 1) -> FakeRun:
        return self.launcher.runs[(job_id, n)]

    def finish(self, job_id: int, code: int = 0, log: str | None = None) -> None:
        """The running attempt of ``job_id`` exits with ``code``."""
        (run,) = [r for r in self.launcher.running() if r.job_id == job_id]
        self.launcher.end(run, code, log)

    def spans(self) -> list[tuple[float, float]]:
        """(start, end) of every attempt that ended, in fake time."""
        return [(r.started, r.ended) for r in self.launcher.runs.values() if r.ended is not None]


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """How many of ``spans`` ran at once at most (one that ends as another starts: not both)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    level = peak = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    return peak
