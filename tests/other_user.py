"""A second local user for the tests of who may get in (``other_user`` fixture): made with
``useradd`` where the tests run as root, removed after the session; the tests that need one
are skipped, saying why, elsewhere."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class OtherUser:
    name: str
    uid: int
    gid: int
    home: Path  # theirs, 0700
    python: str  # an interpreter they may run, with this one's packages on its path

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment of theirs (no runtime or state directory of the tests' user)."""
        # The test session's name too: what they leave is ended with it (tests/leftovers.py).
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ", "TANDEM_TEST_SESSION")}
        path = os.pathsep.join(
            [*os.environ.get("PYTHONPATH", "").split(os.pathsep), str(SOURCE), *site.getsitepackages()]
        )
        return {
            **keep,
            "PYTHONPATH": path.strip(os.pathsep),
            "HOME": str(self.home),
            "USER": self.name,
            **extra,
        }

    def tandem(self, *args: str) -> list[str]:
        return [self.python, "-m", "tandem.cli", *args]

    def run(self, argv: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """``argv`` run as this user, its output captured."""
        kwargs.setdefault("env", self.env())
        kwargs.setdefault("cwd", self.home)
        return subprocess.run(
            argv, user=self.uid, group=self.gid, extra_groups=[], capture_output=True, text=True,
            timeout=timeout, **kwargs,
        )  # fmt: skip

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("env", self.env())
        kwargs.setdefault("cwd", self.home)
        return subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[], **kwargs)


SOURCE = Path(__file__).resolve().parents[1] / "src"  # the tree under test (an editable install's
# .pth is not read from PYTHONPATH, so it goes there itself)


def _open_the_way(paths: list[Path]) -> list[tuple[Path, int]]:
    """Let others pass through (o+x, never list or read) every folder above ``paths`` that
    stops them: a clone in ``mktemp -d`` (0700) or a venv under /root. Returns what to put
    back."""
    changed: dict[Path, int] = {}
    for path in paths:
        for folder in [path, *path.parents]:
            mode = stat.S_IMODE(folder.stat().st_mode)
            if not mode & stat.S_IXOTH and folder not in changed:
                changed[folder] = mode
                os.chmod(folder, mode | stat.S_IXOTH)
    return list(changed.items())


@pytest.fixture(scope="session")
def other_user() -> Iterator[OtherUser]:
    with local_user() as user:
        yield user


@pytest.fixture(scope="session")
def two_users() -> Iterator[tuple[OtherUser, OtherUser]]:
    """Two more local users (a lab's server: tests/place/test_system.py)."""
    with local_user() as first, local_user() as second:
        yield first, second


@contextlib.contextmanager
def local_user() -> Iterator[OtherUser]:
    """A new local user for the block (``useradd``; removed after, with what they left)."""
    if os.getuid() != 0:
        pytest.skip("needs a second local user: run as root (useradd) to test what another user can do")
    if shutil.which("useradd") is None:
        pytest.skip("needs a second local user, and there is no useradd here")
    # This interpreter may be in root's home, which they cannot enter: the system's of the
    # same version runs this one's packages (and the tree under test, on PYTHONPATH).
    python = shutil.which(
        f"python{sys.version_info[0]}.{sys.version_info[1]}", path="/usr/local/bin:/usr/bin:/bin"
    )
    if python is None:
        pytest.skip(
            f"no python{sys.version_info[0]}.{sys.version_info[1]} outside root's home for a second user"
        )
    name = f"tdm{os.getpid()}{secrets.token_hex(3)}"  # one per test module that asks for one
    home = Path(tempfile.mkdtemp(prefix=f"{name}-home-"))
    made = subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", name],
        capture_output=True, text=True,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    entry = pwd.getpwnam(name)
    _remove_runtime_dirs(entry.pw_uid)  # an earlier user's of this uid, whose run was killed before its end
    opened = _open_the_way([SOURCE, *map(Path, site.getsitepackages())])
    os.chown(home, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)
    try:
        yield OtherUser(name, entry.pw_uid, entry.pw_gid, home, python)
    finally:
        import psutil

        left = [
            p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == entry.pw_uid
        ]
        for proc in left:  # what the tests left running as them
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=10)
        subprocess.run(["userdel", name], capture_output=True)
        for folder, mode in opened:
            os.chmod(folder, mode)
        shutil.rmtree(home, ignore_errors=True)
        _remove_runtime_dirs(entry.pw_uid)


def _remove_runtime_dirs(uid: int) -> None:
    """/tmp/tandem-<uid> and /tmp/tandem-<uid>-* (tandem.dirs: a user's runtime directories)."""
    for made in [Path(f"/tmp/tandem-{uid}"), *Path("/tmp").glob(f"tandem-{uid}-*")]:
        if made.is_dir() and not made.is_symlink():
            shutil.rmtree(made, ignore_errors=True)
