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


def test_logs_follow_a_queued_job_from_its_first_line_to_its_end(cli: Cli) -> None:
    """`logs -f` of a job that has not started (no output file yet) prints its lines as it
    writes them, and nothing else (no "[log rotated]" when its file appears), until it ends."""
    cli("daemon", "start", "--cpus", "1", *FAST)
    go, on = cli.tmp / "go", cli.tmp / "on"
    held = cli.submit("--cpus", "1", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done")
    said = "print('one', flush=True)\nimport os, time\n"
    said += f"while not os.path.exists({str(on)!r}): time.sleep(0.05)\n"
    job = cli.submit("--cpus", "1", "--after", str(held), "--", sys.executable, "-c", said + "print('two')")
    assert cli.job(job)["state"] == "queued"
    follower = subprocess.Popen(
        [*TANDEM, "logs", "-f", str(job)], env=cli.env, cwd=cli.tmp, stdout=subprocess.PIPE, text=True
    )
    try:
        go.touch()
        assert follower.stdout is not None and follower.stdout.readline() == "one\n"
        assert follower.poll() is None, "it follows the job while it runs"
        on.touch()
        out, _ = follower.communicate(timeout=60)
        assert follower.returncode == 0 and out == "two\n", out
    finally:
        follower.kill()
        follower.wait()


def test_what_logs_prints_of_each_part_said_once_and_a_rotation_only_of_a_file_seen() -> None:
    from tandem.cli.jobs import log_text
    from tandem.place.reads import LogPart

    shown: dict[int, tuple[int, int]] = {}
    assert log_text(LogPart(1, 0, 0, b"", b""), shown, several=False) == b""  # no file yet
    assert log_text(LogPart(1, 77, 0, b"one\n", None), shown, several=False) == b"one\n"  # it appears
    assert log_text(LogPart(1, 77, 4, b"two\n", None), shown, several=False) == b"two\n"
    assert shown == {1: (77, 8)}
    assert log_text(LogPart(1, 78, 0, b"new\n", None), shown, several=False) == b"[log rotated]\nnew\n"
    again: dict[int, tuple[int, int]] = {1: (78, 4)}
    first = log_text(LogPart(2, 90, 0, b"x\n", b"old\n"), again, several=True)
    assert first == b"== attempt 2 ==\n[older output rotated away; its newest part:]\nold\nx\n"


def test_a_log_longer_than_one_look_is_read_in_as_many_looks_as_it_takes(tmp_path) -> None:
    from tandem.place.reads import LOG_READ_MAX, log_looks, read_log_parts

    (tmp_path / "output.log").write_bytes(b"x" * LOG_READ_MAX + b"tail\n")
    seen: dict[int, tuple[int, int]] = {}
    looks = []
    for parts in log_looks(lambda _job, s: read_log_parts([(1, tmp_path)], s), 7, seen):
        looks.append(b"".join(p.data for p in parts))
        seen.update({p.n: (p.inode, p.end) for p in parts})
    assert [len(look) for look in looks] == [LOG_READ_MAX, 5] and looks[1] == b"tail\n"
