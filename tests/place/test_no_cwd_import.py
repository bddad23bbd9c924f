"""Nothing tandem starts imports from the directory a job was submitted from: a ``tandem``
package planted there (it writes a marker and exits) is never run by the job's supervisor,
and the job runs as submitted, in that directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.place.conftest import Cli
from tests.place.test_daemon import FAST
from tests.timing import scaled

PLANTED = "import os, sys\nopen({marker!r}, 'a').write(repr(sys.argv) + '\\n')\nos._exit(7)\n"


def _plant(folder: Path, marker: Path) -> None:
    # tandem itself, what a Ray head would import, what a call's job unpickles with
    for name in ("tandem", "ray", "cloudpickle"):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(PLANTED.format(marker=str(marker)))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the console script's way needs python -P")
def test_a_tandem_package_in_the_jobs_directory_is_never_imported(cli: Cli, tmp_path: Path) -> None:
    work, marker = tmp_path / "work", tmp_path / "planted-ran"
    _plant(work, marker)
    cli("daemon", "start", "--cpus", "2", *FAST)

    def there(*args: str) -> subprocess.CompletedProcess:
        # As the ``tandem`` console script runs (its bin/ directory first on sys.path, not
        # the current one), from the folder with the planted package.
        return subprocess.run(
            [sys.executable, "-P", "-m", "tandem.cli", *args],
            env=cli.env, cwd=work, capture_output=True, text=True, timeout=scaled(60),
        )  # fmt: skip

    submitted = there("submit", "--", "/bin/sh", "-c", "echo hello; pwd -P")
    assert submitted.returncode == 0, submitted.stderr
    job = int(submitted.stdout)
    waited = there("wait", str(job))
    shown = cli.job(job)
    assert not marker.exists(), f"the planted package ran: {marker.read_text()}"
    assert waited.returncode == 0, (waited.stderr, shown)
    assert (shown["state"], shown["exit_code"]) == ("succeeded", 0), shown
    log = there("logs", str(job)).stdout.split()
    assert log == ["hello", os.path.realpath(work)], "the job runs as submitted, in its directory"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the console script's way needs python -P")
def test_a_call_finds_the_callers_modules_but_never_a_planted_tandem(cli: Cli, tmp_path: Path) -> None:
    """``tandem.jobs.call`` of a function of a module in the caller's directory (pickled by
    reference): its job imports that module from there, and tandem from where it is installed."""
    work, marker = tmp_path / "work", tmp_path / "planted-ran"
    _plant(work, marker)
    (work / "mymod.py").write_text("def triple(x):\n    return 3 * x\n")
    cli("daemon", "start", "--cpus", "2", *FAST)
    # The caller finds its module last on its path (tandem, installed, before it).
    code = (
        "import sys; sys.path.append('.'); import mymod, tandem.jobs\n"
        "print(tandem.jobs.call(mymod.triple, 14, cpus=0.5).result(timeout=float(sys.argv[1])))"
    )
    r = subprocess.run(
        [sys.executable, "-P", "-c", code, str(scaled(60))],
        env=cli.env, cwd=work, capture_output=True, text=True, timeout=scaled(90),
    )  # fmt: skip
    assert not marker.exists(), f"the planted package ran: {marker.read_text()}"
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
