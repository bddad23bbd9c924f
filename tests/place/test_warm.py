"""Python jobs start warm (:mod:`tandem.place.run.supervisor.warm`): forked from a
supervisor whose fork server imported torch and MLflow, yet as a fresh interpreter would run
them: the same ``sys.argv``, ``__file__``, ``sys.path[0]``, ``__main__``, working directory,
environment, session, thread counts, logging and warnings, exit codes, tracebacks, ``atexit``
and threads joined at the end. Each job is run warm and cold (``TANDEM_WARM=0``) by a real
daemon, and what the script saw of itself compared."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tandem.place.run.supervisor import warm
from tests.place.conftest import Cli

pytestmark = pytest.mark.warm  # Python jobs start warm, as a user's do

FAST = ("--settle", "0.3", "--grace", "1", "--no-host-load", "--no-track")

SEEN = r"""
import atexit, json, logging, os, sys, threading, warnings
was_warm = "torch" in sys.modules  # imported before the script's first line: a warm start
logging.basicConfig(level=logging.INFO, format="%(message)s")  # a fresh interpreter's root has no handler
logging.info("logged")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")
    warnings.warn("w", UserWarning)
import torch
def late(x: int = 0) -> None:
    import time
    time.sleep(0.3)
    print("thread joined", flush=True)
seen = {
    "argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
    "mine": os.environ.get("MINE"), "threads": torch.get_num_threads(),
    "omp": os.environ.get("OMP_NUM_THREADS"), "session": os.getsid(0) == os.getpid(),
    "stdin": sys.stdin.read(), "warned": len(caught),
    "main_is_me": sys.modules["__main__"].__dict__ is globals(),
    "filters_default": [f for f in warnings.filters if f[2] is DeprecationWarning][:1] != [],
    "code_flags": (lambda: 0).__code__.co_flags,  # no __future__ of tandem's passed on
    # what ps and top show: the job's command (a warm one retitled), its name python
    "ps": open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").decode().strip(),
    "comm": open("/proc/self/comm").read().strip(),
    "annotation": repr(late.__annotations__["x"]),
}
print(json.dumps(seen), flush=True)
print("WARM" if was_warm else "COLD", flush=True)
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=late).start()
code = sys.argv[1] if len(sys.argv) > 1 else "0"
if code == "raise":
    raise ValueError("bad value")
if code == "message":
    sys.exit("said and ended")
sys.exit(int(code))
"""


def _run(cli: Cli, *command: str, cold: bool = False, env: tuple[str, ...] = ()) -> tuple[dict, str]:
    extra = ["--env", "TANDEM_WARM=0"] if cold else []
    for e in env:
        extra += ["--env", e]
    job = cli.submit("--cpus", "1", "--env", "MINE=42", *extra, "--", *command)
    cli("wait", str(job), check=False)
    return cli.job(job), cli("logs", str(job)).stdout


@pytest.fixture
def script(cli: Cli) -> Path:
    (cli.tmp / "sub").mkdir()
    path = cli.tmp / "sub" / "seen.py"
    path.write_text(SEEN)
    cli("daemon", "start", "--cpus", "2", *FAST)
    return path


def test_a_python_job_runs_warm_as_a_fresh_interpreter_would(cli: Cli, script: Path) -> None:
    runs = {}
    for cold in (False, True):
        job, out = _run(cli, sys.executable, "sub/seen.py", "0", cold=cold)
        assert job["state"] == "succeeded", out
        lines = out.splitlines()
        assert lines[0] == "logged" and lines[-2:] == ["thread joined", "atexit ran"], out
        runs[cold] = (json.loads(lines[1]), lines[2])
    (warm_seen, warm_kind), (cold_seen, cold_kind) = runs[False], runs[True]
    assert (warm_kind, cold_kind) == ("WARM", "COLD"), "the job ran warm, and cold where told to"
    assert warm_seen == cold_seen, "what the script sees of itself is the same"
    assert warm_seen["argv"] == ["sub/seen.py", "0"] and warm_seen["file"] == str(script)
    assert warm_seen["path0"] == str(script.parent) and warm_seen["cwd"] == str(cli.tmp)
    assert warm_seen["mine"] == "42" and warm_seen["threads"] == int(warm_seen["omp"])
    assert warm_seen["session"] and warm_seen["stdin"] == "" and warm_seen["main_is_me"]


@pytest.mark.parametrize(
    ("arg", "code", "said"),
    [("3", 3, None), ("raise", 1, "ValueError: bad value"), ("message", 1, "said and ended")],
)
def test_a_warm_job_ends_with_the_code_and_words_of_a_fresh_interpreter(
    cli: Cli, script: Path, arg: str, code: int, said: str | None
) -> None:
    ends = {}
    for cold in (False, True):
        job, out = _run(cli, sys.executable, "sub/seen.py", arg, cold=cold)
        assert job["state"] == "failed"
        assert f"exit {code}" in (job["attempts"][-1]["cause"] or ""), job
        tail = out.splitlines()[3:]  # after what it saw and whether it was warm
        ends[cold] = tail
        if said:
            assert said in out and "thread joined" in out and "atexit ran" in out
    assert ends[False] == ends[True], "the same traceback (from the script's own frame), the same lines"
    if arg == "raise":
        assert ends[False][ends[False].index("Traceback (most recent call last):") + 1].startswith(
            f'  File "{script}"'
        )


def test_python_m_runs_warm_and_other_interpreters_or_environments_run_cold(cli: Cli, script: Path) -> None:
    (cli.tmp / "sub" / "__init__.py").write_text("")
    job, out = _run(cli, sys.executable, "-m", "sub.seen")
    assert job["state"] == "succeeded" and "WARM" in out.splitlines(), out
    seen = json.loads(out.splitlines()[1])
    assert seen["argv"][0] == str(script) and seen["path0"] == str(cli.tmp)
    # What the fork server imported is not what this job would import: it starts cold
    job, out = _run(cli, sys.executable, "sub/seen.py", env=("PYTHONPATH=/nowhere",))
    assert job["state"] == "succeeded" and "COLD" in out.splitlines(), out
    job, out = _run(cli, sys.executable, "-X", "utf8", "sub/seen.py")
    assert job["state"] == "succeeded" and "COLD" in out.splitlines(), out


def test_a_warm_job_is_cancelled_as_any_job(cli: Cli, script: Path) -> None:
    (cli.tmp / "long.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    job = cli.submit("--cpus", "1", "--", sys.executable, "long.py")
    cli.wait_state(job, {"running"})
    from tests.timing import until

    until(lambda: cli("logs", str(job)).stdout == "up\n", 30, "the job did not start")
    assert cli("cancel", str(job)).returncode == 0
    assert cli("wait", str(job), check=False).returncode != 0
    assert cli.job(job)["state"] == "cancelled"


def test_plan_takes_only_this_interpreter_in_this_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warm, "_warm", ("json",))
    monkeypatch.setattr(warm, "_import_env", {"HOME": "/h"})
    monkeypatch.setattr(warm, "_import_threads", {"OMP_NUM_THREADS": None})
    (tmp_path / "a.py").write_text("")
    env = {"HOME": "/h", "PATH": str(Path(sys.executable).parent)}
    here = str(tmp_path)
    assert warm.plan([sys.executable, "a.py", "x"], env, here, False) == warm.WarmStart(
        str(tmp_path / "a.py"), False, ["a.py", "x"], False, (sys.executable, "a.py", "x")
    )
    assert warm.plan(["python", "-P", "-m", "pkg", "y"], env, here, False) == warm.WarmStart(
        "pkg", True, ["pkg", "y"], True, ("python", "-P", "-m", "pkg", "y")
    )
    assert warm.plan([sys.executable, "a.py"], env, here, True) is None, "another user: cold"
    assert warm.plan([sys.executable, "nothere.py"], env, here, False) is None
    assert warm.plan([sys.executable, "-u", "a.py"], env, here, False) is None
    assert (
        warm.plan(["/usr/bin/python3", "a.py"], env, here, False) is None
        or Path("/usr/bin/python3").resolve() == Path(sys.executable).resolve()
    )
    assert warm.plan([sys.executable, "a.py"], {**env, "HOME": "/other"}, here, False) is None
    assert warm.plan([sys.executable, "a.py"], {**env, "PYTHONPATH": "x"}, here, False) is None
    assert warm.plan([sys.executable, "a.py"], {**env, "TORCH_LOGS": "+dynamo"}, here, False) is None
    assert warm.plan([sys.executable, "a.py"], {**env, "OMP_PROC_BIND": "true"}, here, False) is None
    settable = importlib.util.find_spec("threadpoolctl") is not None  # the BLAS's: with it (MLflow's)
    one_thread = warm.plan([sys.executable, "a.py"], {**env, "OMP_NUM_THREADS": "1"}, here, False)
    assert (one_thread is not None) == settable, "a thread count is set in the fork"
    assert warm.plan([sys.executable, "a.py"], {**env, "CUDA_VISIBLE_DEVICES": "1"}, here, False) is not None
    assert warm.plan([sys.executable, "a.py"], {**env, warm.OFF: "0"}, here, False) is None
    assert warm.plan(["sh", "a.py"], env, here, False) is None
    monkeypatch.setattr(warm, "_warm", ())
    assert warm.plan([sys.executable, "a.py"], env, here, False) is None, "nothing imported: cold"


def test_warm_jobs_draw_their_own_random_numbers(cli: Cli, script: Path) -> None:
    """Forks of one process would share torch's and NumPy's generators (every trial of a
    sweep initialised alike): each warm job draws its own, as fresh interpreters do."""
    (cli.tmp / "draw.py").write_text(
        "import json, random, sys, numpy, torch\n"
        "print('WARM' if 'tandem.place' in sys.modules else 'COLD')\n"
        "draws = [torch.initial_seed(), torch.rand(1).item(), numpy.random.rand(), random.random()]\n"
        "print(json.dumps(draws))\n"
    )
    draws = []
    for _ in range(2):
        job, out = _run(cli, sys.executable, "draw.py")
        assert job["state"] == "succeeded" and out.splitlines()[0] == "WARM", out
        draws.append(json.loads(out.splitlines()[1]))
    assert all(a != b for a, b in zip(*draws)), draws


def test_the_fork_server_imports_ahead_only_for_a_script_that_imports_torch(tmp_path: Path) -> None:
    """Seconds of imports, paid once a daemon: for a job whose script imports torch (or what
    imports it, MLflow, tandem), never for ``python -c`` or a script of the standard library."""
    (tmp_path / "train.py").write_text("import sys\nfrom torch import nn\n")
    (tmp_path / "plain.py").write_text("import json\nprint('no torch here: import torch')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").write_text("import mlflow\n")
    here = str(tmp_path)
    assert warm.worth_warming(["python", "train.py", "0.1"], here)
    (tmp_path / "listed.py").write_text("import json, numpy as np, torch\n")
    assert warm.worth_warming(["python", "listed.py"], here)
    assert warm.worth_warming(["python3", "-m", "pkg"], here)
    assert warm.worth_warming([sys.executable, "-P", "-m", "tandem.cli", "share", "serve-spec", "x"], here)
    assert not warm.worth_warming(["python", "plain.py"], here)
    assert not warm.worth_warming(["python", "-c", "import torch"], here)
    assert not warm.worth_warming(["python", "nothere.py"], here)
    assert not warm.worth_warming(["sh", "train.py"], here)


def test_a_warm_job_ends_as_an_interpreter_does_its_files_written_and_a_bad_script_said_alike(
    cli: Cli, script: Path
) -> None:
    """What a fresh interpreter's end does that ``os._exit`` would not: a file the script
    never closed is written out (its object finalised); a script that does not compile is
    said in the same words, with no frame of tandem's."""
    (cli.tmp / "unclosed.py").write_text(
        "import sys, torch\n"
        "print('WARM' if 'tandem.place' in sys.modules else 'COLD')\n"
        "f = open(sys.argv[1], 'w')\n"
        "f.write('all of it\\n' * 1000)\n"  # buffered, never flushed nor closed by the script
    )
    (cli.tmp / "broken.py").write_text("import torch\nx = (1,\n")
    said = {}
    for cold in (False, True):
        out_file = cli.tmp / f"out-{cold}.txt"
        job, out = _run(cli, sys.executable, "unclosed.py", str(out_file), cold=cold)
        assert job["state"] == "succeeded" and out.splitlines()[0] == ("COLD" if cold else "WARM"), out
        assert out_file.read_text() == "all of it\n" * 1000
        job, out = _run(cli, sys.executable, "broken.py", cold=cold)
        assert job["state"] == "failed" and "SyntaxError" in out
        said[cold] = out
    assert said[False] == said[True] and "warm.py" not in said[False], said
