"""tandem ui's gate on its own: which request heads it lets through (Host and Origin), that it
ends every connection after one request, and whose sockets it tells apart (real sockets)."""

from __future__ import annotations

import os
import socket

import pytest

from tandem.web import peer
from tandem.web.access import LOOPBACK_HOSTS, host_allowed
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
        ("Host: 127.0.0.1:5000@evil.example",),
        ("Host: 127.0.0.1:50000",),
        ("Host: [::1]:5000x",),
        ("Host: ::1:5000",),  # an IPv6 address is named in brackets
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


@pytest.mark.parametrize(
    ("host", "port", "allowed"),
    [
        ("127.0.0.1:8765", 8765, True),
        ("LOCALHOST:8765", 8765, True),
        ("[::1]:8765", 8765, True),
        ("127.0.0.1:8765@evil", 8765, False),
        ("127.0.0.1:18765", 8765, False),
        ("127.0.0.1:876", 8765, False),
        ("127.0.0.1", 8765, False),  # no port: http's 80, not this server's
        ("127.0.0.1", 80, True),
        ("127.0.0.1:", 80, True),
        ("[::1]", 80, True),
        ("evil.example:8765", 8765, False),
        ("", 8765, False),
        ("[::1", 8765, False),
        (":8765", 8765, False),
    ],
)
def test_a_host_header_names_a_loopback_name_and_this_servers_port(
    host: str, port: int, allowed: bool
) -> None:
    assert host_allowed(host, LOOPBACK_HOSTS, port) is allowed


def test_a_head_with_bare_line_ends_is_refused() -> None:
    """A bare LF ends a line for the server behind the gate: a request hidden in another's
    head (its own Host and Origin) never reaches it unchecked."""
    hidden = (
        b"GET /x HTTP/1.1\nHost: evil.com\nOrigin: http://evil.com\n\nGET /y HTTP/1.1\r\nHost: 127.0.0.1:5000"
    )
    assert refused(hidden, PORT) == "lines of a request's head must end with CRLF"
    assert refused(_head("Host: 127.0.0.1:5000", "X: a\rb"), PORT)
    assert refused(_head("Host: 127.0.0.1:5000"), PORT) is None


def test_one_request_per_connection() -> None:
    head = _head("Host: 127.0.0.1:5000", "Connection: keep-alive", "Keep-Alive: timeout=5", "Upgrade: h2c")
    out = closing(head)
    assert out.endswith(b"\r\nConnection: close\r\n\r\n") and out.count(b"Connection") == 1
    assert b"Keep-Alive" not in out and b"Upgrade" not in out and out.startswith(b"POST /api/2.0/")


@pytest.mark.parametrize("netlink", [True, False], ids=["sock_diag", "proc-tables"])
def test_the_owner_of_a_loopback_client_socket_is_known(
    netlink: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not netlink:  # where sock_diag cannot answer, /proc/net/tcp{,6} says the same
        monkeypatch.setattr(peer, "_netlink_works", lambda: False)
    elif not peer._netlink_works():
        pytest.skip("no sock_diag netlink here")
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
            # A client socket closed by its process (orphaned) is listed as uid 0's, whoever
            # had it: no one's, refused (a root server would otherwise take it for its own).
            closing = socket.socket(family)
            closing.connect(server.getsockname()[:2])
            closing.close()
            conn, addr = server.accept()
            with conn:
                assert owner_uid(addr[:2], conn.getsockname()[:2]) is None
                assert foreign(addr, conn.getsockname())
