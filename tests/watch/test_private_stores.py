"""The stores ``tandem run`` and ``tandem ui`` make are their user's alone (the SQLite file
0600, the artifacts folder beside it 0700, whatever the umask), and ``tandem ui`` ends its
MLflow server and that server's uvicorn however it ends itself (real processes)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.timing import until
from tests.watch.test_report import _free_port, _healthy
from tests.watch.test_run import TANDEM, python_c, tandem

LOGS = "import mlflow\nmlflow.log_metric('x', 1.0)\nprint('private output')\n"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _umask_022() -> None:
    os.umask(0o022)  # a default umask: what MLflow alone would make 0644 and 0755


def test_tandem_run_makes_a_new_default_store_private(tmp_path: Path) -> None:
    r = tandem("run", "-q", *python_c(LOGS), cwd=tmp_path, preexec_fn=_umask_022)
    assert r.returncode == 0, r.stderr
    stores = list(tmp_path.glob("mlflow.db*"))  # the file, its lock, a -wal/-shm/-journal if left
    assert tmp_path / "mlflow.db" in stores
    assert {p.name: _mode(p) for p in stores} == {p.name: 0o600 for p in stores}
    assert _mode(tmp_path / "mlruns") == 0o700  # the runs' artifacts: output.log among them
    assert list((tmp_path / "mlruns").rglob("output.log")), "the run's output is kept there"


def _tree(pid: int) -> list[psutil.Process]:
    top = psutil.Process(pid)
    return [top, *top.children(recursive=True)]


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGHUP", "the server dies"])
def test_tandem_ui_makes_its_store_private_and_ends_its_server_and_uvicorn(tmp_path: Path, how: str) -> None:
    port = _free_port()
    runtime = tmp_path / "rt"
    marker = tmp_path / "planted-ran"
    for name in ("uvicorn", "yaml"):  # what MLflow's server imports as it starts uvicorn here
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('ran')\n")
    ui = subprocess.Popen(
        [*TANDEM, "ui", "--port", str(port)],  # no --store: ./mlflow.db
        cwd=tmp_path,
        env={**os.environ, "TANDEM_RUNTIME_DIR": str(runtime)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_umask_022,
    )
    try:
        until(lambda: _healthy(port) or ui.poll() is not None, 90, "the MLflow UI coming up")
        assert ui.poll() is None, ui.stderr.read().decode()[-2000:] if ui.stderr else ""
        assert not marker.exists(), "a package planted in the folder tandem ui was started in ran"
        assert _mode(tmp_path / "mlflow.db") == 0o600
        assert {p.name: _mode(p) for p in tmp_path.glob("mlflow.db*")} == {
            p.name: 0o600 for p in tmp_path.glob("mlflow.db*")
        }
        children = _tree(ui.pid)[1:]
        names = " ".join(" ".join(p.cmdline()) for p in children)
        assert "mlflow server" in names and "uvicorn" in names, names
        if how == "the server dies":  # its uvicorn lives on: tandem ui ends it as it exits
            (server,) = [p for p in children if p.ppid() == ui.pid]
            server.kill()
            expected = None
        else:
            ui.send_signal(getattr(signal, how))  # to tandem ui alone, not to its group
            expected = 130 if how == "SIGINT" else 128 + getattr(signal, how)
        code = ui.wait(timeout=60)
        assert expected is None or code == expected, (code, ui.stderr.read() if ui.stderr else "")
        until(lambda: not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
              30, lambda: f"left running: {[p.cmdline() for p in children if p.is_running()]}")  # fmt: skip
    finally:
        if ui.poll() is None:
            ui.kill()
            ui.wait()
        for proc in psutil.process_iter(["cmdline"]):  # whatever the test left: its own store's server
            if f"{tmp_path}" in " ".join(proc.info["cmdline"] or []):
                proc.kill()


def test_tandem_ui_says_in_a_line_where_its_store_cannot_be_made(tmp_path: Path) -> None:
    r = tandem("ui", "--store", "sqlite:////proc/no-such-dir/mlflow.db", "--port", str(_free_port()),
               cwd=tmp_path, env={**os.environ, "TANDEM_RUNTIME_DIR": str(tmp_path / "rt")})  # fmt: skip
    assert r.returncode == 1 and "cannot make the store sqlite:////proc/no-such-dir/mlflow.db" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="makes files of another uid (root; CI is root)")
@pytest.mark.parametrize("planted", ["file", "link"])
def test_a_store_planted_by_another_user_is_refused(tmp_path: Path, planted: str) -> None:
    """Another user's ``./mlflow.db`` (or their link to a file of theirs) in a shared folder
    would get this user's runs (tags, output): ``tandem ui`` and ``tandem run`` refuse it."""
    theirs = tmp_path / "theirs.db"
    theirs.write_bytes(b"")
    os.chown(theirs, 12345, 12345)
    db = tmp_path / "mlflow.db"
    if planted == "link":
        db.symlink_to(theirs)
        os.lchown(db, 12345, 12345)
    else:
        theirs.rename(db)
    env = {**os.environ, "TANDEM_RUNTIME_DIR": str(tmp_path / "rt")}
    env.pop("MLFLOW_TRACKING_URI", None)
    r = tandem("ui", "--port", str(_free_port()), cwd=tmp_path, env=env)
    assert r.returncode == 1 and "belongs to uid 12345, not to you" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    ran = tandem("run", "--", "/bin/echo", "secret-output", cwd=tmp_path, env=env)
    assert "secret-output" not in (tmp_path / "theirs.db" if planted == "link" else db).read_bytes().decode(
        errors="replace"
    )
    assert "belongs to uid 12345" in ran.stderr, ran.stderr
