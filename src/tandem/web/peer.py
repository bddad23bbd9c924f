"""Who is at the other end of a loopback TCP connection: the user owning the client's socket,
as the kernel tells it (like an ident server would say).

Every user of a host may connect to 127.0.0.1, and a browser may be sent to any port; a port
is no boundary between users. The dashboard and ``tandem ui`` therefore serve a loopback
connection only when its client socket is their own user's (the browser, a script, an SSH
tunnel of theirs): another user's ``curl`` is closed before a byte is read, whatever it holds.

The owner of that one socket is asked of the kernel by its address pair (``sock_diag``
netlink, an exact lookup as ``ss`` makes: microseconds, whatever the number of sockets), so
that a flood of another user's connections costs a lookup each and no more. Where netlink
cannot answer (no ``tcp_diag`` in this kernel, a sandbox), ``/proc/net/tcp{,6}`` is read
instead, once per connection.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import sys
from functools import cache

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# A closed connection's TIME_WAIT entry (kept by the kernel, owned by no one) and listening
# sockets are no client; a client that already half-closed (FIN_WAIT) still is. A socket its
# process closed (orphaned: no inode) is listed as uid 0's whoever had it: no one's either.
_NOT_A_CLIENT = {"06", "0A"}
_NOT_A_CLIENT_STATES = {6, 10}  # the same, as sock_diag numbers them

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
# inet_diag_req_v2: family, protocol, extensions, pad, states; then its inet_diag_sockid:
# ports and addresses in network order, an interface, the "no cookie" cookie.
_REQUEST_HEAD, _PORTS, _ADDRESSES = struct.Struct("=BBBBI"), struct.Struct(">HH"), struct.Struct("16s16s")
_REQUEST_TAIL = struct.Struct("=III")
_NO_COOKIE = 0xFFFFFFFF
# inet_diag_msg: family, state, timer, retransmits, the 48-byte socket id, then expires,
# read and write queues, uid, inode.
_REPLY = struct.Struct("=BBBB48xIIIII")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``host`` as an address; an IPv4 one mapped in IPv6 (``::ffff:127.0.0.1``, as a
    dual-stack listener sees an IPv4 client) as the IPv4 address it is."""
    address = ipaddress.ip_address(host.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _hex_address(host: str, port: int) -> tuple[str, str]:
    """``(host, port)`` as ``/proc/net/tcp{,6}`` writes them: the address's 32-bit words each
    in the host's byte order, hex; the port in hex."""
    packed = ipaddress.ip_address(host.split("%")[0]).packed
    words = (packed[i : i + 4] for i in range(0, len(packed), 4))
    return "".join(f"{int.from_bytes(w, sys.byteorder):08X}" for w in words), f"{port:04X}"


def _variants(host: str) -> list[str]:
    """The forms one address may take in the tables (IPv4, and IPv4 mapped in IPv6)."""
    address = _address(host)
    return [str(address), f"::ffff:{address}"] if address.version == 4 else [str(address)]


def _from_tables(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """:func:`owner_uid` read from ``/proc/net/tcp{,6}`` (each table at most once)."""
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
                        len(fields) > 9
                        and (fields[1], fields[2]) in wanted
                        and fields[3] not in _NOT_A_CLIENT
                        and fields[9] != "0"
                    ):
                        return int(fields[7])
        except OSError:
            continue
    return None


class _NoNetlink(Exception):
    """sock_diag cannot answer here (the tables are read instead)."""


def _from_netlink(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """:func:`owner_uid` asked of the kernel by the socket's address pair (one exact
    sock_diag lookup); None where it has no such client socket."""
    local, remote = _address(client[0]), _address(server[0])
    if local.version != remote.version:
        return None
    family = socket.AF_INET if local.version == 4 else socket.AF_INET6
    request = b"".join([
        _REQUEST_HEAD.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF),
        _PORTS.pack(client[1], server[1]),
        _ADDRESSES.pack(local.packed, remote.packed),  # padded with zeros to 16 bytes each
        _REQUEST_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE),
    ])  # fmt: skip
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            header = _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                        _NLM_F_REQUEST, 1, 0)  # fmt: skip
            nl.send(header + request)
            reply = nl.recv(8192)
    except OSError as exc:  # no netlink socket (a sandbox), or no answer
        raise _NoNetlink(str(exc)) from None
    if len(reply) < _NLMSG_HEADER.size:
        raise _NoNetlink("a short reply")
    _, kind, _, _, _ = _NLMSG_HEADER.unpack_from(reply)
    if kind == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", reply, _NLMSG_HEADER.size)
        if -code == errno.ENOENT:  # no such socket (or no tcp_diag: told apart by _netlink_works)
            return None
        raise _NoNetlink(os.strerror(-code))
    if kind != _SOCK_DIAG_BY_FAMILY or len(reply) < _NLMSG_HEADER.size + _REPLY.size:
        raise _NoNetlink(f"an unexpected reply (type {kind})")
    _, state, _, _, _, _, _, uid, inode = _REPLY.unpack_from(reply, _NLMSG_HEADER.size)
    return None if state in _NOT_A_CLIENT_STATES or inode == 0 else int(uid)


@cache
def _netlink_works() -> bool:
    """Whether sock_diag finds a socket here: asked once, of a connection of this process's
    own (the kernel says "no such socket" alike where it has no ``tcp_diag`` at all)."""
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=1) as client:
                return _from_netlink(client.getsockname(), server.getsockname()) == os.geteuid()
    except (OSError, _NoNetlink):
        return False


def owner_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the socket at ``client`` connected to ``server`` (both seen from the
    server), None where the kernel lists none (gone, another network namespace)."""
    if _netlink_works():
        try:
            return _from_netlink(client, server)
        except _NoNetlink:
            pass
    return _from_tables(client, server)


def is_loopback_address(host: str) -> bool:
    """Whether ``host`` is a loopback IP address (IPv4 mapped in IPv6 included): a client
    address as a socket gives it, never a name."""
    try:
        return _address(host).is_loopback
    except ValueError:
        return False


def foreign(client: tuple[str, int] | None, server: tuple[str, int] | None) -> str | None:
    """Why a connection from ``client`` must be closed, or None to serve it: a loopback client
    whose socket another user owns, or that the kernel does not show (then who it is cannot
    be told). A client of another machine (a dashboard bound to another address) is not
    judged here: the token alone lets it in."""
    if client is None or server is None or not is_loopback_address(client[0]):
        return None
    uid = owner_uid(client[:2], server[:2])
    if uid is None:
        return f"cannot tell which user connects from {client[0]}:{client[1]}"
    if uid != os.getuid():
        return f"a connection of uid {uid}, not of uid {os.getuid()} (who runs this server)"
    return None
