"""`tandem report` and `tandem ui` on real tracked runs in a real MLflow SQLite store."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.other_user import other_user  # noqa: F401 (the fixture, asked for where it can be)
from tests.timing import scaled
from tests.watch.test_run import BUSY, TANDEM, python_c, start_run, tandem, tandem_run


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A store holding a collocated pair (group g) and one run on its own."""
    root = tmp_path_factory.mktemp("report")
    store = root / "mlflow.db"
    tandem_run(store, "-q", "-n", "solo", "-i", "0.2", *python_c(BUSY.format(s=0.6)))
    pair = [
        start_run(store, "-q", "-n", n, "-g", "g", "-i", "0.2", *python_c(BUSY.format(s=s)))
        for n, s in (("p1", 1.0), ("p2", 0.6))
    ]
    assert all(p.wait(scaled(80)) == 0 for p in pair)  # a deadline that holds on a busy machine
    return store


def report(store, *args):
    return tandem("report", "--store", f"sqlite:///{store}", *args)


def test_png_of_a_group_and_a_run_with_summary_table(tracked, tmp_path):
    out = tmp_path / "fig.png"
    r = report(tracked, "group:g", "solo", "-o", str(out))
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert "p1 (g)" in r.stdout and "p2 (g)" in r.stdout and "solo" in r.stdout
    assert "CPU time" in r.stdout and "energy: CPU, estimated" in r.stdout


def test_html_has_the_figure_and_the_table(tracked, tmp_path):
    out = tmp_path / "r.html"
    r = report(tracked, "p1", "p2", "-o", str(out), "-m", "system/process_tree/cpu_percent")
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "data:image/png;base64," in page and "<table>" in page and "peak memory, PSS" in page


def test_unknown_run_lists_recent_runs(tracked, tmp_path):
    r = report(tracked, "no-such-run", "-o", str(tmp_path / "x.png"))
    assert r.returncode == 2
    assert "no run 'no-such-run'" in r.stderr and "Recent runs:" in r.stderr
    assert "p1" in r.stderr and "solo" in r.stderr
    r = report(tracked, "solo", "-o", str(tmp_path / "x.txt"))
    assert r.returncode == 2 and "use a .png, .pdf, .svg or .html file" in r.stderr
    r = report(tracked, "solo", "-m", "no/such/metric", "-o", str(tmp_path / "x.png"))
    assert r.returncode == 1 and "none of the chosen metrics" in r.stderr


def test_report_of_a_file_store_run(tmp_path):
    out = tmp_path / "runs"
    r = tandem("run", "--sink", "csv", "--out", str(out), "-q", "-n", "filed", "-i", "0.2",
               *python_c(BUSY.format(s=0.5)), cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    (run_dir,) = out.iterdir()
    r = tandem("report", str(run_dir), "-o", str(tmp_path / "f.png"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "f.png").stat().st_size > 10_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shm_dirs() -> set[str]:
    """MLflow's server makes its job queue's directory in /dev/shm (``tmpXXXXXXXX``)."""
    return {p.name for p in Path("/dev/shm").glob("tmp*") if p.is_dir()}


def _ask(port: int, path: str, headers: dict | None = None, data: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


SEARCH = "/api/2.0/mlflow/experiments/search"
JSON = {"Content-Type": "application/json"}


def test_ui_serves_the_store_to_its_user_alone(tracked, tmp_path, request):
    """tandem ui: its user reads the store; MLflow listens on no TCP port (a socket in the
    private runtime directory); a foreign Host or Origin is refused; another local user's
    connection is closed unanswered (when a second user can be made here)."""
    try:
        other = request.getfixturevalue("other_user")
    except pytest.skip.Exception as why:
        other, no_other = None, str(why)
    shm_before = _shm_dirs()
    port = _free_port()
    runtime = Path(f"/tmp/tt-ui-{os.getpid()}")
    p = subprocess.Popen(
        [*TANDEM, "ui", "--store", f"sqlite:///{tracked}", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "TANDEM_RUNTIME_DIR": str(runtime)},
    )
    try:
        deadline = time.monotonic() + scaled(90)
        while not _healthy(port):
            assert p.poll() is None, p.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the MLflow UI did not come up in 90 s"
            time.sleep(0.5)
        status, body = _ask(port, SEARCH, JSON, b'{"max_results": 10}')
        assert status == 200 and b'"tandem"' in body, "the UI serves the tracked store"
        status, page = _ask(port, "/")
        assert status == 200 and b"<html" in page.lower()
        listening = {
            c.laddr.port
            for proc in psutil.Process(p.pid).children(recursive=True)
            for c in proc.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening == set(), f"MLflow listens on TCP {listening}: only the gate may"
        assert (runtime / "ui" / f"mlflow-{port}.sock").exists()
        assert _ask(port, SEARCH, {**JSON, "Host": f"evil.example:{port}"}, b"{}")[0] == 403  # rebinding
        other_port = {**JSON, "Origin": "http://127.0.0.1:18999"}  # another port's page, in the browser
        assert _ask(port, SEARCH, other_port, b"{}")[0] == 403
        same = _ask(port, SEARCH, {**JSON, "Origin": f"http://127.0.0.1:{port}"}, b'{"max_results": 10}')
        assert same[0] == 200, same
        if other is not None:
            code = (
                "import urllib.request, sys\n"
                f"req = urllib.request.Request('http://127.0.0.1:{port}{SEARCH}', data=b'{{}}', "
                "headers={'Content-Type': 'application/json'})\n"
                "try:\n    print(urllib.request.urlopen(req, timeout=10).read()[:200])\n"
                "except Exception as exc:\n    print('refused', type(exc).__name__, exc)\n"
            )
            r = other.run([other.python, "-c", code])
            assert r.stdout.startswith("refused") and "tandem" not in r.stdout, (r.stdout, r.stderr)
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        shutil.rmtree(runtime, ignore_errors=True)
    assert _shm_dirs() <= shm_before, "the server left a directory in /dev/shm"
    if other is None:
        pytest.skip(f"all but another user's try checked; {no_other}")


def _healthy(port: int) -> bool:
    try:
        return _ask(port, "/health")[0] == 200
    except OSError:  # not listening yet
        return False


def test_group_total_of_rates_is_averaged_on_a_common_grid():
    from tandem.watch.report import Panel, _total

    # Two runs each using one core all the time, sampled half an interval apart: the server
    # carried 200%, and the total must not show the 300% a sum of raw steps gives.
    a = [(float(t), 100.0) for t in range(0, 11)]
    b = [(t + 0.5, 100.0) for t in range(0, 10)]
    grid, total = _total([a, b], Panel("cpu", "x", rate=True))
    inner = [v for t, v in zip(grid, total) if 1.0 < t < 9.5]
    assert inner and max(inner) <= 200.0 + 1e-6 and min(inner) >= 200.0 - 1e-6
    # levels: a run that ended counts 0 afterwards, unless it is a running total
    levels = [[(0.0, 1.0), (5.0, 1.0)], [(0.0, 2.0), (10.0, 2.0)]]
    grid, total = _total(levels, Panel("mem", "x"))
    assert total[0] == 3.0 and total[-1] == 2.0
    grid, total = _total(levels, Panel("energy", "x", cumulative=True))
    assert total[-1] == 3.0


def test_group_total_of_levels_steps_where_its_lines_do():
    from tandem.watch.report import Panel, _total

    # Two running totals (data stall, say) that step at 9.05 and 9.1 s: the total steps at
    # those very times (a grid of whole intervals drew it up to one interval late).
    a = [(0.0, 0.0), (9.05, 2.2), (10.1, 2.5)]
    b = [(0.5, 0.0), (9.1, 2.3), (10.2, 2.8)]
    grid, total = _total([a, b], Panel("stall", "x", cumulative=True))
    at = dict(zip(grid.tolist(), total.tolist()))
    assert at[9.05] == pytest.approx(2.2) and at[9.1] == pytest.approx(4.5)
    assert at[10.1] == pytest.approx(4.8) and at[10.2] == pytest.approx(5.3)
    assert at[0.0] == 0.0 and sorted(at) == [0.0, 0.5, 9.05, 9.1, 10.1, 10.2]
