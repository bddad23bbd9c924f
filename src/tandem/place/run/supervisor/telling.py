"""What a supervisor tells its daemon over the daemon's socket (no disk needed): that a result
is there to read (a wake-up), and that its attempt never started its job.

A supervisor knows its daemon's socket, not its state, and must end its job cleanly with no
daemon at all: so it speaks the wire protocol itself (:mod:`tandem.place.protocol` over
:mod:`tandem._ipc`) rather than through the CLI's client, and a daemon that is not there
(restarting, say) is simply tried again.
"""

from __future__ import annotations

import time
from pathlib import Path

from tandem import _ipc
from tandem.place import protocol


def wake_daemon(socket_path: str | None) -> None:
    """Tell the daemon a result is there (best effort: it also looks every tick)."""
    if not socket_path:
        return
    try:
        with _ipc.new_socket() as sock:
            sock.settimeout(1.0)
            sock.connect(socket_path)
            _ipc.send_packet(sock, protocol.encode(protocol.to_wire(protocol.Wake())), timeout=1.0)
    except OSError:
        pass


def _recorded(socket_path: str, report: protocol.NotStarted) -> bool | None:
    """One try: True if the daemon recorded ``report``, False if it answered that it will not
    (an older daemon's "unknown request", say: that will not change), None if it is not there
    or its disk would not take the record (try again)."""
    try:
        reply = protocol.read_reply(
            report.OP, protocol.exchange(Path(socket_path), protocol.to_wire(report), 10.0)
        )
    except (OSError, EOFError):  # not there (restarting), lost mid-request, no answer in time
        return None
    except ValueError:  # an answer this tandem cannot read
        return False
    if isinstance(reply, protocol.Failure):
        return None if reply.disk else False
    return True


def tell_not_started(socket_path: str, job_id: int, attempt: int, why: str, within: float) -> bool:
    """A supervisor's word that attempt ``attempt`` of job ``job_id`` never started its job
    (:class:`~tandem.place.protocol.NotStarted`), again each second until the daemon has
    recorded it, for up to ``within`` seconds. Until then the supervisor lives on, so that
    its attempt is never taken for one that died (lost). Whether the daemon recorded it."""
    deadline = time.monotonic() + within
    report = protocol.NotStarted(job_id, attempt, why)
    while (recorded := _recorded(socket_path, report)) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return recorded
