"""The job manager end to end: a real daemon, real shims, real jobs, real signals, a real
SQLite state. Fast settings (settle 0.3 s) so that the scheduling is exercised in seconds."""

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
from tests.timing import scaled

FAST = ["--settle", "0.3", "--window", "2", "--grace", "1"]


def intervals(path: Path) -> list[tuple[float, float]]:
    """(start, end) of each job that appended 'start T' / 'end T' lines tagged with its id."""
    starts, ends = {}, {}
    for line in path.read_text().splitlines():
        kind, job, t = line.split()
        (starts if kind == "start" else ends)[job] = float(t)
    return [(starts[j], ends[j]) for j in starts]


def max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


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
    missing = cli.submit("--", "no-such-command-xyz")
    assert cli("wait", str(ok)).returncode == 0
    assert cli("wait", str(bad), check=False).returncode == 3
    assert cli("wait", str(ok), str(bad), check=False).returncode == 1
    cli("wait", str(missing), check=False)
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
    nf = cli.job(missing)
    assert nf["state"] == "failed" and nf["exit_code"] == 127 and "not found" in nf["cause"]
    listed = cli.json("ls", "--all")
    assert [j["id"] for j in listed] == [ok, bad, missing]
    status = cli.json("daemon", "status")
    assert status["policy"] == "packing" and status["capacity"]["cpus"] == 2 and "used" in status
    table = cli("ls").stdout
    assert "exit 3" in table and "command not found" in table


@pytest.mark.parametrize("policy,limit", [("exclusive", 1), ("first-fit", 2), ("packing", 2)])
def test_reservations_never_exceed_capacity(cli, tmp_path: Path, policy: str, limit: int) -> None:
    """Six 1-core jobs on a 2-core manager: never more than 2 at once (1 under exclusive)."""
    cli("daemon", "start", "--cpus", "2", "--policy", policy, *FAST)
    log = tmp_path / "spans.log"
    ids = [cli.submit("--cpus", "1", "--", *logged_job(log, f"j{i}", 0.8)) for i in range(6)]
    assert cli("wait", *map(str, ids), timeout=120).returncode == 0
    spans = intervals(log)
    assert len(spans) == 6
    assert max_overlap(spans) <= limit
    if policy == "first-fit":  # reservations only: it does use both cores (packing also
        assert max_overlap(spans) == 2  # measures the host's CPU, which a busy test machine fills)


def _skip_if_busy_from_outside(cli) -> None:
    """Four jobs side by side under the defaults needs a host no one else keeps busy: the
    defaults rightly hold jobs back while it is (test_robust's host-load test)."""
    deadline = time.monotonic() + scaled(10)
    while (busy := cli.json("daemon", "status")["used"]["cpu_busy_mean"]) is None:
        assert time.monotonic() < deadline, "the daemon measured the host"
        time.sleep(0.2)
    if busy > 0.5:
        pytest.skip(
            f"the host is {busy:.0%} busy before any job: the defaults hold jobs back, as they should"
        )


def test_declared_jobs_that_fit_run_together_under_the_defaults(cli, tmp_path: Path) -> None:
    """The default policy and settings (no tuning flags): four half-core jobs on two cores
    start together; a fifth waits and says why, in ls, show and --json."""
    cli("daemon", "start", "--cpus", "2", "--mem", "4G")
    _skip_if_busy_from_outside(cli)
    log, release = tmp_path / "spans.log", tmp_path / "release"
    jobs = [logged_job(log, f"j{i}", 1, until=release) for i in range(5)]  # they end when released
    ids = [cli.submit("--cpus", "0.5", "--mem", "256M", "--", *job) for job in jobs]
    fifth = cli.wait_state(ids[4], {"queued", "running"})
    deadline = time.monotonic() + 60  # a deadline for a loaded machine: the first four hold until released
    while not ((fifth := cli.job(ids[4]))["reason"] or "").startswith("cores"):
        assert time.monotonic() < deadline, fifth
        time.sleep(0.2)
    assert fifth["state"] == "queued"
    assert fifth["reason"] == "cores: needs 0.5, 0 of 2 free"
    assert "cores: needs 0.5, 0 of 2 free" in cli("ls").stdout
    assert all(j["reason"] for j in cli.json("ls") if j["state"] == "queued")
    release.touch()
    assert cli("wait", *map(str, ids), timeout=120).returncode == 0
    spans = sorted(intervals(log))
    assert max_overlap(spans[:4]) == 4  # the first four ran side by side
    assert spans[3][0] - spans[0][0] < scaled(3.0)  # started within a pass or two, not one per settle period
    assert cli.job(ids[4])["reason"] is None  # it ran: no reason any more


def test_priority_then_backfill(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", "--policy", "first-fit", *FAST)
    log = tmp_path / "order.log"
    first = cli.submit("--cpus", "2", "--", *logged_job(log, "first", 2.5))
    cli.wait_state(first, {"running"})
    big = cli.submit("--cpus", "2", "--", *logged_job(log, "big", 0.2))
    low = cli.submit("--cpus", "1", "--", *logged_job(log, "low", 0.2))
    high = cli.submit("--cpus", "1", "--priority", "5", "--", *logged_job(log, "high", 0.2))
    cli("wait", str(first), str(big), str(low), str(high), timeout=120)
    started = {j: cli.job(j)["attempts"][0]["started"] for j in (big, low, high)}
    # When `first` ends: `high` first (priority); `big` (next in line) does not fit beside it,
    # so `low` backfills past it; `big` starts once both are done.
    assert started[high] <= started[low] < started[big]
    assert max_overlap(intervals(log)) == 2


def test_aging_stops_backfill(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", "--policy", "first-fit", "--starve-after", "0", *FAST)
    log = tmp_path / "order.log"
    first = cli.submit("--cpus", "1", "--", *logged_job(log, "first", 2.0))
    cli.wait_state(first, {"running"})
    big = cli.submit("--cpus", "2", "--", *logged_job(log, "big", 0.2))
    small = cli.submit("--cpus", "1", "--", *logged_job(log, "small", 0.2))
    cli("wait", str(first), str(big), str(small), timeout=120)
    starts = {
        line.split()[1]: float(line.split()[2]) for line in log.read_text().splitlines() if "start" in line
    }
    assert starts["big"] < starts["small"]  # waited past --starve-after: nothing passes it


OOM_ONCE = (
    "import os, sys\n"
    "marker = sys.argv[1]\n"
    "if not os.path.exists(marker):\n"
    "    open(marker, 'w').close()\n"
    "    print('step 1 ok')\n"
    "    print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.02 GiB is free.', file=sys.stderr)\n"
    "    sys.exit(1)\n"
    "print('trained')\n"
)


def test_oom_is_retried_with_escalation(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    script = tmp_path / "oom_once.py"
    script.write_text(OOM_ONCE)
    job_id = cli.submit("--name", "oomy", "--", "python3", str(script), str(tmp_path / "marker"))
    assert cli("wait", str(job_id), timeout=60).returncode == 0
    job = cli.job(job_id)
    assert job["state"] == "succeeded"
    first, second = job["attempts"]
    assert first["state"] == "oom" and "Tried to allocate 2.00 GiB" in first["cause_line"]
    assert second["state"] == "succeeded"
    events = cli("show", str(job_id)).stdout
    assert "retry" in events
    assert "== attempt 1 ==" in cli("logs", str(job_id)).stdout


def test_oom_retries_are_bounded(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    always = "import sys; print('RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate', file=sys.stderr); sys.exit(1)"  # noqa: E501
    job_id = cli.submit("--retries", "1", "--", "python3", "-c", always)
    assert cli("wait", str(job_id), timeout=60, check=False).returncode == 1
    job = cli.job(job_id)
    assert job["state"] == "oom" and len(job["attempts"]) == 2
    assert "CUBLAS_STATUS_ALLOC_FAILED" in job["cause_line"]
    assert "oom" in cli("ls").stdout


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


def test_daemon_sigkill_and_restart_loses_nothing(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "1", *FAST)
    log = tmp_path / "runs.log"
    running = cli.submit("--cpus", "1", "--", *logged_job(log, "running", 3))
    cli.wait_state(running, {"running"})
    queued = cli.submit("--cpus", "1", "--", *logged_job(log, "queued", 0.2))
    os.kill(cli.daemon_pid(), signal.SIGKILL)
    time.sleep(0.5)
    assert cli.job(running)["state"] == "running"  # the job goes on without its manager
    r = cli("wait", str(queued), check=False)  # nothing can end it now: says so instead of hanging
    assert r.returncode == 3 and "no daemon is running" in r.stderr
    time.sleep(1)  # the job ends while no daemon runs; its shim keeps the result
    cli("daemon", "start", "--cpus", "1", *FAST)
    assert cli("wait", str(running), str(queued), timeout=60).returncode == 0
    lines = log.read_text().split("\n")
    assert sum(line.startswith("start running") for line in lines) == 1  # never started twice
    assert sum(line.startswith("start queued") for line in lines) == 1
    assert len(cli.job(running)["attempts"]) == 1
    assert "adopted" in cli("show", str(running)).stdout


def test_bad_input_is_a_clear_error(cli, tmp_path: Path) -> None:
    r = cli("submit", "--mem", "12Q", "--", "true", check=False)
    assert r.returncode == 2 and "not a size" in r.stderr
    r = cli("submit", "--cpus", "-1", "--", "true", check=False)
    assert r.returncode == 2 and "above 0" in r.stderr
    r = cli("submit", "--frobnicate", "--", "true", check=False)
    assert r.returncode == 2 and "No such option" in r.stderr
    r = cli("submit", check=False)
    assert r.returncode == 2 and "no command given" in r.stderr
    for command in ("show", "logs", "wait", "cancel"):  # an unknown job: one message, one code, everywhere
        r = cli(command, "12", check=False)
        assert r.returncode == 2 and "no job 12 (see tandem ls --all)" in r.stderr, (command, r)
    cli("daemon", "start", "--cpus", "2", *FAST)
    r = cli("submit", "--cpus", "64", "--", "true", check=False)
    assert r.returncode == 2 and "asks for 64 cores" in r.stderr  # refused: can never fit
    r = cli("submit", "--gpus", "1", "--", "true", check=False)
    assert r.returncode == 2 and "GPU" in r.stderr
    r = cli("submit", "--after", "77", "--", "true", check=False)
    assert r.returncode == 2 and "no such job" in r.stderr
    r = cli("submit", "--priority", str(10**30), "--", "true", check=False)
    assert r.returncode == 2 and "--priority" in r.stderr and "Traceback" not in r.stderr
    r = cli("submit", "--mem", "1" * 400, "--", "true", check=False)
    assert r.returncode == 2 and "is not a size" in r.stderr and "Traceback" not in r.stderr
    r = cli("submit", "--name", "evil\x1b[2Jname", "--", "true", check=False)
    assert r.returncode == 2 and "printable" in r.stderr
    r = cli("daemon", "start", check=False)
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


def test_dependencies(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    log = tmp_path / "deps.log"
    a = cli.submit("--", *logged_job(log, "a", 0.5))
    b = cli.submit("--after", str(a), "--", *logged_job(log, "b", 0.1))
    fail = cli.submit("--", "false")
    c = cli.submit("--after", str(fail), "--", "true")
    cli("wait", str(a), str(b), str(c), check=False, timeout=60)
    spans = dict(zip(["a", "b"], sorted(intervals(log))))
    assert spans["b"][0] >= spans["a"][1]
    dep = cli.job(c)
    assert dep["state"] == "cancelled" and f"dependency {fail}" in dep["cause"]


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
    cli("daemon", "start", "--cpus", "2", *FAST)  # share define asks the daemon (started if needed)
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
    assert _gone([producer], timeout=20), "the producer outlived its last job"
    events = cli("show", str(ids[0])).stdout
    assert "producer" in events
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
    client = MlflowClient(tracking_uri=uri)
    deadline = time.monotonic() + 120  # the helper imports MLflow once (seconds on this machine)
    wanted = ("system/host/cpu_percent", "system/process_tree/pss_bytes", "system/energy/cpu_joules")
    while True:
        job = cli.job(job_id)
        assert job["state"] == "running", job
        run_id = job["mlflow_run_id"]
        metrics = client.get_run(run_id).data.metrics if run_id else {}
        if all(any(k.startswith(w.rsplit("/", 1)[0]) for k in metrics) for w in wanted):
            break
        assert time.monotonic() < deadline, (sorted(metrics), (cli.state / "tracking.log").read_text())
        time.sleep(0.5)
    assert client.get_run(run_id).info.status == "RUNNING"  # live: the job has not ended
    stop.touch()
    cli("wait", str(job_id), timeout=60)
    deadline = time.monotonic() + 60
    while (run := client.get_run(run_id)).info.status == "RUNNING":
        assert time.monotonic() < deadline, (cli.state / "tracking.log").read_text()
        time.sleep(0.5)
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.tags["tandem.job_id"] == str(job_id) and run.data.tags["group"] == "sweep1"
    assert run.data.tags["tandem.placement"] == "cpu" and run.data.tags["tandem.state"] == "succeeded"
    assert run.data.metrics["summary/run_s"] >= 1.0
    artifacts = [a.path for a in client.list_artifacts(run_id)]
    assert "output.log" in artifacts and "summary.json" in artifacts


def test_a_killed_supervisor_does_not_leave_its_job_running(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", "--no-track", *FAST)
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


def test_share_define_checks_and_stores_a_spec(cli, tmp_path: Path) -> None:
    from tandem.place.state import State

    (tmp_path / "imgs" / "cls").mkdir(parents=True)
    cli("daemon", "start", "--cpus", "2", *FAST)  # share define and rm ask the daemon: the one writer
    define = ("share", "define", "pics", "--images", "imgs", "--device", "cuda:0", "--batch-size", "64")
    out = cli(*define, "--crop", "96", "--dtype", "bfloat16", "--worker-nice", "5").stdout
    assert "defined 'pics'" in out
    (share,) = State(cli.state).shares()
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
    (tmp_path / "data.py").write_text(
        "def train_set():\n    return list(range(8))\n\ndef needs(n):\n    return n\n"
    )
    typo = cli("share", "define", "typo", "--dataset", "data:trian_set", check=False)
    assert typo.returncode == 2 and "has no attribute 'trian_set'" in typo.stderr
    args = cli("share", "define", "args", "--dataset", "data.py:needs", check=False)
    assert args.returncode == 2 and "cannot be called with no arguments" in args.stderr
    assert [s.name for s in State(cli.state).shares()] == ["pics"]
    cli("share", "define", "ok", "--dataset", "data:train_set")
    # rm: refused while a job waits on it, then removed.
    blocker = cli.submit("--cpus", "2", "--", "sleep", "30")
    waiting = cli.submit("--share", "ok", "--cpus", "0.5", "--", "true")
    r = cli("share", "rm", "ok", check=False)
    assert r.returncode == 2 and f"job(s) {waiting}" in r.stderr
    cli("cancel", str(waiting), str(blocker))
    cli("share", "rm", "ok", "pics")
    assert State(cli.state).shares() == []
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
