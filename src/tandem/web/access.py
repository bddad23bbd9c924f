"""Who may use the dashboard: the user's own connections, a per-tab session token sent in a
header, loopback Host headers, same-origin writes.

- No cookie: a browser sends cookies to every port of 127.0.0.1, another user's server's
  too. Each tab holds a session token in its ``sessionStorage`` (per origin: per port) and
  sends it itself, ``Authorization: Bearer TOKEN``; a request of ``/api`` without a valid
  one gets 401. Tokens live in the server's memory only: a new start makes new ones.
- A tab gets its token by sending ``POST /api/login {"code": CODE}`` once. The code is on no
  command line: the server writes it in a 0600 page of the private runtime directory
  (:func:`login_file`) that sends the browser on to ``/#login=CODE`` (a fragment: never sent
  over the network); ``tandem dashboard`` opens that file. A code works once, then a new one
  is written in the page (so the page logs in the next tab too).
- The page and its scripts (``/``, ``/static/``) hold nothing secret and need no token.
- Only Host headers naming a loopback address (or the one address the user bound
  explicitly) and this server's port are accepted: a page of another site that resolves its
  own name to 127.0.0.1 (DNS rebinding), or a name of another port, is refused with 403.
- A request that changes something (any method but GET and HEAD: login, cancel) needs an
  ``Origin`` header equal to the dashboard's own origin.
- Before any of this, a loopback connection from a socket of another user is closed
  (:mod:`tandem.web.peer`, checked by :mod:`tandem.web.server`).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse

from tandem import _ipc

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD"})
PUBLIC_PATHS = ("/", "/static/")  # the page and its scripts and styles: nothing secret
MAX_SESSIONS = 64  # tabs logged in at once; past it the oldest is logged out


def login_file(port: int) -> Path:
    """The 0600 page that logs a browser in to the dashboard on ``port``."""
    return _ipc.runtime_dir() / "dashboard" / f"login-{port}.html"


def write_login_page(path: Path, url: str, code: str) -> None:
    """``path``: a page (0600, replaced whole) that sends the browser to ``url#login=code``."""
    target = f"{url}#login={code}"
    page = (
        '<!doctype html><meta charset="utf-8"><meta name="referrer" content="no-referrer">'
        f'<meta http-equiv="refresh" content="0; url={target}"><title>tandem dashboard</title>'
        f'<p><a href="{target}">open the tandem dashboard</a> (a one-time login)</p>\n'
    )
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(page)
    os.replace(tmp, path)


class Sessions:
    """The login code of the moment (one use each) and the session tokens it gave, in memory."""

    def __init__(self, on_new_code: Callable[[str], None] = lambda code: None) -> None:
        self._on_new_code = on_new_code
        self._tokens: OrderedDict[str, None] = OrderedDict()
        self.code = ""
        self.new_code()

    @classmethod
    def of_token(cls, token: str) -> Sessions:
        """Sessions where ``token`` is valid (and no code is written anywhere)."""
        sessions = cls()
        sessions._tokens[token] = None
        return sessions

    def new_code(self) -> str:
        self.code = secrets.token_urlsafe(32)
        self._on_new_code(self.code)
        return self.code

    def login(self, code: str) -> str | None:
        """A new session token for the current ``code`` (then spent), else None."""
        if not code or not hmac.compare_digest(code.encode(), self.code.encode()):
            return None
        self.new_code()
        token = secrets.token_urlsafe(32)
        self._tokens[token] = None
        while len(self._tokens) > MAX_SESSIONS:
            self._tokens.popitem(last=False)
        return token

    def valid(self, token: str) -> bool:
        # A dict lookup by the token's value: no comparison the time of which says how much
        # of a guess was right.
        return bool(token) and token in self._tokens


def host_allowed(host_header: str, names: frozenset[str], port: int) -> bool:
    """Whether a request's Host header names this server: one of ``names`` (lower case; an
    IPv6 address in brackets) and this server's ``port``. Without a port, only where that
    port is http's default, 80 (RFC 9110 7.2: an absent port means the scheme's default).
    Nothing else may follow: ``127.0.0.1:8765@evil`` and another port's name are refused."""
    if host_header.startswith("["):
        end = host_header.find("]") + 1  # 0 where none: no name
        name, rest = host_header[:end], host_header[end:]
    else:
        name, colon, after = host_header.partition(":")
        rest = colon + after
    ported = rest == f":{port}" or (rest in ("", ":") and port == 80)
    return ported and name.lower() in names


# On every response: the page runs only its own scripts, talks only to this server, is never
# framed (clickjacking), and sends no Referer.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        b"connect-src 'self'; font-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def _with_security_headers(send: Any) -> Any:
    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
        await send(message)

    return sending


async def _body(receive: Any, limit: int = 4096) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit or not message.get("more_body"):
            return body[: limit + 1]


class Access:
    """ASGI middleware that lets through only what the module's rules allow."""

    def __init__(
        self, app: Any, sessions: Sessions, port: int, hosts: frozenset[str] = LOOPBACK_HOSTS
    ) -> None:
        self.app = app
        self.sessions = sessions
        self.port = port  # the server's: a Host header must name it
        self.hosts = hosts

    async def _login(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            code = json.loads(await _body(receive)).get("code", "")
        except (ValueError, AttributeError):
            code = ""
        token = self.sessions.login(str(code))
        if token is None:
            why = "that login code is spent or wrong: open the login page `tandem dashboard` printed again"
            await JSONResponse({"error": why}, 401)(scope, receive, send)
            return
        await JSONResponse({"token": token}, headers={"Cache-Control": "no-store"})(scope, receive, send)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_security_headers(send)
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not host_allowed(host, self.hosts, self.port):
            why = f"Host {host!r} is not this dashboard's (DNS rebinding?): use http://127.0.0.1:{self.port}"
            await PlainTextResponse(why, 403)(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method not in SAFE_METHODS:
            origin = headers.get("origin")
            if origin != f"{scope.get('scheme', 'http')}://{host}":
                await PlainTextResponse(f"cross-origin request refused (Origin {origin!r})", 403)(
                    scope, receive, send
                )
                return
        if path == "/api/login" and method == "POST":
            await self._login(scope, receive, send)
            return
        public = method in SAFE_METHODS and (path == PUBLIC_PATHS[0] or path.startswith(PUBLIC_PATHS[1]))
        auth = headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not public and not self.sessions.valid(token):
            why = "not logged in: open the login page `tandem dashboard` printed (file://.../login-PORT.html)"
            await JSONResponse({"error": why}, 401)(scope, receive, send)
            return
        await self.app(scope, receive, send)
