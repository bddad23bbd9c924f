"""tandem ui's gate on its own: which request heads it lets through (Host and Origin), that it
ends every connection after one request, and whose sockets it tells apart (real sockets)."""

from __future__ import annotations

import os
import socket

import pytest

from tandem.web.gate import closing, refused
from tandem.web.peer import foreign, owner_uid

PORT = 5000


def _head(*headers: str, line: str = "POST /api/2.0/mlflow/runs/delete HTTP/1.1") -> bytes:
    return "\r\n".join([line, *headers]).encode()


@pytest.mark.parametrize(
    "headers",
    [
        ("Host: 127.0.0.1:5000",),
        ("Host: localhost:5000", "Origin: http://localhost:5000"),
        ("Host: [::1]:5000", "Origin: http://[::1]:5000"),
    ],
)
def test_the_gate_lets_through_its_own_host_and_origin(headers: tuple[str, ...]) -> None:
    assert refused(_head(*headers), PORT) is None


@pytest.mark.parametrize(
    "headers",
    [
        ("Host: evil.example:5000",),  # DNS rebinding
        ("Host: 127.0.0.1:5001",),  # another port's name
        ("Host: 127.0.0.1",),
        ("Host: [::1]",),
        (),
        ("Host: 127.0.0.1:5000", "Host: evil.example:5000"),
        ("Host: 127.0.0.1:5000", "Origin: http://127.0.0.1:18999"),  # another port's page
        ("Host: 127.0.0.1:5000", "Origin: null"),
        ("Host: 127.0.0.1:5000", "Origin: http://127.0.0.1:5000", "Origin: http://evil.example"),
    ],
)
def test_the_gate_refuses_other_hosts_and_origins(headers: tuple[str, ...]) -> None:
    assert refused(_head(*headers), PORT)


def test_one_request_per_connection() -> None:
    head = _head("Host: 127.0.0.1:5000", "Connection: keep-alive", "Keep-Alive: timeout=5", "Upgrade: h2c")
    out = closing(head)
    assert out.endswith(b"\r\nConnection: close\r\n\r\n") and out.count(b"Connection") == 1
    assert b"Keep-Alive" not in out and b"Upgrade" not in out and out.startswith(b"POST /api/2.0/")


def test_the_owner_of_a_loopback_client_socket_is_known() -> None:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            server = socket.socket(family)
            server.bind((host, 0))
        except OSError:
            continue  # no IPv6 here
        server.listen()
        with server, socket.socket(family) as client:
            client.connect(server.getsockname()[:2])
            conn, addr = server.accept()
            with conn:
                assert owner_uid(addr[:2], conn.getsockname()[:2]) == os.getuid()
                assert foreign(addr, conn.getsockname()) is None
                assert foreign(("127.0.0.1", 1), conn.getsockname())  # no such client: refused
