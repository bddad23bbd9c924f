"""The tandem command line, run as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tandem
from tandem.share import Consumer
from tandem.share.spec import SpecError, load_object
from tests.timing import scaled

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
        with Consumer("cli-demo", timeout=scaled(30)) as c:
            it = iter(c)
            first = next(it)
            listing = _tandem("share", "ls", "--json")
            assert listing.returncode == 0, listing.stderr
            rows = json.loads(listing.stdout)
            assert [r["name"] for r in rows] == ["cli-demo"]
            assert rows[0]["consumers"][0]["pid"] == os.getpid()
            table = _tandem("share", "ls", env={**os.environ, "COLUMNS": "80"})
            assert "cli-demo" in table.stdout and str(os.getpid()) in table.stdout
            lines = table.stdout.splitlines()
            assert all(len(line) <= 80 for line in lines), table.stdout
            assert "…" not in table.stdout and "stall s" in table.stdout and "attached s" in table.stdout
            ids = first["i"].tolist() + [i for b in it for i in b["i"].tolist()]
        assert ids == list(range(20))
        out, err = serve.communicate(timeout=scaled(30))
        assert serve.returncode == 0, err
        assert "served 1 epoch" in err
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)


def test_serve_an_image_folder_decoded_once_by_the_producer(runtime_dir, tmp_path):
    from tandem.bench.images import make_image_folder

    root = make_image_folder(tmp_path / "img", images=20, classes=2, min_side=32, max_side=48)
    serve = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "share", "serve", "cli-img", "--images", str(root),
         "--device", "cpu", "--crop", "16", "--batch-size", "8", "--epochs", "1", "--shuffle"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    try:
        with Consumer("cli-img", batch_size=5, timeout=scaled(30)) as c:
            seen = []
            for b in c:
                assert b["image"].shape == (5, 3, 16, 16) and b["label"].shape == (5,)
                seen += b["index"].tolist()
        assert sorted(seen) == list(range(20))
        _, err = serve.communicate(timeout=scaled(30))
        assert serve.returncode == 0, err
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)


def test_ls_with_no_producers(runtime_dir):
    result = _tandem("share", "ls")
    assert result.returncode == 0 and "no producers" in result.stdout


def test_ls_does_not_import_torch(runtime_dir):
    # `tandem share ls` took 3 s when listing producers pulled in torch through tandem.share.
    code = (
        "import sys\nfrom tandem.cli import main\n"
        "try:\n    main(['share', 'ls'], standalone_mode=False)\nfinally:\n"
        "    print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "no producers" in result.stdout and "torch not loaded" in result.stdout


def test_serve_usage_errors_are_clear(runtime_dir):
    none = _tandem("share", "serve", "x")
    assert none.returncode == 2 and "exactly one of --loader" in none.stderr
    two = _tandem("share", "serve", "x", "--images", ".", "--loader", "tests.share.workers:make_list_loader")
    assert two.returncode == 2 and "--images DIR" in two.stderr
    empty = _tandem("share", "serve", "x", "--images", "src", "--device", "cpu")
    assert empty.returncode == 2 and ("no class folders" in empty.stderr or "no images" in empty.stderr)
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
        second = _tandem("share", "serve", "seen", "--loader", "tests.share.workers:make_list_loader")
        assert second.returncode == 1 and "already serving" in second.stderr
        assert "serving 'seen'" not in second.stderr, "only a producer that holds the name says so"
        serve.terminate()
        assert serve.wait(20) == 0, "SIGTERM stops the producer cleanly"
        assert "no producers" in _tandem("share", "ls").stdout
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)


def test_version_and_serve_help():
    version = _tandem("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"tandem, version {tandem.__version__}"
    usage = _tandem("share", "serve", "--help")
    assert usage.returncode == 0
    assert "MODULE:FUNCTION or path/to/file.py:FUNCTION" in usage.stdout
    assert "--loader path/to/loaders.py:make_loader" in usage.stdout


def test_load_object_module_and_file_forms(tmp_path):
    assert load_object("json:dumps") is json.dumps
    assert load_object("os:path.join") is os.path.join  # a dotted attribute
    loaders = tmp_path / "my_loaders.py"
    loaders.write_text("def make_loader():\n    return [[1, 2], [3]]\n")
    assert load_object(f"{loaders}:make_loader")() == [[1, 2], [3]]
    for ref, why in [
        ("json", "is not of the form MODULE:FUNCTION or path/to/file.py:FUNCTION"),
        ("json:no_such_attr", "module 'json' has no attribute 'no_such_attr'"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        (f"{tmp_path}/missing.py:f", "no such file"),
        (f"{loaders}:nope", "has no attribute 'nope'"),
    ]:
        with pytest.raises(SpecError, match=why):
            load_object(ref)


# The modules of tandem's extras (pyproject.toml): tandem.share must work without them.
EXTRAS_MODULES = ("mlflow", "matplotlib", "PIL", "pynvml")


def _modules_after(statement: str) -> list[str]:
    probe = f"import sys; {statement}; print(','.join(m for m in {EXTRAS_MODULES!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [m for m in result.stdout.strip().split(",") if m]


def test_share_and_the_cli_import_none_of_the_extras():
    # torch itself imports pynvml where it is installed: only what tandem adds counts.
    by_torch = set(_modules_after("import torch"))
    assert set(_modules_after("import tandem.share")) <= by_torch
    assert _modules_after("import tandem.cli") == []


def _without(modules: tuple[str, ...], *argv: str) -> subprocess.CompletedProcess:
    """``tandem ARGV...`` in a process where ``modules`` cannot be imported, as where the
    extra that brings them is not installed."""
    code = (
        f"import sys\nfor m in {modules!r}: sys.modules[m] = None\n"
        f"from tandem.cli import main\nmain({list(argv)!r}, prog_name='tandem')"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_missing_extra_is_named(tmp_path):
    demo = _without(("PIL",), "demo", "--no-track", "--workdir", str(tmp_path))
    assert demo.returncode == 1, demo.stderr
    assert "`tandem demo` needs 'PIL'" in demo.stderr and "pip install 'tandem[bench]'" in demo.stderr
    # Said before the run lookup, which would fail first here (no store in tmp_path).
    report = _without(("matplotlib",), "report", "some-run", "--store", f"sqlite:///{tmp_path}/no.db")
    assert report.returncode == 1, report.stderr
    assert "`tandem report` needs 'matplotlib'" in report.stderr
    assert "pip install 'tandem[watch]'" in report.stderr and "Traceback" not in report.stderr
    for argv in (("ui",), ("run", "--", "true")):
        r = _without(("mlflow",), *argv)
        assert r.returncode == 1 and f"`tandem {argv[0]}` needs 'mlflow'" in r.stderr, r.stderr
        assert "pip install 'tandem[watch]'" in r.stderr and "Traceback" not in r.stderr


def test_an_unknown_option_before_the_command_is_a_usage_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tandem.cli", "run", "--nmae", "foo", "--", "true"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "No such option '--nmae'. Did you mean '--name'?" in r.stderr
    # ... while the command's own options after it are the command's
    argv = ["run", "--sink", "csv", "--out", str(tmp_path), "-q", sys.executable, "-c",
            "import sys; assert sys.argv[1] == '--lr'", "--lr"]  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "tandem.cli", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
