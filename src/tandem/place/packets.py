"""How a message of the job manager's protocol (:mod:`tandem.place.protocol`) travels: the
daemon's socket's path, and one JSON object a packet, or, over the packet limit, in an
anonymous memory file whose descriptor the packet carries (no disk: a reply is never lost to
its size or to a full disk)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tandem import _ipc


def exchange(path: Path, message: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send ``message`` to the daemon listening at ``path`` and return its answer, each way
    within ``timeout`` seconds. Raises what the socket does: ``FileNotFoundError`` or
    ``ConnectionRefusedError`` (no daemon there), ``TimeoutError``, ``EOFError`` or another
    ``OSError`` (lost mid-request), ``ValueError`` (an answer this tandem cannot read)."""
    data, body = pack(message)
    try:
        with _ipc.new_socket() as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.settimeout(None)
            _ipc.send_packet(sock, data, body, timeout=timeout)
            answer, fds = _ipc.recv_packet(sock, timeout=timeout)
            return unpack(answer, fds)  # a large reply: read from its memory file
    finally:
        _ipc.close_fds(list(body))


def socket_path(state_dir: Path) -> Path:
    digest = hashlib.sha1(str(state_dir).encode()).hexdigest()[:10]
    return _ipc.socket_file(f"{digest}.sock", subdir="place")


def encode(message: dict[str, Any]) -> bytes:
    """One packet's worth of ``message`` (a wake, a supervisor's note: always small); a message
    that may be large goes by :func:`pack`."""
    data = json.dumps(message).encode()
    if len(data) > _ipc.MAX_PACKET:
        raise ValueError(
            f"message of {len(data)} bytes is over the {_ipc.MAX_PACKET}-byte limit "
            "(a very large environment? pass fewer variables)"
        )
    return data


MAX_BODY = 64 << 20  # a message passed in a memory file (a job's environment, a reply's ids), at most this


def pack(message: dict[str, Any]) -> tuple[bytes, tuple[int, ...]]:
    """The packet for ``message`` and the descriptors it carries (close them after sending).

    Over the packet limit, the message is put in a memory file and the packet says so
    (``body``). A reply's packet is then a refusal to a client that cannot read the file
    (an older tandem's), rather than an empty answer it would take as the whole one."""
    data = json.dumps(message).encode()
    if len(data) <= _ipc.MAX_PACKET:
        return data, ()
    what = "request" if "op" in message else "reply"
    if len(data) > MAX_BODY:
        fix = " (pass fewer variables, or split the sweep)" if what == "request" else ""
        raise ValueError(f"{what} of {len(data)} bytes is over the {MAX_BODY}-byte limit{fix}")
    fd = os.memfd_create(f"tandem-{what}", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:  # os.write may write part of it
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    if what == "request":
        return json.dumps({"op": message.get("op"), "body": "fd"}).encode(), (fd,)
    error = "the reply came in a memory file, which this tandem cannot read: update it"
    stub = {"ok": False, "body": "fd", "error": error}
    return json.dumps(stub).encode(), (fd,)


def unpack(data: bytes, fds: list[int]) -> dict[str, Any]:
    """The message a packet carries (its body read from the memory file it names); the
    descriptors are closed."""
    try:
        message = decode(data)
        if message.get("body") == "fd":
            if len(fds) != 1:
                raise ValueError("a message body without its file")
            size = os.fstat(fds[0]).st_size
            if size > MAX_BODY:
                raise ValueError(f"message body of {size} bytes")
            body = bytearray()
            while len(body) < size:  # os.pread may read part of it
                chunk = os.pread(fds[0], size - len(body), len(body))
                if not chunk:
                    raise ValueError(f"message body cut short at {len(body)} of {size} bytes")
                body += chunk
            message = decode(bytes(body))
        return message
    finally:
        _ipc.close_fds(fds)


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message
