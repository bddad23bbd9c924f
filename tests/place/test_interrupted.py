"""An interrupted test session ends what it started: a daemon with a running job (Ctrl-C
to the terminal's process group, SIGTERM to pytest alone, with and without xdist's workers),
and the network namespaces and bridge of a Ray node cluster whose process was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.timing import scaled, until

ROOT = Path(__file__).resolve().parents[2]
INNER = Path(__file__).with_name("interrupted_session.py")


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _of_state(state: str) -> list[psutil.Process]:
    """The daemon of ``state`` and what it started (its job: ``sleep``, its supervisor)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if state in " ".join(proc.cmdline()) or proc.environ().get("TANDEM_STATE_DIR") == state:
                found += [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
    return list({p.pid: p for p in found}.values())


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize(
    ("how", "workers"),
    [("SIGINT", "1"), ("SIGTERM", "1"), ("SIGTERM", "0")],
    ids=["ctrl-c-xdist", "sigterm-xdist", "sigterm-one-process"],
)
def test_an_interrupted_session_ends_the_daemon_and_job_it_started(
    tmp_path: Path, how: str, workers: str
) -> None:
    said = tmp_path / "daemon.pid"
    env = {**os.environ, "TANDEM_INTERRUPT_ME": str(said)}
    # faulthandler: a session that does not end is seen where it waits (its stacks dumped)
    dump = ["-o", f"faulthandler_timeout={int(scaled(40))}"]
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n", workers, "-p", "no:cacheprovider", *dump, str(INNER)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a terminal's process group of its own: pytest and its workers
        # Ctrl-C as a terminal's session has it, whatever this worker inherited (an ignored
        # or blocked SIGINT is inherited across exec, and Python then never raises
        # KeyboardInterrupt)
        preexec_fn=_default_sigint,
    )
    tree: list[psutil.Process] = []
    try:
        until(lambda: said.exists() or inner.poll() is not None, 120, "the inner session's daemon")
        assert said.exists(), inner.communicate()[0][-3000:]
        state = said.read_text()

        def started() -> list[psutil.Process]:
            found = _of_state(state)
            cmdlines = [" ".join(p.cmdline()) for p in found]
            return found if "sleep 300" in cmdlines and any("place.daemon" in c for c in cmdlines) else []

        tree = until(started, 30, lambda: f"no daemon and job of {state}: {_of_state(state)}")
        if how == "SIGINT":
            os.killpg(inner.pid, signal.SIGINT)  # Ctrl-C: the terminal signals its whole foreground group
        else:
            inner.send_signal(signal.SIGTERM)  # a CI job cancelled: pytest alone
        try:
            out = inner.communicate(timeout=scaled(60))[0]
        except subprocess.TimeoutExpired:
            os.killpg(inner.pid, signal.SIGKILL)
            pytest.fail(f"the interrupted session did not end:\n{inner.communicate()[0][-6000:]}")
        assert inner.returncode != 0, out[-3000:]
        until(
            lambda: not [p for p in tree if _alive(p)],
            30,
            lambda: f"left running: {[p.cmdline() for p in tree if _alive(p)]}\n{out[-3000:]}",
        )
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()
        for proc in tree:
            if _alive(proc):
                proc.kill()


def test_a_killed_clusters_namespaces_and_bridge_are_removed_from_its_record(tmp_path: Path) -> None:
    from tandem.bench.ray_nodes import MADE, can_make_nodes, remove_made

    if why := can_make_nodes():
        pytest.skip(why)
    root = tmp_path / "nodes"
    make = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from tandem.bench.ray_nodes import NodesCluster\n"
        "c = NodesCluster(Path(sys.argv[1]))\n"
        "c._netns('head')\n"
        "print(c.bridge, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"  # killed before it closes
    )
    made = subprocess.run([sys.executable, "-c", make, str(root)], capture_output=True, text=True, timeout=60)
    bridge = made.stdout.strip()
    assert made.returncode == -signal.SIGKILL and bridge, made.stderr
    netns = [line.split()[1] for line in (root / MADE).read_text().splitlines() if line.startswith("netns ")]

    def listed() -> tuple[bool, bool]:
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        link = subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode == 0
        return any(n in namespaces.split() for n in netns), link

    assert netns and listed() == (True, True)  # left behind
    remove_made(root)
    assert listed() == (False, False) and not (root / MADE).exists()
