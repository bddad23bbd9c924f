"""The job manager's wire protocol: JSON requests and replies over the daemon's socket.

One ``SOCK_SEQPACKET`` Unix socket per state directory, in tandem's private runtime
directory (:mod:`tandem._ipc`): ``place/<hash of the state directory>.sock``. A client
connects, sends one request packet, reads one reply packet, closes. Every request is an
object with ``op``; every reply has ``ok`` and, when ``ok`` is false, ``error`` (a message
for the user). Reads (``ls``, ``show``, ``logs``, ``wait``) go to the state file, not here.

=========  ==============================================  =================================
op         request fields                                  reply fields
=========  ==============================================  =================================
submit     ``job``: the fields of ``tandem submit``        ``id``
cancel     ``ids``                                         ``cancelled``, ``unknown``, ``ended``
status     -                                               ``pid``, ``policy``, ``capacity``, ``used``, ...
stop       -                                               - (the daemon exits; jobs go on)
wake       -                                               (no reply: a shim's result is ready)
=========  ==============================================  =================================

A request over the packet limit (a job with a large environment or command) travels in an
anonymous memory file whose descriptor the packet carries (:func:`pack`, :func:`unpack`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tandem import _ipc

OPS = ("submit", "cancel", "status", "stop", "wake")


def socket_path(state_dir: Path) -> Path:
    digest = hashlib.sha1(str(state_dir).encode()).hexdigest()[:10]
    return _ipc.socket_file(f"{digest}.sock", subdir="place")


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    if len(data) > _ipc.MAX_PACKET:
        raise ValueError(
            f"request of {len(data)} bytes is over the {_ipc.MAX_PACKET}-byte limit "
            "(a very large environment? pass fewer variables)"
        )
    return data


MAX_BODY = 64 << 20  # a request passed in a memory file: a job's environment, at most this


def pack(message: dict[str, Any]) -> tuple[bytes, tuple[int, ...]]:
    """The packet for ``message`` and the descriptors it carries (close them after sending)."""
    data = json.dumps(message).encode()
    if len(data) <= _ipc.MAX_PACKET:
        return data, ()
    if len(data) > MAX_BODY:
        raise ValueError(
            f"request of {len(data)} bytes is over the {MAX_BODY}-byte limit (pass fewer variables)"
        )
    fd = os.memfd_create("tandem-request", os.MFD_CLOEXEC)
    os.write(fd, data)
    return json.dumps({"op": message.get("op"), "body": "fd"}).encode(), (fd,)


def unpack(data: bytes, fds: list[int]) -> dict[str, Any]:
    """The request a packet carries (its body read from the memory file it names)."""
    try:
        message = decode(data)
        if message.get("body") == "fd":
            if len(fds) != 1:
                raise ValueError("a request body without its file")
            size = os.fstat(fds[0]).st_size
            if size > MAX_BODY:
                raise ValueError(f"request body of {size} bytes")
            message = decode(os.pread(fds[0], size, 0))
        return message
    finally:
        _ipc.close_fds(fds)


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message
