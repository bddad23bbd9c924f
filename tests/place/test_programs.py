"""A job's program is looked for at submit (:mod:`tandem.place.run.launchers.programs`): as
the job would run it, on its own PATH or from its directory, with the script given to an
interpreter; what can only be known by running it is left to the run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tandem.place.run.launchers.programs import missing_program


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "run.sh").write_text("echo 1\n")
    tool = tmp_path / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "plain").write_text("")
    return tmp_path


ENV = {"PATH": os.environ.get("PATH", os.defpath)}


@pytest.mark.parametrize(
    "command",
    [
        ["python3", "train.py", "--lr", "0.1"],
        [sys.executable, "-u", "-W", "error", "train.py"],
        ["python3", "-c", "print(1)"],
        ["python3", "-Bc", "print(1)"],
        ["python3", "-m", "json.tool"],
        ["python3", "--", "train.py"],
        ["sh", "-c", "exit 0"],
        ["sh", "-ec", "exit 0"],
        ["bash", "-o", "pipefail", "run.sh"],
        ["./bin/tool", "x"],
        ["sh", "-s"],
        ["env"],
    ],
)
def test_a_program_that_is_there_passes(here: Path, command: list[str]) -> None:
    assert missing_program(command, str(here), ENV) is None


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["pyhton", "train.py"], "no program 'pyhton' on the job's PATH"),
        (["python3", "trian.py"], "no script 'trian.py' in {here}"),
        (["python3", "-u", "-X", "dev", "sub/train.py"], "no script 'sub/train.py' in {here}"),
        (["bash", "runn.sh"], "no script 'runn.sh' in {here}"),
        (["./bin/toool"], "no program './bin/toool' in {here}"),
        (["./plain"], "'./plain' is not executable: chmod +x ./plain"),
    ],
)
def test_a_program_that_is_not_there_is_said_with_what_to_fix(
    here: Path, command: list[str], said: str
) -> None:
    problem = missing_program(command, str(here), ENV)
    assert problem is not None and said.format(here=here) in problem, problem


def test_the_job_s_own_path_is_the_one_looked_up(here: Path) -> None:
    assert missing_program(["tool"], str(here), {"PATH": str(here / "bin")}) is None
    assert "no program 'tool'" in (missing_program(["tool"], str(here), ENV) or "")
