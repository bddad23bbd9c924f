"""The tandem command line, run as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tandem.share import Consumer

from .share.conftest import wait_for

ROOT = Path(__file__).resolve().parents[1]


def _tandem(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "tandem.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, **kwargs)  # fmt: skip


def test_serve_ls_and_consume(runtime_dir):
    serve = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "share", "serve", "cli-demo", "--epochs", "1",
         "--window", "2", "--loader", "tests.share.workers:make_list_loader"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    try:
        with Consumer("cli-demo", timeout=30) as c:
            it = iter(c)
            first = next(it)
            listing = _tandem("share", "ls", "--json")
            assert listing.returncode == 0, listing.stderr
            rows = json.loads(listing.stdout)
            assert [r["name"] for r in rows] == ["cli-demo"]
            assert rows[0]["consumers"][0]["pid"] == os.getpid()
            table = _tandem("share", "ls")
            assert "cli-demo" in table.stdout and str(os.getpid()) in table.stdout
            ids = first["i"].tolist() + [i for b in it for i in b["i"].tolist()]
        assert ids == list(range(20))
        out, err = serve.communicate(timeout=30)
        assert serve.returncode == 0, err
        assert "served 1 epoch" in err
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)


def test_ls_with_no_producers(runtime_dir):
    result = _tandem("share", "ls")
    assert result.returncode == 0 and "no producers" in result.stdout


def test_serve_usage_errors_are_clear(runtime_dir):
    none = _tandem("share", "serve", "x")
    assert none.returncode == 2 and "exactly one of --loader" in none.stderr
    missing = _tandem("share", "serve", "x", "--loader", "no_such_module_xyz:f")
    assert missing.returncode == 2 and "cannot import 'no_such_module_xyz'" in missing.stderr
    bad_name = _tandem("share", "serve", "a/b", "--loader", "tests.share.workers:make_list_loader")
    assert bad_name.returncode == 2 and "invalid producer name" in bad_name.stderr


def test_ls_sees_a_producer_started_by_the_test(runtime_dir):
    serve = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "share", "serve", "seen",
         "--loader", "tests.share.workers:make_list_loader"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: "seen" in _tandem("share", "ls").stdout, timeout=30, what="producer listed")
        serve.terminate()
        assert serve.wait(20) == 0, "SIGTERM stops the producer cleanly"
        assert "no producers" in _tandem("share", "ls").stdout
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)
