"""Ask live producers on this host for their statistics (what ``tandem share ls`` shows, and
what watch's share sampler records). Public, and free of torch and numpy (a test checks it):
a reader of statistics imports nothing heavy of share's."""

from __future__ import annotations

from tandem._ipc import new_socket
from tandem.share import protocol
from tandem.share._registry import live_producers


def query(path: str, timeout: float = 2.0) -> protocol.StatsReply:
    sock = new_socket()
    sock.settimeout(timeout)  # for connect
    try:
        sock.connect(path)
        sock.setblocking(True)
        protocol.send(sock, protocol.Stats(), timeout=timeout)
        reply, _ = protocol.recv(sock, timeout)
    finally:
        sock.close()
    if not isinstance(reply, protocol.StatsReply):
        raise protocol.ProtocolError(f"expected StatsReply, got {type(reply).__name__}")
    return reply


def query_items(path: str, indices: list[int], timeout: float = 30.0) -> list[str] | None:
    """The producer at ``path``'s digests of its dataset's items at ``indices`` (None: it
    cannot say). It loads them itself: ``timeout`` allows for a slow dataset."""
    sock = new_socket()
    sock.settimeout(2.0)  # for connect
    try:
        sock.connect(path)
        sock.setblocking(True)
        protocol.send(sock, protocol.Items(tuple(indices)), timeout=2.0)
        reply, _ = protocol.recv(sock, timeout)
    finally:
        sock.close()
    if isinstance(reply, protocol.Refused):  # a producer of a tandem without the check
        return None
    if not isinstance(reply, protocol.ItemsReply):
        raise protocol.ProtocolError(f"expected ItemsReply, got {type(reply).__name__}")
    return None if reply.digests is None else list(reply.digests)


def query_all(timeout: float = 2.0) -> list[protocol.StatsReply | dict]:
    """Stats of every live producer; one that does not answer is a dict with its error."""
    out: list[protocol.StatsReply | dict] = []
    for entry in live_producers():
        try:
            out.append(query(str(entry.socket_path), timeout))
        except (OSError, EOFError, TimeoutError, protocol.ProtocolError) as exc:
            out.append({"name": entry.name, "pid": entry.pid, "error": f"no answer ({exc})"})
    return out
