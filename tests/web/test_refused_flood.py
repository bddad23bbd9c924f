"""Another local user's flood of connections costs the dashboard nothing its own user would
notice: each is closed after one lookup of its socket's owner, the log says so in a line
every few seconds (not a line each), and the user's own requests are answered meanwhile."""

from __future__ import annotations

import subprocess
import time
from urllib.parse import urlsplit

from tandem.web.server import REFUSALS_EVERY_S
from tests.other_user import OtherUser, other_user  # noqa: F401 (the fixture)
from tests.timing import scaled, until
from tests.web.conftest import Dashboard
from tests.web.test_api import _call

CONNECTIONS = 3000  # as many as the flood (in 9 s)

# Connect and hang up, as fast as two threads can: each connection is one the dashboard must
# accept and judge. Prints how many connections were made.
FLOOD = """\
import socket, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
made = []
def flood(k):
    for _ in range(k):
        s = socket.socket()
        s.settimeout(10)
        try:
            s.connect(("127.0.0.1", port))
            made.append(1)
        except OSError:
            pass
        finally:
            s.close()
threads = [threading.Thread(target=flood, args=(n // 2,)) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(len(made), flush=True)
"""


def test_another_users_flood_of_connections_leaves_the_dashboard_answering_and_its_log_short(
    dashboard: Dashboard,
    other_user: OtherUser,  # noqa: F811
) -> None:
    d = dashboard
    port = urlsplit(d.base).port
    assert _call(d, "/api/jobs")[0] == 200
    started = time.monotonic()
    flood = other_user.popen(
        [other_user.python, "-c", FLOOD, str(port), str(CONNECTIONS)], stdout=subprocess.PIPE, text=True
    )
    waits: list[float] = []
    try:
        while flood.poll() is None and time.monotonic() - started < scaled(60):
            asked = time.monotonic()
            status = _call(d, "/api/jobs")[0]  # its own user's request, while the flood goes on
            waits.append(time.monotonic() - asked)
            assert status == 200
    finally:
        if flood.poll() is None:
            flood.kill()
        out, _ = flood.communicate(timeout=scaled(10))
    took = time.monotonic() - started
    made = int(out.strip() or 0)
    assert made >= CONNECTIONS // 2, f"the flood made only {made} connections in {took:.1f} s"
    # Answered within seconds all along (a flood once made it answer in 29-37 s).
    assert waits and max(waits) < scaled(2), f"answers took up to {max(waits):.1f} s ({len(waits)} asked)"
    assert _call(d, "/api/jobs")[0] == 200
    # The log: the first refusal, then a line at most every REFUSALS_EVERY_S.
    d.proc.terminate()
    until(lambda: d.proc.poll() is not None, 20, "the dashboard ending")
    log = d.proc.stderr.read() if d.proc.stderr else ""
    closed = [line for line in log.splitlines() if "closed" in line]
    assert closed and closed[0].startswith("tandem dashboard: closed "), log[-2000:]
    assert len(closed) <= 2 + (time.monotonic() - started) / REFUSALS_EVERY_S, log[-2000:]
