"""``tandem logs`` shows a job's output with its control characters escaped (a job's
terminal escapes never reach the terminal of whoever reads its log), lines and tabs kept;
``--raw`` prints the bytes as the job wrote them. A real daemon and job."""

from __future__ import annotations

import subprocess
import sys

from tests.place.conftest import TANDEM, Cli

FAST = ["--no-track", "--settle", "0.3", "--window", "2", "--grace", "1"]
# Clear the screen, set the window's title, ring the bell, write over a line, a C1 CSI and a
# byte that is not UTF-8: each as a job could print it.
NOISY = (
    "import sys; out = sys.stdout.buffer\n"
    "out.write(b'before\\x1b[2J\\x1b]0;owned\\x07\\tafter\\n')\n"
    "out.write(b'hidden\\rshown \\xc2\\x9b31m caf\\xc3\\xa9 \\xff\\n')\n"
)


def test_logs_escape_control_characters_unless_raw(cli: Cli) -> None:
    cli("daemon", "start", "--cpus", "1", *FAST)
    job = cli.submit("--", sys.executable, "-c", NOISY)
    assert cli("wait", str(job), timeout=60).returncode == 0
    shown = cli("logs", str(job)).stdout
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown and "\x9b" not in shown
    assert shown.splitlines() == [
        "before\\x1b[2J\\x1b]0;owned\\x07\tafter",
        "hidden\\rshown \\x9b31m café \\xff",
    ], shown
    raw = subprocess.run(
        [*TANDEM, "logs", "--raw", str(job)], env=cli.env, cwd=cli.tmp, capture_output=True, timeout=60
    )
    assert raw.returncode == 0
    assert raw.stdout == b"before\x1b[2J\x1b]0;owned\x07\tafter\nhidden\rshown \xc2\x9b31m caf\xc3\xa9 \xff\n"
