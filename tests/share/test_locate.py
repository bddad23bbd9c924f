"""``share define``'s check from source (tandem.share._locate): it confirms only what the
source settles, and every other reference goes to the import, whose errors are the user's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tandem.share._locate import confirmed
from tandem.share.spec import ShareSpec, SpecError


@pytest.mark.parametrize(
    ("source", "settled"),
    [
        ("import torch\n\ndef train_set():\n    return torch.arange(4)\n", True),
        ("import no_such_pkg_xyz\n\ndef train_set():\n    return [1]\n", True),  # its producer's to meet
        ("def train_set(n=4, *, seed=0, **kw):\n    return list(range(n))\n", True),
        ("class train_set:\n    def __init__(self, n=3):\n        self.n = n\n", True),
        ("if True:\n    def train_set():\n        return [1]\n", True),
        ("def train_set(n):\n    return list(range(n))\n", False),  # needs an argument
        ("def train_set(*, n):\n    return n\n", False),
        ("class train_set:\n    def __init__(self, n):\n        self.n = n\n", False),
        ("class train_set(Base):\n    pass\n", False),  # its base's __init__: unknown here
        ("import functools\ntrain_set = functools.partial(list, [1])\n", False),  # assigned
        ("from data_lib import train_set\n", False),  # imported
        ("def train_set():\n    return [1]\ntrain_set = None\n", False),  # bound again
        ("def train_set():\n    return [1]\nfrom other import *\n", False),
        ("import functools\n@functools.cache\ndef train_set():\n    return [1]\n", False),
        ("def train_set():\n    return [1]\nglobals()['train_set'] = 3\n", False),
        ("def train_set():\n    return [1]\ndef swap():\n    global train_set\n    train_set = 2\n", False),
        ("def train_sets():\n    return [1]\n", False),  # absent: the import says so
        ("def train_set(:\n", False),  # a syntax error: the import says so
    ],
)
def test_the_source_settles_only_a_function_or_class_callable_with_no_arguments(
    tmp_path: Path, source: str, settled: bool
) -> None:
    path = tmp_path / "data.py"
    path.write_text(source)
    assert confirmed(f"{path}:train_set") is settled


def test_a_dotted_module_is_found_without_running_its_packages(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('an __init__ that must not run')\n")
    (pkg / "data.py").write_text("def train_set():\n    return [1, 2]\n")
    monkeypatch.chdir(tmp_path)
    assert confirmed("mypkg.data:train_set")
    assert not confirmed("mypkg.nodata:train_set") and not confirmed("mypkg.data:nope")
    assert not confirmed("mypkg.data:a.b") and not confirmed("mypkg.data") and not confirmed("sys:path")


def test_define_refuses_what_the_source_leaves_open_with_the_imports_own_words(tmp_path: Path) -> None:
    (tmp_path / "typo.py").write_text("def train_set():\n    return [1]\n")
    (tmp_path / "broken.py").write_text("import no_such_pkg_xyz\ntrain_set = list\n")
    spec = ShareSpec("x", "dataset", f"{tmp_path / 'typo.py'}:trian_set")
    with pytest.raises(SpecError, match="has no attribute 'trian_set'"):
        spec.check(import_module=False)
    spec = ShareSpec("x", "dataset", f"{tmp_path / 'broken.py'}:train_set")
    with pytest.raises(SpecError, match="No module named 'no_such_pkg_xyz'"):
        spec.check(import_module=False)


def test_a_settled_reference_is_checked_without_importing_its_module(tmp_path: Path) -> None:
    """What the check is for: ``share define`` of a torch dataset imports no torch."""
    (tmp_path / "data.py").write_text("import torch\n\ndef train_set():\n    return torch.arange(4)\n")
    ref = f"{tmp_path / 'data.py'}:train_set"
    code = (
        "import sys; from tandem.share.spec import ShareSpec; "
        f"ShareSpec('x', 'dataset', {ref!r}).check(import_module=False); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
