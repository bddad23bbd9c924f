"""One way to the state directory for every command: a shared, another user's or a
symlinked state directory is refused by each (exit 2, one line, no traceback, nothing
written); select then submit in a new one works, and it is private (0700, files 0600); a
lost database never gives a new job an old result."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from tests.other_user import OtherUser, other_user  # noqa: F401 (the fixture)
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


def test_the_library_refuses_what_the_commands_refuse(cli: Cli, tmp_path: Path) -> None:
    import tandem.jobs
    from tandem.place.state import StateError

    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(StateError, match="symbolic link"):
        tandem.jobs.submit(["true"], state_dir_path=tmp_path / "link")
    assert list(real.iterdir()) == [], "no daemon started, no log written through the link"


def test_another_user_without_a_runtime_dir_of_theirs_is_not_locked_out(other_user: OtherUser) -> None:  # noqa: F811
    """/tmp/tandem-<uid> made first by someone else: their commands use a private directory of
    their own instead, the same one for each command (the daemon is found), said once."""
    squatted = Path(f"/tmp/tandem-{other_user.uid}")
    squatted.mkdir(mode=0o700)  # root's, as if another user had made it first
    try:
        env = other_user.env(TANDEM_STATE_DIR=str(other_user.home / "state"))
        said = []
        for args in (["daemon", "start", "--cpus", "1", "--mem", "1G"], ["submit", "--", "echo", "hi"],
                     ["wait", "1"], ["logs", "1"], ["daemon", "stop"]):  # fmt: skip
            r = other_user.run(other_user.tandem(*args), env=env)
            assert r.returncode == 0, f"tandem {' '.join(args)}: {r.stderr}"
            said += [line for line in r.stderr.splitlines() if "private runtime directory" in line]
            if args[0] == "logs":
                assert r.stdout.strip() == "hi"
        assert len(said) == 1 and str(squatted) in said[0], said
        private = Path(said[0].split("private runtime directory ")[1].split()[0])
        assert set(Path("/tmp").glob(f"tandem-{other_user.uid}-*")) == {private}, "one, found again by each"
        assert private.stat().st_uid == other_user.uid and stat.S_IMODE(private.stat().st_mode) == 0o700
        assert os.listdir(squatted) == [], "nothing of theirs in the other user's directory"
    finally:
        squatted.rmdir()


def test_a_state_dir_whose_parent_is_not_writable_is_a_clear_error(other_user: OtherUser) -> None:  # noqa: F811
    locked = Path("/tmp") / f"tandem-locked-{os.getpid()}"
    locked.mkdir(mode=0o755)  # root's: others may enter, not write
    try:
        target = locked / "state"
        env = other_user.env(TANDEM_STATE_DIR=str(target), TANDEM_RUNTIME_DIR=str(other_user.home / "run"))
        r = other_user.run(other_user.tandem("ls"), env=env)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "cannot create state directory" in r.stderr and "Permission denied" in r.stderr, r.stderr
        code = f"import tandem.jobs; tandem.jobs.submit(['true'], state_dir_path={str(target)!r})"
        r = other_user.run([other_user.python, "-c", code], env=env)
        assert r.returncode == 1 and "StateError: cannot create state directory" in r.stderr, r.stderr
        assert not target.exists()
    finally:
        locked.rmdir()


@pytest.mark.parametrize("setting", ["TANDEM_STATE_DIR", "TANDEM_RUNTIME_DIR"])
@pytest.mark.parametrize("way", ["their folder", "their link", "open folder"])
def test_a_dir_whose_way_another_user_could_change_is_refused(
    cli: Cli,
    other_user: OtherUser,  # noqa: F811
    setting: str,
    way: str,
) -> None:
    """Not only the directory itself: every folder and link on the way to it, from /, is the
    user's or root's, and no one else may write in a folder there (unless it is sticky, as /tmp
    is). Refused, naming that folder or link, with nothing made; a link of root's is followed."""
    top = Path(tempfile.mkdtemp(prefix="tdm-way-"))  # root's, 0700: beside no other test's
    try:
        os.chmod(top, 0o755)
        real = top / "real"
        real.mkdir(mode=0o755)
        if way == "their folder":  # another user's folder: they may rename what is in it
            crossed = real
            os.chown(real, other_user.uid, other_user.gid)
        elif way == "their link":  # another user's link: they may point it anywhere
            crossed = top / "link"
            crossed.symlink_to(real)
            os.lchown(crossed, other_user.uid, other_user.gid)
        else:  # a folder others write in, not sticky
            crossed = real
            os.chmod(real, 0o777)
        target = crossed / "tandem"
        cli.env[setting] = str(target)
        before = _listing(top)
        uses = ("ls",) if setting == "TANDEM_STATE_DIR" else ("share", "ls")  # one needs only that
        for args in (uses, ("daemon", "start")):
            r = cli(*args, check=False)
            said = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(said) == 1 and "Traceback" not in r.stderr, (args, r.stderr)
            assert f"{crossed} on the way" in said[0] and setting in said[0], said[0]
        assert _listing(top) == before, "nothing made on a way another user could change"
        if way == "their link":  # the same link, root's: followed to a folder of root's
            os.lchown(crossed, 0, 0)
            assert cli(*uses).returncode == 0
            assert stat.S_IMODE((real / "tandem").stat().st_mode) == 0o700
    finally:
        cli.stop_daemon()
        shutil.rmtree(top, ignore_errors=True)


def test_a_way_through_a_sticky_folder_is_taken(other_user: OtherUser) -> None:  # noqa: F811
    """A sticky folder others write in (/tmp) is on the way of the other user's own directories:
    theirs, below it, are used (only their owner may move them there)."""
    env = other_user.env(
        TANDEM_STATE_DIR=str(other_user.home / "state"), TANDEM_RUNTIME_DIR=str(other_user.home / "run")
    )
    assert str(other_user.home).startswith("/tmp/")
    r = other_user.run(other_user.tandem("ls"), env=env)
    assert r.returncode == 0 and not r.stderr, r.stderr  # their jobs, if an earlier test left some
