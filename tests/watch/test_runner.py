"""``tandem.watch.runner`` as a library: several tracked commands from one process, each
started without blocking and waited on separately, with no signal handler installed."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tandem.watch.runner import CommandNotFound, SignalForwarder, start
from tandem.watch.stores import FileStore
from tandem.watch.stores.csv_file import read_points

# Waits (up to 60 s) for a file to appear, then prints and exits with the code given.
WAIT_FOR = (
    "import os, sys, time\nend = time.monotonic() + 60\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < end: time.sleep(0.02)\n"
    "print('go', sys.argv[1]); sys.exit(int(sys.argv[2]))\n"
)


def _start(tmp_path: Path, name: str, go: Path, code: int, out: io.BytesIO):
    argv = [sys.executable, "-c", WAIT_FOR, str(go), str(code)]
    store = FileStore(tmp_path / "runs")
    return start(argv, name=name, interval=0.2, quiet=True, store=store, fallback_dir=tmp_path, stdout=out)


def _run_dir(tmp_path: Path, name: str) -> Path:
    (found,) = [
        d for d in (tmp_path / "runs").iterdir() if json.loads((d / "run.json").read_text())["name"] == name
    ]
    return found


def test_two_commands_started_from_one_process_and_waited_on_separately(tmp_path):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    go_a, go_b = tmp_path / "go-a", tmp_path / "go-b"
    out_a, out_b = io.BytesIO(), io.BytesIO()
    a = _start(tmp_path, "a", go_a, 0, out_a)
    b = _start(tmp_path, "b", go_b, 3, out_b)
    try:
        # start() returned while both commands wait for their file: it does not block.
        assert a.pid != b.pid and a.exit_code is None and b.exit_code is None
        assert {s: signal.getsignal(s) for s in handlers} == handlers, "no process-wide signal handler"
        with pytest.raises(TimeoutError):
            b.wait(timeout=0.3)  # still waiting for its file
        go_b.touch()
        assert b.wait(timeout=60) == 3  # b ends first, while a still runs
        assert a.exit_code is None and os.waitpid(a.pid, os.WNOHANG) == (0, 0), "a is still running"
        go_a.touch()
        assert a.wait(timeout=60) == 0
    finally:
        for cmd, go in ((a, go_a), (b, go_b)):
            go.touch()
            cmd.wait(timeout=60)
    assert out_a.getvalue() == f"go {go_a}\n".encode() and out_b.getvalue() == f"go {go_b}\n".encode()
    for name, status, code in (("a", "FINISHED", "0"), ("b", "FAILED", "3")):
        run_dir = _run_dir(tmp_path, name)
        meta = json.loads((run_dir / "run.json").read_text())
        assert meta["status"] == status and meta["tags"]["tandem.exit_code"] == code
        assert (run_dir / "output.log").read_text().startswith("go "), "each run keeps its own output"
        keys = {p.key for p in read_points(run_dir / "metrics.csv")}
        assert "summary/cpu_seconds" in keys and "system/process_tree/cpu_percent" in keys


def test_the_writer_helper_runs_below_the_commands_priority(tmp_path):
    go = tmp_path / "go"
    cmd = _start(tmp_path, "nice", go, 0, io.BytesIO())
    try:
        recorder = cmd.run.recorder
        assert recorder is not None and recorder.wait_open(60)  # the helper has set its priority by then
        assert os.getpriority(os.PRIO_PROCESS, recorder.pid) >= os.getpriority(os.PRIO_PROCESS, cmd.pid) + 10
        # In the same session: under autogroup scheduling a session of its own would be a
        # scheduling group of its own, with a full share whatever its nice value.
        assert os.getsid(recorder.pid) == os.getsid(0) and os.getpgid(recorder.pid) != os.getpgid(0)
    finally:
        go.touch()
        assert cmd.wait(timeout=60) == 0


def test_a_missing_command_fails_before_any_run_is_made(tmp_path):
    with pytest.raises(CommandNotFound, match="no-such-command-xyz: command not found"):
        start(["no-such-command-xyz"], store=FileStore(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_log_metrics_are_stored_at_their_step_and_bad_names_dropped(tmp_path, capfd):
    from tandem.watch import track

    with track(name="metrics", interval=0.2, store=FileStore(tmp_path / "runs"), quiet=True) as run:
        run.log_metrics({"eval/accuracy": 0.75, "top@1": 0.5}, step=12)
        run.log_metrics({"eval/accuracy": 0.8}, step=13)
    points = read_points(_run_dir(tmp_path, "metrics") / "metrics.csv")
    assert [(p.step, p.value) for p in points if p.key == "eval/accuracy"] == [(12, 0.75), (13, 0.8)]
    assert not [p for p in points if p.key == "top@1"], "an invalid name is not stored"
    assert "metric name 'top@1' is not valid" in capfd.readouterr().err
    assert "train/samples" not in {p.key for p in points}, "log_metrics counts no training step"


def test_a_signal_that_comes_while_the_command_starts_is_sent_to_it(tmp_path):
    go = tmp_path / "never"  # the command would wait 60 s for it
    previous = signal.getsignal(signal.SIGUSR1)
    with SignalForwarder() as signals:
        os.kill(os.getpid(), signal.SIGUSR1)  # before the command exists: held, not fatal
        cmd = _start(tmp_path, "early", go, 0, io.BytesIO())
        signals.attach(cmd)  # now sent to it: SIGUSR1 ends it
        assert cmd.wait(timeout=60) == 128 + signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == previous, "the handlers are restored"
    meta = json.loads((_run_dir(tmp_path, "early") / "run.json").read_text())
    assert meta["status"] == "KILLED" and meta["tags"]["tandem.exit_code"] == str(-signal.SIGUSR1)
