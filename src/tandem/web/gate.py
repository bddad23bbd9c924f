"""A gate in front of a local web server, for ``tandem ui``: the server (MLflow's) listens on a
Unix socket in the private runtime directory, which no other user may reach, and the gate on
127.0.0.1 lets through only what its user sends.

Each connection is judged before a byte goes on: a loopback client's socket must be this
user's (:mod:`tandem.web.peer`); its request's Host must name a loopback address and the
gate's port (DNS rebinding); an ``Origin`` it carries must be the gate's own (a page of
another port or site in the user's browser may neither read nor change runs: MLflow itself
lets every localhost origin in). One request per connection (``Connection: close`` is set),
so every request is judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

from tandem.web.access import LOOPBACK_HOSTS, host_allowed
from tandem.web.peer import foreign

HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT_S = 10.0
_HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"upgrade"}


def refused(head: bytes, port: int) -> str | None:
    """Why the request whose head (request line and headers) is ``head`` may not go through
    the gate on ``port``, or None."""
    if b"\n" in head.replace(b"\r\n", b"") or b"\r" in head.replace(b"\r\n", b""):
        # A bare LF or CR ends a line for the server behind the gate, not for the gate: a
        # second request hidden in the first's head would pass unchecked.
        return "lines of a request's head must end with CRLF"
    fields: dict[bytes, list[bytes]] = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            fields.setdefault(name.strip().lower(), []).append(value.strip())
    hosts, origins = fields.get(b"host", []), fields.get(b"origin", [])
    if len(hosts) != 1 or len(origins) > 1:
        return "one Host header, and at most one Origin, please"
    host = hosts[0].decode("latin-1")
    if not host_allowed(host, LOOPBACK_HOSTS, port):
        return f"Host {host!r} is not this server's (DNS rebinding?): use http://127.0.0.1:{port}"
    if origins and origins[0].decode("latin-1") != f"http://{host}":
        return f"cross-origin request refused (Origin {origins[0].decode('latin-1')!r})"
    return None


def closing(head: bytes) -> bytes:
    """``head`` with ``Connection: close`` in place of any hop-by-hop header it had."""
    lines = head.split(b"\r\n")
    kept = [lines[0]] + [
        line for line in lines[1:] if line and line.partition(b":")[0].strip().lower() not in _HOP_BY_HOP
    ]
    return b"\r\n".join([*kept, b"Connection: close", b"", b""])


def _answer(status: str, why: str) -> bytes:
    body = why.encode() + b"\n"
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _serve_one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: Path, port: int
) -> None:
    try:
        why = foreign(writer.get_extra_info("peername"), writer.get_extra_info("sockname"))
        if why is not None:  # another user's socket: nothing read, nothing answered
            writer.transport.abort()
            return
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            return
        why = refused(head[:-4], port)
        if why is not None:
            writer.write(_answer("403 Forbidden", why))
            return
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(str(upstream), limit=HEAD_LIMIT)
        except OSError:
            writer.write(_answer("503 Service Unavailable", "the MLflow server is not up (yet): try again"))
            return
        up_writer.write(closing(head[:-4]))
        sending = asyncio.ensure_future(_pipe(reader, up_writer))  # a request's body, if any
        try:
            await _pipe(up_reader, writer)  # the answer, until the server closes (Connection: close)
        finally:
            sending.cancel()
            up_writer.close()
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()
        writer.close()


async def serve(listener: socket.socket, upstream: Path, until: asyncio.Future) -> None:
    """Pass what the gate allows from ``listener`` (a bound TCP socket) to the server on the
    Unix socket ``upstream``, until ``until`` is done."""
    port = listener.getsockname()[1]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_one(reader, writer, upstream, port)

    server = await asyncio.start_server(handle, sock=listener, limit=HEAD_LIMIT)
    async with server:
        await until
