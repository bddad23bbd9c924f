"""The job manager: end to end where the behaviour is the CLI's and real processes' (a real
daemon, real shims, real jobs, real signals: submit, logs, wait, cancel, a crash and restart),
in this process (tests/place/inproc.py: the real state, handlers and scheduler, a fake launcher
and clock) where it is the scheduler's, the state's or a handler's. Fast settings (settle
0.3 s) so that the scheduling is exercised in seconds."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.place.conftest import attempt_dir
from tests.place.inproc import Step, max_overlap
from tests.timing import scaled, until

# Short settle, window and grace, for the tests' daemons.
SHORT = ["--settle", "0.3", "--window", "2", "--grace", "1"]
# The same without an MLflow helper (a process that imports MLflow: seconds of a core per
# daemon): the tests that read no MLflow run. The tests of tracking start theirs with SHORT.
FAST = ["--no-track", *SHORT]


def intervals(path: Path) -> list[tuple[float, float]]:
    """(start, end) of each job that appended 'start T' / 'end T' lines tagged with its id."""
    starts, ends = {}, {}
    for line in path.read_text().splitlines():
        kind, job, t = line.split()
        (starts if kind == "start" else ends)[job] = float(t)
    return [(starts[j], ends[j]) for j in starts]


def logged_job(log: Path, tag: str, seconds: float, until: Path | None = None) -> list[str]:
    """A job that logs its start and end, and runs ``seconds`` (with ``until``: at least
    that, and until the file exists: the test, not the clock, says when it ends)."""
    wait = f"time.sleep({seconds})"
    if until is not None:
        wait += f"\nwhile not os.path.exists({str(until)!r}): time.sleep(0.05)"
    script = (
        f"import os, time, sys\nf=open({str(log)!r},'a')\n"
        f"f.write('start {tag} %f\\n' % time.time()); f.flush()\n{wait}\n"
        f"f.write('end {tag} %f\\n' % time.time())"
    )
    return ["python3", "-c", script]


def test_submit_run_show_logs_wait(cli) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    ok = cli.submit("--name", "hello", "--cpus", "0.5", "--", "sh", "-c", "echo hello from the job")
    bad = cli.submit("--", "sh", "-c", "echo about to fail; echo 'ValueError: bad config' >&2; exit 3")
    # A program that is not there is refused at submit, saying what to fix (not queued to fail later).
    missing = cli("submit", "--", "no-such-command-xyz", check=False)
    assert missing.returncode == 2 and "no program 'no-such-command-xyz' on the job's PATH" in missing.stderr
    script = cli("submit", "--", sys.executable, "-u", "trian.py", "--lr", "0.1", check=False)
    assert script.returncode == 2 and f"no script 'trian.py' in {cli.tmp}" in script.stderr, script.stderr
    assert cli("wait", str(ok)).returncode == 0
    assert cli("wait", str(bad), check=False).returncode == 3  # the job's own code
    assert cli("wait", "--timeout", "soon", check=False).returncode == 125  # wait's own: apart
    # A program that ends at once with no error word: its last line is why, in ls and show.
    two = cli.submit("--", "sh", "-c", "echo loading data; echo 'no such file: data/train.csv'; exit 2")
    assert cli("wait", str(two), check=False).returncode == 2  # a job's 2 is not "no such job"
    assert cli("wait", str(ok), str(bad), check=False).returncode == 1
    assert "hello from the job" in cli("logs", str(ok)).stdout
    job = cli.job(ok)
    for key in (
        "id",
        "name",
        "state",
        "exit_code",
        "signal",
        "attempts",
        "placement",
        "submitted",
        "started",
        "ended",
        "wait_s",
        "run_s",
        "peak_mem_bytes",
        "peak_gpu_mem_bytes",
        "energy_joules",
        "mlflow_run_id",
    ):
        assert key in job
    assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["name"] == "hello"
    assert job["placement"]["device"] == "cpu" and len(job["attempts"]) == 1
    assert job["attempts"][0]["state"] == "succeeded"
    failed = cli.job(bad)
    assert failed["state"] == "failed" and failed["exit_code"] == 3
    assert failed["cause_line"] == "ValueError: bad config"  # the matching line, not the log's last
    assert len(failed["attempts"]) == 1  # a plain failure is never retried
    listed = cli.json("ls", "--all")
    assert [j["id"] for j in listed] == [ok, bad, two]  # nothing queued for the refused
    status = cli.json("daemon", "status")
    assert status["policy"] == "packing" and status["capacity"]["total"]["cores"] == 2 and "used" in status
    table = cli("ls").stdout
    assert "exit 3: ValueError: bad config" in table and "exit 2: no such file: data/train.csv" in table
    assert "log       no such file: data/train.csv" in cli("show", str(two)).stdout


@pytest.mark.parametrize("policy,limit", [("exclusive", 1), ("first-fit", 2), ("packing", 2)])
def test_reservations_never_exceed_capacity(inproc, policy: str, limit: int) -> None:
    """Six 1-core jobs on a 2-core manager: never more than 2 at once (1 under exclusive)."""
    h = inproc("--cpus", "2", "--policy", policy, *FAST)
    ids = [h.submit("--cpus", "1", "--", "python3", "train.py", steps=Step(0.8, cores=1.0)) for _ in range(6)]
    h.run_until(lambda: h.ended(*ids))
    assert h.cli("wait", *map(str, ids)).returncode == 0
    spans = h.spans()
    assert len(spans) == 6
    assert max_overlap(spans) <= limit
    if policy == "first-fit":  # reservations only: it does use both cores
        assert max_overlap(spans) == 2


def test_declared_jobs_that_fit_run_together_under_the_defaults(inproc) -> None:
    """The default policy and settings (no tuning flags): four half-core jobs on two cores
    start together; a fifth waits and says why, in ls, show and --json. (The host measured
    idle but for them: the defaults rightly hold jobs back on a host busy from outside,
    test_robust's host-load test.)"""
    h = inproc("--cpus", "2", "--mem", "4G")
    ids = [h.submit("--cpus", "0.5", "--mem", "256M", "--", "python3", "-c", f"job {i}") for i in range(5)]
    # they run until the test ends them, each measured at a tenth of a core
    h.run_until(lambda: (h.jobs()[ids[4]].reason or "").startswith("cores"), within=60)
    fifth = h.job(ids[4])
    assert fifth["state"] == "queued"
    assert fifth["reason"] == "cores: needs 0.5, 0 of 2 free"
    assert "cores: needs 0.5, 0 of 2 free" in h.cli("ls").stdout
    assert all(j["reason"] for j in h.json("ls") if j["state"] == "queued")
    h.step(1.0)  # each runs a second at least, then until the test releases it
    for job_id in ids[:4]:
        h.finish(job_id)
    h.run_until(lambda: h.state_of(ids[4]) == "running")
    h.step(1.0)
    h.finish(ids[4])
    h.run_until(lambda: h.ended(*ids))
    assert h.cli("wait", *map(str, ids)).returncode == 0
    spans = sorted(h.spans())
    assert max_overlap(spans[:4]) == 4  # the first four ran side by side
    # Started within a pass or two, not one per settle period (the bound the test had on a
    # real clock: 3 s on an idle machine, scaled for a loaded one; here the clock is fake).
    assert spans[3][0] - spans[0][0] < scaled(3.0)
    assert h.job(ids[4])["reason"] is None  # it ran: no reason any more


def test_priority_then_backfill(inproc) -> None:
    h = inproc("--cpus", "2", "--policy", "first-fit", *FAST)
    first = h.submit("--cpus", "2", "--", "python3", "first.py", steps=Step(2.5))
    h.wait_state(first, {"running"})
    big = h.submit("--cpus", "2", "--", "python3", "big.py", steps=Step(0.2))
    low = h.submit("--cpus", "1", "--", "python3", "low.py", steps=Step(0.2))
    high = h.submit("--cpus", "1", "--priority", "5", "--", "python3", "high.py", steps=Step(0.2))
    h.run_until(lambda: h.ended(first, big, low, high))
    h.cli("wait", str(first), str(big), str(low), str(high))
    started = {j: h.job(j)["attempts"][0]["started"] for j in (big, low, high)}
    # When `first` ends: `high` first (priority); `big` (next in line) does not fit beside it,
    # so `low` backfills past it; `big` starts once both are done.
    assert started[high] <= started[low] < started[big]
    assert max_overlap(h.spans()) == 2


def test_aging_stops_backfill(inproc) -> None:
    h = inproc("--cpus", "2", "--policy", "first-fit", "--starve-after", "0", *FAST)
    first = h.submit("--cpus", "1", "--", "python3", "first.py", steps=Step(2.0))
    h.wait_state(first, {"running"})
    big = h.submit("--cpus", "2", "--", "python3", "big.py", steps=Step(0.2))
    small = h.submit("--cpus", "1", "--", "python3", "small.py", steps=Step(0.2))
    h.run_until(lambda: h.ended(first, big, small))
    h.cli("wait", str(first), str(big), str(small))
    assert h.run_of(big).started < h.run_of(small).started  # waited past --starve-after: nothing passes it


OOM_LOG = (
    "step 1 ok\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.02 GiB is free.\n"
)


def test_oom_is_retried_with_escalation(inproc) -> None:
    """The supervisor's classification of the first attempt's log (an OOM) is retried; the
    classification of a real job's output: test_submit_run_show_logs_wait, test_failures."""
    h = inproc("--cpus", "2", *FAST)
    oom, trained = Step(0.5, exit_code=1, log=OOM_LOG), Step(0.5, log="trained")
    job_id = h.submit("--name", "oomy", "--", "python3", "oom_once.py", steps=[oom, trained])
    h.run_until(lambda: h.ended(job_id))
    assert h.cli("wait", str(job_id)).returncode == 0
    job = h.job(job_id)
    assert job["state"] == "succeeded"
    first, second = job["attempts"]
    assert first["state"] == "oom" and "Tried to allocate 2.00 GiB" in first["cause_line"]
    assert second["state"] == "succeeded"
    events = h.cli("show", str(job_id)).stdout
    assert "retry" in events
    assert "== attempt 1 ==" in h.cli("logs", str(job_id)).stdout


def test_oom_retries_are_bounded(inproc) -> None:
    h = inproc("--cpus", "2", *FAST)
    always = Step(0.3, exit_code=1, log="RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate")
    job_id = h.submit("--retries", "1", "--", "python3", "always_oom.py", steps=always)
    h.run_until(lambda: h.ended(job_id))
    assert h.cli("wait", str(job_id), check=False).returncode == 1
    job = h.job(job_id)
    assert job["state"] == "oom" and len(job["attempts"]) == 2
    assert "CUBLAS_STATUS_ALLOC_FAILED" in job["cause_line"]
    assert "oom" in h.cli("ls").stdout


def _pids_from(path: Path, n: int, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().split()) >= n:
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.1)
    raise AssertionError(f"{path} did not get {n} pids")


def _gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        alive = [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_cancel_stops_the_whole_tree(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    pids = tmp_path / "pids"
    # A shell with two children, one of which ignores SIGTERM (so SIGKILL must follow).
    tree = (
        f"sleep 300 & echo $! >> {pids}; (trap '' TERM; sleep 300) & echo $! >> {pids}; "
        f"echo $$ >> {pids}; wait"
    )
    job_id = cli.submit("--", "sh", "-c", tree)
    procs = _pids_from(pids, 3)
    queued = cli.submit("--cpus", "2", "--", "sleep", "100")  # cannot start: cores taken
    out = cli("cancel", str(job_id), str(queued)).stdout
    assert f"cancelled {job_id}" in out and f"cancelled {queued}" in out
    assert _gone(procs), "processes of the cancelled job are still alive"
    cancelled = cli.wait_state(job_id, {"cancelled"})
    assert cancelled["signal"] in ("SIGTERM", "SIGKILL")  # how it really ended, not a made-up 0
    assert cli.job(queued)["attempts"] == []
    assert cli("cancel", "999", check=False).returncode == 2  # an unknown job: exit 2, as everywhere


def test_a_cancel_just_before_the_daemon_stops_is_recorded_not_left_running(cli) -> None:
    """``tandem cancel --all`` then at once ``tandem daemon stop`` (stop everything): the
    stopping daemon waits for the attempts it told to stop, so that ``ls`` says cancelled,
    not "running" until a next daemon reads their ends."""
    cli("daemon", "start", "--cpus", "2", *FAST)
    job_id = cli.submit("--cpus", "0.5", "--", "sleep", "300")
    cli.wait_state(job_id, {"running"})
    cli("cancel", "--all")
    cli("daemon", "stop")
    assert cli("daemon", "status", check=False).returncode == 3  # stopped, and no daemon started
    assert cli.job(job_id)["state"] == "cancelled", cli.job(job_id)


def test_daemon_sigkill_and_restart_loses_nothing(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "1", *FAST)
    log = tmp_path / "runs.log"
    end = tmp_path / "end"  # the running job ends when the test says, not after a time
    running = cli.submit("--cpus", "1", "--", *logged_job(log, "running", 0, until=end))
    cli.wait_state(running, {"running"})
    queued = cli.submit("--cpus", "1", "--", *logged_job(log, "queued", 0.2))
    pid = cli.daemon_pid()
    os.kill(pid, signal.SIGKILL)
    assert _gone([pid])  # waited on, not a fixed sleep
    assert cli.job(running)["state"] == "running"  # the job goes on without its manager
    r = cli("wait", str(queued), check=False)  # nothing can end it now: says so instead of hanging
    assert r.returncode == 125 and "no daemon is running" in r.stderr
    # The job ends while no daemon runs; its supervisor keeps the result.
    end.touch()
    until(lambda: (attempt_dir(cli.state, running) / "result.json").exists(), 30, "the job did not end")
    cli("daemon", "start", "--cpus", "1", *FAST)
    assert cli("wait", str(running), str(queued), timeout=60).returncode == 0
    lines = log.read_text().split("\n")
    assert sum(line.startswith("start running") for line in lines) == 1  # never started twice
    assert sum(line.startswith("start queued") for line in lines) == 1
    assert len(cli.job(running)["attempts"]) == 1
    assert "adopted" in cli("show", str(running)).stdout


def test_bad_input_is_a_clear_error(inproc) -> None:
    h = inproc("--cpus", "2", *FAST)  # the CLI's own checks first, then the daemon's
    r = h.cli("submit", "--mem", "12Q", "--", "true", check=False)
    assert r.returncode == 2 and "not a size" in r.stderr
    r = h.cli("submit", "--cpus", "-1", "--", "true", check=False)
    assert r.returncode == 2 and "above 0" in r.stderr
    r = h.cli("submit", "--frobnicate", "--", "true", check=False)
    assert r.returncode == 2 and "No such option" in r.stderr
    r = h.cli("submit", check=False)
    assert r.returncode == 2 and "no command given" in r.stderr
    for command in ("show", "logs", "wait", "cancel"):  # an unknown job: one message everywhere
        r = h.cli(command, "12", check=False)
        code = 125 if command == "wait" else 2  # wait passes a job's own 2 on: its own is apart
        assert r.returncode == code and "no job 12 (see tandem ls --all)" in r.stderr, (command, r)
    r = h.cli("submit", "--cpus", "64", "--", "true", check=False)
    assert r.returncode == 2 and "asks for 64 cores" in r.stderr  # refused: can never fit
    r = h.cli("submit", "--gpus", "1", "--", "true", check=False)
    assert r.returncode == 2 and "GPU" in r.stderr
    r = h.cli("submit", "--after", "77", "--", "true", check=False)
    assert r.returncode == 2 and "no such job" in r.stderr
    r = h.cli("submit", "--priority", str(10**30), "--", "true", check=False)
    assert r.returncode == 2 and "--priority" in r.stderr and "Traceback" not in r.stderr
    r = h.cli("submit", "--mem", "1" * 400, "--", "true", check=False)
    assert r.returncode == 2 and "is not a size" in r.stderr and "Traceback" not in r.stderr
    r = h.cli("submit", "--name", "evil\x1b[2Jname", "--", "true", check=False)
    assert r.returncode == 2 and "printable" in r.stderr
    r = h.cli("daemon", "start", check=False)
    assert r.returncode == 1 and "already" in r.stderr


def test_corrupt_state_file_is_a_clear_error(cli) -> None:
    cli.state.mkdir(mode=0o700, parents=True)
    (cli.state / "place.db").write_bytes(b"this is not a database" * 100)
    r = cli("ls", check=False)
    assert r.returncode == 1 and "corrupt" in r.stderr and "mv " in r.stderr


def test_locked_state_file_is_a_clear_error(cli) -> None:
    from tandem.place.state import State, StateError

    cli.state.mkdir(mode=0o700)
    State(cli.state).close()  # the writer makes it; readers are not blocked by a writer (write-ahead log) ...
    db = sqlite3.connect(cli.state / "place.db")
    db.execute("BEGIN EXCLUSIVE")
    try:
        assert "no jobs" in cli("ls").stdout
        state = State(cli.state, timeout=0.3)
        with pytest.raises(StateError, match="locked by another process"):
            state.event(None, "test")  # ... a second writer is, and is told so
        state.close()
    finally:
        db.rollback()
        db.close()


def test_dependencies(inproc) -> None:
    h = inproc("--cpus", "2", *FAST)
    a = h.submit("--", "python3", "a.py", steps=Step(0.5))
    b = h.submit("--after", str(a), "--", "python3", "b.py", steps=Step(0.1))
    fail = h.submit("--", "false", steps=Step(0.1, exit_code=1))
    c = h.submit("--after", str(fail), "--", "true", steps=Step(0.1))
    h.run_until(lambda: h.ended(a, b, fail, c))
    h.cli("wait", str(a), str(b), str(c), check=False)
    assert h.run_of(b).started >= h.run_of(a).ended  # type: ignore[operator]
    dep = h.job(c)
    assert dep["state"] == "cancelled" and f"dependency {fail}" in dep["cause"]
    assert (c, 1) not in h.launcher.runs  # it never ran


DATASET = "import torch\n\ndef make():\n    return [torch.tensor([float(i)]) for i in range(64)]\n"
READER = (
    "import os, sys\n"
    "from tandem.share import Consumer\n"
    "c = Consumer.from_env(batch_size=8)\n"
    "n = sum(int(b.shape[0]) for b in c)\n"
    "with open(sys.argv[1], 'a') as f:\n"
    "    f.write(f\"{os.environ['TANDEM_JOB_ID']} {c.producer_pid} {n}\\n\")\n"
    "c.close()\n"
)


def test_share_group_runs_one_producer_that_stops_after_its_last_job(cli, tmp_path: Path) -> None:
    (tmp_path / "toy_data.py").write_text(DATASET)
    (tmp_path / "reader.py").write_text(READER)
    cli("daemon", "start", "--cpus", "2", "--producer-linger", "1", *FAST)  # its linger: test_producer_job
    out = cli(
        "share", "define", "toy", "--dataset", "toy_data.py:make", "--batch-size", "4", "--cpus", "0.5"
    ).stdout
    assert "defined 'toy'" in out
    r = cli("submit", "--share", "nope", "--", "true", check=False)
    assert r.returncode == 2 and "tandem share define nope" in r.stderr
    results = tmp_path / "results.txt"
    ids = [
        cli.submit("--share", "toy", "--cpus", "0.5", "--", sys.executable, "reader.py", str(results))
        for _ in range(2)
    ]
    listing = cli("ls").stdout
    assert "share toy" in listing
    assert cli("wait", *map(str, ids), timeout=120).returncode == 0, cli("logs", str(ids[0])).stdout
    rows = [line.split() for line in results.read_text().splitlines()]
    assert sorted(int(r[0]) for r in rows) == ids
    assert len({r[1] for r in rows}) == 1  # one producer fed both
    assert all(int(r[2]) == 64 for r in rows)  # each read a whole epoch
    producer = int(rows[0][1])
    assert _gone([producer], timeout=45), "the producer outlived its last job and its linger"
    # The producer is a job row of its own (role producer), ended as succeeded once stopped.
    (row,) = [j for j in json.loads(cli("ls", "--json").stdout) if j["role"] == "producer"]
    assert row["name"] == "producer toy" and row["share"] == "toy", row
    deadline = time.monotonic() + scaled(30)
    while (state := cli.job(row["id"])["state"]) != "succeeded":
        assert state == "running" and time.monotonic() < deadline, cli.job(row["id"])
        time.sleep(0.2)
    assert f"producer share 'toy': for job {ids[0]}" in cli("show", str(row["id"])).stdout
    assert all(cli.job(i)["share"] == "toy" for i in ids)


def test_each_job_is_an_mlflow_run_written_while_it_runs(cli, tmp_path: Path) -> None:
    """The defaults (no --settle): a submitted job's run has the samples `tandem run` takes
    (host, process tree, energy) in MLflow while the job still runs, then its end."""
    from mlflow.tracking import MlflowClient

    cli("daemon", "start", "--cpus", "2")
    uri = cli.json("daemon", "status")["tracking"]
    assert uri == f"sqlite:///{cli.state / 'mlflow.db'}"
    stop = tmp_path / "stop"
    job_id = cli.submit(
        "--name", "tracked", "--group", "sweep1", "--", "sh", "-c",
        f"echo to the log; while [ ! -e {stop} ]; do sleep 0.2; done",
    )  # fmt: skip
    # The store is the helper's to make: it is opened here once the job's run is in it (a
    # client opening the file while the helper makes it runs MLflow's migrations beside it).
    client = None
    deadline = time.monotonic() + scaled(120)  # the helper imports MLflow once (seconds on this machine)
    wanted = ("system/host/cpu_percent", "system/process_tree/pss_bytes", "system/energy/cpu_joules")
    while True:
        job = cli.job(job_id)
        assert job["state"] in ("queued", "running"), job  # queued a while on a busy machine
        run_id = job["mlflow_run_id"]
        if run_id and client is None:
            client = MlflowClient(tracking_uri=uri)
        metrics = client.get_run(run_id).data.metrics if client is not None else {}
        if all(any(k.startswith(w.rsplit("/", 1)[0]) for k in metrics) for w in wanted):
            break
        assert time.monotonic() < deadline, (sorted(metrics), (cli.state / "tracking.log").read_text())
        time.sleep(0.2)
    assert client is not None
    assert client.get_run(run_id).info.status == "RUNNING"  # live: the job has not ended
    stop.touch()
    cli("wait", str(job_id), timeout=60)
    deadline = time.monotonic() + 60
    while (run := client.get_run(run_id)).info.status == "RUNNING":
        assert time.monotonic() < deadline, (cli.state / "tracking.log").read_text()
        time.sleep(0.2)
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.tags["tandem.job_id"] == str(job_id) and run.data.tags["group"] == "sweep1"
    assert run.data.tags["tandem.placement"] == "cpu" and run.data.tags["tandem.state"] == "succeeded"
    assert run.data.metrics["summary/run_s"] >= 1.0
    artifacts = [a.path for a in client.list_artifacts(run_id)]
    assert "output.log" in artifacts and "summary.json" in artifacts


def test_a_killed_supervisor_does_not_leave_its_job_running(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    assert cli.json("daemon", "status")["tracking"] is None  # --no-track reached the background daemon
    pids = tmp_path / "pids"
    job_id = cli.submit("--", "sh", "-c", f"echo $$ >> {pids}; sleep 300")
    (job_pid,) = _pids_from(pids, 1)
    shim = cli.job(job_id)
    adir = attempt_dir(cli.state, job_id)
    shim_pid = json.loads((adir / "shim.json").read_text())["pid"]
    os.kill(shim_pid, signal.SIGKILL)
    job = cli.wait_state(job_id, {"failed"})
    assert "supervisor died" in job["cause"]
    assert _gone([job_pid]), "the job of a dead supervisor is still running"
    assert shim["state"] == "running"


def test_share_define_checks_and_stores_a_spec(
    inproc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tandem.place.state import State

    (tmp_path / "imgs" / "cls").mkdir(parents=True)
    h = inproc("--cpus", "2", *FAST)  # share define and rm ask the daemon: the one writer
    cli = h.cli
    define = ("share", "define", "pics", "--images", "imgs", "--device", "cuda:0", "--batch-size", "64")
    out = cli(*define, "--crop", "96", "--dtype", "bfloat16", "--worker-nice", "5").stdout
    assert "defined 'pics'" in out
    (share,) = State(h.state_dir).shares()
    spec = share.spec
    assert spec.source == "images" and spec.ref == str((tmp_path / "imgs").resolve())  # absolute
    assert (spec.device, spec.batch_size, spec.crop, spec.dtype, spec.worker_nice) == (
        "cuda:0",
        64,
        96,
        "bfloat16",
        5,
    )
    both = cli("share", "define", "x", "--images", "imgs", "--dataset", "m:f", check=False)
    assert both.returncode == 2 and "exactly one of" in both.stderr
    # A typo is refused where it is typed, with the import's own error; nothing is defined.
    # The CLI imports it in this process (as the user's shell would in its own): gone after the test.
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "data", None)
    monkeypatch.delitem(sys.modules, "data")
    (tmp_path / "data.py").write_text(
        "def train_set():\n    return list(range(8))\n\ndef needs(n):\n    return n\n"
    )
    typo = cli("share", "define", "typo", "--dataset", "data:trian_set", check=False)
    assert typo.returncode == 2 and "has no attribute 'trian_set'" in typo.stderr
    args = cli("share", "define", "args", "--dataset", "data.py:needs", check=False)
    assert args.returncode == 2 and "cannot be called with no arguments" in args.stderr
    assert [s.name for s in State(h.state_dir).shares()] == ["pics"]
    cli("share", "define", "ok", "--dataset", "data:train_set")
    # rm: refused while a job waits on it, then removed.
    blocker = h.submit("--cpus", "2", "--", "sleep", "30")
    waiting = h.submit("--share", "ok", "--cpus", "0.5", "--", "true")
    h.wait_state(blocker, {"running"})
    r = cli("share", "rm", "ok", check=False)
    assert r.returncode == 2 and f"job(s) {waiting}" in r.stderr
    cli("cancel", str(waiting), str(blocker))
    cli("share", "rm", "ok", "pics")
    assert State(h.state_dir).shares() == []
    r = cli("share", "rm", "ok", check=False)
    assert r.returncode == 2 and "no shared dataset" in r.stderr


def test_a_state_file_of_schema_1_opens(tmp_path: Path) -> None:
    """A state directory written by the previous tandem (schema 1: shares as command-line
    arguments, no reasons or tokens) opens, migrated, with its jobs and shares."""
    from tandem.place.state import SCHEMA_VERSION, State

    d = tmp_path / "old"
    d.mkdir(mode=0o700)
    db = sqlite3.connect(d / "place.db")
    db.executescript(OLD_SCHEMA)
    db.execute("INSERT INTO meta VALUES ('schema', '1')")
    db.execute(
        "INSERT INTO jobs (name, job_key, command, cwd, env, cpus, mem, gpus, priority, retries, grp, state, "
        "submitted) VALUES ('a', 'name:a', '[\"true\"]', '/', '{}', 1, 0, 0, 0, 2, 'g1', 'queued', 1.0)"
    )
    args = ["--dataset", "/x/data.py:make", "--window", "8", "--policy", "wait", "--batch-size", "50",
            "--seed", "0", "--shuffle"]  # fmt: skip
    db.execute("INSERT INTO shares VALUES ('hx', ?, 2.0, 0, 1.0, NULL, NULL, NULL)", (json.dumps(args),))
    db.commit()
    db.close()
    state = State(d)
    (job,) = state.jobs()
    assert (job.name, job.group, job.reason, job.token, job.updated) == ("a", "g1", None, None, 1.0)
    (share,) = state.shares()
    assert (share.spec.source, share.spec.ref, share.spec.batch_size) == ("dataset", "/x/data.py:make", 50)
    assert share.spec.shuffle and share.spec.cpus == 2.0
    assert state.setting("schema") == str(SCHEMA_VERSION)


OLD_SCHEMA = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT, job_key TEXT NOT NULL, command TEXT NOT NULL, cwd TEXT NOT NULL, env TEXT NOT NULL,
    cpus REAL NOT NULL, mem INTEGER NOT NULL, gpus INTEGER NOT NULL, gpu_mem INTEGER,
    gpu_share INTEGER, priority INTEGER NOT NULL, retries INTEGER NOT NULL,
    share TEXT, grp TEXT, after TEXT NOT NULL DEFAULT '[]',
    state TEXT NOT NULL, cause TEXT, cause_line TEXT, exit_code INTEGER, signal TEXT,
    submitted REAL NOT NULL, queued_at REAL, started REAL, ended REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    escalation INTEGER NOT NULL DEFAULT 0,
    peak_mem INTEGER, peak_gpu_mem INTEGER, energy_joules REAL, mlflow_run_id TEXT
);
CREATE INDEX jobs_state ON jobs(state);
CREATE TABLE shares (
    name TEXT PRIMARY KEY, serve_args TEXT NOT NULL, cpus REAL NOT NULL, mem INTEGER NOT NULL,
    defined REAL NOT NULL, pid INTEGER, ctime REAL, started REAL
);
"""
