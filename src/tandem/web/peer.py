"""Who is at the other end of a loopback TCP connection: the user owning the client's socket,
as the kernel lists it in ``/proc/net/tcp`` (and ``tcp6``), like an ident server would say.

Every user of a host may connect to 127.0.0.1, and a browser may be sent to any port; a port
is no boundary between users. The dashboard and ``tandem ui`` therefore serve a loopback
connection only when its client socket is their own user's (the browser, a script, an SSH
tunnel of theirs): another user's ``curl`` is closed before a byte is read, whatever it holds.
"""

from __future__ import annotations

import ipaddress
import os
import sys

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# A closed connection's TIME_WAIT entry (kept by the kernel, owned by no one) and listening
# sockets are no client; a client that already half-closed (FIN_WAIT) still is.
_NOT_A_CLIENT = {"06", "0A"}


def _hex_address(host: str, port: int) -> tuple[str, str]:
    """``(host, port)`` as ``/proc/net/tcp{,6}`` writes them: the address's 32-bit words each
    in the host's byte order, hex; the port in hex. For IPv6, also an IPv4 client as a
    mapped address (``::ffff:127.0.0.1``), which a dual-stack listener sees."""
    packed = ipaddress.ip_address(host.split("%")[0]).packed
    words = (packed[i : i + 4] for i in range(0, len(packed), 4))
    return "".join(f"{int.from_bytes(w, sys.byteorder):08X}" for w in words), f"{port:04X}"


def _variants(host: str) -> list[str]:
    """The forms one address may take in the tables (IPv4, and IPv4 mapped in IPv6)."""
    address = ipaddress.ip_address(host.split("%")[0])
    forms = [str(address)]
    if isinstance(address, ipaddress.IPv4Address):
        forms.append(f"::ffff:{address}")
    elif address.ipv4_mapped is not None:
        forms.append(str(address.ipv4_mapped))
    return forms


def owner_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the socket at ``client`` connected to ``server`` (both seen from the
    server), None where no table lists it (no ``/proc``, another network namespace)."""
    wanted = set()
    for c in _variants(client[0]):
        for s in _variants(server[0]):
            local = ":".join(_hex_address(c, client[1]))
            remote = ":".join(_hex_address(s, server[1]))
            wanted.add((local, remote))
    for table in _TABLES:
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if (
                        len(fields) > 7
                        and (fields[1], fields[2]) in wanted
                        and fields[3] not in _NOT_A_CLIENT
                    ):
                        return int(fields[7])
        except OSError:
            continue
    return None


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return address.is_loopback or (
        isinstance(address, ipaddress.IPv6Address)
        and address.ipv4_mapped is not None
        and address.ipv4_mapped.is_loopback
    )


def foreign(client: tuple[str, int] | None, server: tuple[str, int] | None) -> str | None:
    """Why a connection from ``client`` must be closed, or None to serve it: a loopback client
    whose socket another user owns, or that no table shows (then who it is cannot be told).
    A client of another machine (a dashboard bound to another address) is not judged here:
    the token alone lets it in."""
    if client is None or server is None or not is_loopback(client[0]):
        return None
    uid = owner_uid(client[:2], server[:2])
    if uid is None:
        return f"cannot tell which user connects from {client[0]}:{client[1]}"
    if uid != os.getuid():
        return f"a connection of uid {uid}, not of uid {os.getuid()} (who runs this server)"
    return None
