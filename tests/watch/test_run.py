"""`tandem run` end to end: real commands, a real MLflow SQLite store, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tandem.watch.samplers import CpuEnergySampler

TANDEM = [sys.executable, "-m", "tandem.cli"]
# Busy for {s} CPU-seconds (not wall seconds: the same on a loaded machine), mostly user time.
BUSY = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: sum(range(20000))\n"
# Holds 200 MiB for a while, using almost no CPU.
IDLE_BIG = (
    "import time\nx = bytearray(200 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\ntime.sleep({s})\n"
)


def tandem(*args: str, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """The ``tandem`` command, with its output captured."""
    return subprocess.run([*TANDEM, *args], capture_output=True, text=True, timeout=180, cwd=cwd, **kw)


def python_c(code: str) -> list[str]:
    """The end of a ``tandem run`` command line that runs ``code`` in Python."""
    return ["--", sys.executable, "-c", code]


def tandem_run(store: Path, *args: str, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """``tandem run`` against ``store``, in the store's directory (any fall-back goes there)."""
    return tandem("run", "--store", f"sqlite:///{store}", *args, cwd=cwd or store.parent, **kw)


def start_run(store: Path, *args: str) -> subprocess.Popen:
    """``tandem run`` against ``store`` in the background."""
    return subprocess.Popen([*TANDEM, "run", "--store", f"sqlite:///{store}", *args])


def client_for(store: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{store}")


def find_run(store: Path, name: str):
    client = client_for(store)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, filter_string=f"attributes.run_name = '{name}'")
    assert len(runs) == 1, f"expected one run named {name}, found {len(runs)}"
    return runs[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mlflow") / "mlflow.db"


def test_exit_code_output_tags_and_summary_are_stored(store, tmp_path):
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n" + BUSY.format(s=1.0)
    code += "sys.exit(3)\n"
    r = tandem_run(store, "-n", "exit3", "-i", "0.2", "-g", "g-exit", "-t", "lr=0.1", *python_c(code))
    assert r.returncode == 3, r.stderr
    assert "to stdout" in r.stdout and "to stderr" in r.stderr, "output is streamed through"
    assert "CPU time" in r.stderr, "the summary table is printed"
    run = find_run(store, "exit3")
    assert run.info.status == "FAILED"
    tags = run.data.tags
    assert tags["group"] == "g-exit" and tags["lr"] == "0.1" and tags["tandem.exit_code"] == "3"
    assert tags["tandem.command"].startswith(sys.executable)
    m = run.data.metrics
    assert m["summary/cpu_seconds"] > 0.5, "the busy second is counted"
    assert 0.8 < m["summary/duration_s"] < 30
    assert m["summary/energy_cpu_estimated_joules"] > 0
    if not CpuEnergySampler(lambda: 0.0).measured:
        assert "summary/energy_cpu_measured_joules" not in m, "no RAPL here: nothing claims to be measured"
    history = client_for(store).get_metric_history(run.info.run_id, "system/process_tree/cpu_percent")
    assert len(history) >= 3, "sampled every 0.2 s"
    assert all(abs(h.timestamp / 1000 - time.time()) < 600 for h in history), "real sample timestamps"
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert "to stdout" in (artifacts / "output.log").read_text()
    assert json.loads((artifacts / "summary.json").read_text())["cpu_seconds"] == m["summary/cpu_seconds"]


def test_two_concurrent_runs_each_see_only_their_own_cpu_and_memory(store):
    pair = ("-q", "-g", "pair", "-i", "0.25")
    busy = start_run(store, *pair, "-n", "c-busy", *python_c(BUSY.format(s=3.0)))
    idle = start_run(store, *pair, "-n", "c-idle", *python_c(IDLE_BIG.format(s=3.0)))
    assert busy.wait(120) == 0 and idle.wait(120) == 0
    b, i = find_run(store, "c-busy").data.metrics, find_run(store, "c-idle").data.metrics
    assert b["summary/cpu_seconds"] > 1.0, b["summary/cpu_seconds"]
    assert i["summary/cpu_seconds"] < 0.5 * b["summary/cpu_seconds"], (i["summary/cpu_seconds"], b)
    assert i["summary/peak_uss_bytes"] > 190 * 2**20, "the idle run's 200 MiB is its own"
    assert b["summary/peak_uss_bytes"] < 100 * 2**20, "and not the busy run's"


def test_children_started_later_are_counted(store):
    code = (
        "import subprocess, sys, time\ntime.sleep(0.6)\n"
        f"subprocess.run([sys.executable, '-c', {BUSY.format(s=1.0)!r}], check=True)\n"
    )
    r = tandem_run(store, "-q", "-n", "late-child", "-i", "0.2", *python_c(code))
    assert r.returncode == 0, r.stderr
    run = find_run(store, "late-child")
    assert run.data.metrics["summary/cpu_seconds"] > 0.8, "the child's CPU belongs to the run"
    procs = client_for(store).get_metric_history(run.info.run_id, "system/process_tree/processes")
    assert max(p.value for p in procs) == 2


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGTERM, 7), (signal.SIGINT, 130)])
def test_signals_are_forwarded_and_the_exit_code_kept(store, tmp_path, sig, expected):
    ready = tmp_path / "ready"
    code = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"  # clean stop on SIGTERM
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)\n"  # SIGINT: Python's KeyboardInterrupt, exit by signal (130)
    )
    name = f"sig-{sig.name}"
    p = subprocess.Popen(
        [*TANDEM, "run", "--store", f"sqlite:///{store}", "-q", "-n", name, *python_c(code)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,  # not in a terminal's foreground, even under `pytest -s`
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and p.poll() is None, "the command did not start"
        time.sleep(0.05)
    p.send_signal(sig)
    assert p.wait(60) == expected, p.stderr.read()
    run = find_run(store, name)
    assert run.info.status == "KILLED"
    assert run.data.tags["tandem.exit_code"] in ("7", "-2")


def test_bad_input_clear_errors(store, tmp_path):
    r = tandem_run(store, "--", "no-such-command-xyz", cwd=tmp_path)
    assert r.returncode == 127 and "no-such-command-xyz: command not found" in r.stderr
    r = tandem_run(store, "--", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 126 and "not an executable" in r.stderr
    r = tandem_run(store, "-i", "0.01", "--", "true")
    assert r.returncode == 2 and "interval must be between 0.1" in r.stderr
    r = tandem_run(store, "-i", "abc", "--", "true")
    assert r.returncode == 2 and "abc" in r.stderr
    r = tandem_run(store, "-t", "novalue", "--", "true")
    assert r.returncode == 2 and "'novalue' is not KEY=VALUE" in r.stderr
    r = tandem_run(store, "-t", "bad key!=1", "--", "true")
    assert r.returncode == 2 and "tag key" in r.stderr
    r = tandem_run(store, "--", "true", env={**os.environ, "TANDEM_WATTS_PER_CORE": "abc"})
    assert r.returncode == 2 and "TANDEM_WATTS_PER_CORE='abc' is not a number" in r.stderr
    script = tmp_path / "no-shebang"
    script.write_text("echo hi\n")
    script.chmod(0o755)
    r = tandem_run(store, "--", str(script))
    assert r.returncode == 126 and "no-shebang" in r.stderr
    assert not list(tmp_path.glob("tandem-runs")), "no run was made for a command that cannot start"


def test_usage_errors_come_before_the_trackers_imports():
    # -X importtime lists every module imported; a usage error must need none of the heavy ones.
    argv = [sys.executable, "-X", "importtime", "-m", "tandem.cli", "run", "-i", "0.01", "--", "true"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "interval must be between 0.1" in r.stderr
    imported = {
        line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")
    }
    assert "click" in imported, "the import list was read"
    assert not imported & {"torch", "mlflow", "psutil", "rich", "tandem.watch.tracker", "tandem.share"}


def test_unreachable_store_falls_back_to_a_local_file(tmp_path):
    (tmp_path / "not-a-dir").write_text("")  # MLflow cannot create its database under a file
    r = tandem("run", "--store", f"sqlite:///{tmp_path}/not-a-dir/mlflow.db", "-q", "-n", "fb", "-i", "0.2",
               *python_c(BUSY.format(s=0.5)), cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "warning" in r.stderr and "tandem-runs" in r.stderr, r.stderr
    (run_dir,) = (tmp_path / "tandem-runs").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "FINISHED" and meta["name"] == "fb"
    keys = {line.split(",")[2] for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]}
    assert "system/process_tree/cpu_percent" in keys and "summary/cpu_seconds" in keys
    assert "output.log" in os.listdir(run_dir)


def test_file_sinks_csv_and_parquet(tmp_path):
    for fmt in ("csv", "parquet"):
        out = tmp_path / fmt
        r = tandem("run", "--sink", fmt, "--out", str(out), "-q", "-n", f"f-{fmt}", "-i", "0.2",
                   *python_c(BUSY.format(s=0.5)), cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0, r.stderr
        (run_dir,) = out.iterdir()
        assert (run_dir / "metrics.csv").stat().st_size > 100
    import pyarrow.parquet as pq

    (run_dir,) = (tmp_path / "parquet").iterdir()
    table = pq.read_table(run_dir / "metrics.parquet")
    assert table.column_names == ["timestamp_ms", "step", "key", "value"]
    assert "summary/duration_s" in set(table.column("key").to_pylist())
