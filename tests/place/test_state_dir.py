"""One way to the state directory for every command: a shared, another user's or a
symlinked state directory is refused by each (exit 2, one line, no traceback, nothing
written); select then submit in a new one works, and it is private (0700, files 0600); a
lost database never gives a new job an old result."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.place.conftest import Cli

DATA = "import torch\ndef ds():\n    return [(torch.tensor([float(i)]), i % 2) for i in range(40)]\n"
COMMANDS = [
    ("ls",),
    ("show", "1"),
    ("logs", "1"),
    ("wait", "1"),
    ("cancel", "1"),
    ("submit", "--", "true"),
    ("daemon", "start"),
    ("daemon", "status"),
    ("daemon", "stop"),
    ("select", "run", "--dataset", "data:ds", "--method", "random", "--budget", "0.5"),
    ("select", "ls"),
    ("share", "define", "s", "--dataset", "data:ds"),
    ("share", "rm", "s"),
    ("dashboard", "--no-open", "--port", "0"),
    ("report", "group:g"),
]


def _listing(path: Path) -> list[tuple[str, int]]:
    return sorted((str(p), p.lstat().st_mode) for p in path.rglob("*")) + [("", path.lstat().st_mode)]


def _refusing(tmp_path: Path, kind: str) -> Path:
    target = tmp_path / kind
    if kind == "shared":
        target.mkdir(mode=0o777)
        os.chmod(target, 0o1777)
    elif kind == "foreign":
        if os.getuid() != 0:
            pytest.skip("making a directory another user owns needs root")
        target.mkdir(mode=0o700)
        os.chown(target, 65534, 65534)
    else:
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        target.symlink_to(real)
    return target


@pytest.mark.parametrize("kind", ["shared", "foreign", "link"])
def test_every_command_refuses_a_state_dir_it_may_not_use(cli: Cli, tmp_path: Path, kind: str) -> None:
    target = _refusing(tmp_path, kind)
    (tmp_path / "data.py").write_text(DATA)
    cli.env["TANDEM_STATE_DIR"] = str(target)
    before = _listing(target)
    for args in COMMANDS:
        r = cli(*args, check=False, timeout=60)
        said = r.stderr.strip().splitlines()
        assert r.returncode == 2, f"tandem {' '.join(args)} -> {r.returncode}: {r.stderr}"
        assert "Traceback" not in r.stderr and len(said) == 1, f"tandem {' '.join(args)}: {r.stderr}"
        assert "state directory" in said[0] and "TANDEM_STATE_DIR" in said[0]
    assert _listing(target) == before, "nothing written in a refused state directory"


def test_select_then_submit_in_a_new_state_dir(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(DATA)
    sel = cli("select", "run", "--dataset", "data:ds", "--method", "random", "--budget", "0.5").stdout.strip()
    assert stat.S_IMODE(cli.state.stat().st_mode) == 0o700
    job = cli.submit("--", sys.executable, "-c", "print('ran')")
    assert cli("wait", str(job), timeout=60).returncode == 0
    assert cli("logs", str(job)).stdout.strip() == "ran"
    private = [cli.state / "place.db", cli.state / "mlflow.db", *(cli.state / "selections" / sel).iterdir()]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in private), {
        str(p): oct(p.stat().st_mode) for p in private
    }


def test_a_lost_database_never_gives_a_new_job_an_old_result(cli: Cli, tmp_path: Path) -> None:
    old = cli.submit("--", "echo", "OLD")
    assert cli("wait", str(old), timeout=60).returncode == 0
    cli("daemon", "stop")
    for f in cli.state.glob("place.db*"):  # lost: deleted, or never reached the disk
        f.unlink()
    new = cli.submit("--", "sh", "-c", "sleep 1; echo fresh")
    assert new == old == 1, "ids start again: the old job's directory would be the new one's"
    first = cli.job(new)
    assert first["state"] in ("queued", "running"), first
    assert cli("wait", str(new), timeout=60).returncode == 0
    assert cli("logs", str(new)).stdout.strip() == "fresh"
    (aside,) = cli.state.glob("jobs.lost-*")
    (old_folder,) = (aside / "1").glob("1.*")
    assert (old_folder / "output.log").read_text().strip() == "OLD", "the old job's files kept aside"
