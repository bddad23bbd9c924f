"""Who may use the dashboard: a token, loopback Host headers, same-origin writes.

- The token is random, kept in a 0600 file in tandem's private runtime directory
  (``dashboard/token``), so every dashboard of this user takes the same one and no other
  user can read it. The URL the server prints carries it once (``/?token=...``): the
  server answers with a redirect that drops it from the address bar and sets it as an
  HttpOnly, SameSite=Strict cookie. A request without the cookie (or an
  ``Authorization: Bearer`` header, for scripts) gets 401.
- Only Host headers naming a loopback address are accepted (or the one address the user
  bound explicitly): a page of another site that resolves its own name to 127.0.0.1 (DNS
  rebinding) is refused with 403.
- A request that changes something (any method but GET and HEAD: cancel) needs, besides
  the token, an ``Origin`` header equal to the dashboard's own origin.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, RedirectResponse

from tandem import _ipc

COOKIE = "tandem_dashboard"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD"})


def token_file() -> Path:
    return _ipc.runtime_dir() / "dashboard" / "token"


def load_token() -> str:
    """This user's dashboard token, made (0600) on first use."""
    path = token_file()
    path.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        token = path.read_text().strip()
        if len(token) >= 32:
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".token.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.replace(tmp, path)
    return token


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port (``[::1]:8765`` -> ``[::1]``)."""
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


# On every response: the page runs only its own scripts, talks only to this server, is never
# framed (clickjacking), and sends no Referer (its first URL carries the token).
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


class Access:
    """ASGI middleware that lets through only what the module's rules allow."""

    def __init__(self, app: Any, token: str, hosts: frozenset[str] = LOOPBACK_HOSTS) -> None:
        self.app = app
        self.token = token
        self.hosts = hosts

    def _has_token(self, headers: Headers, cookies: str) -> bool:
        given = ""
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        else:
            for part in cookies.split(";"):
                name, _, value = part.strip().partition("=")
                if name == COOKIE:
                    given = value
        return bool(given) and hmac.compare_digest(given, self.token)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_security_headers(send)
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if host_name(host).lower() not in self.hosts:
            why = f"Host {host!r} is not this dashboard's (DNS rebinding?): use http://127.0.0.1"
            await PlainTextResponse(why, 403)(scope, receive, send)
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode()))
        if "token" in query:
            if not hmac.compare_digest(query.pop("token"), self.token):
                await PlainTextResponse("wrong token: use the URL tandem dashboard printed", 401)(
                    scope, receive, send
                )
                return
            target = scope["path"] + (f"?{urlencode(query)}" if query else "")
            response = RedirectResponse(target, 303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            await response(scope, receive, send)
            return
        if not self._has_token(headers, headers.get("cookie", "")):
            why = "no dashboard token: open the URL `tandem dashboard` printed (it carries the token once)"
            await PlainTextResponse(why, 401)(scope, receive, send)
            return
        if scope["method"] not in SAFE_METHODS:
            origin = headers.get("origin")
            if origin != f"{scope.get('scheme', 'http')}://{host}":
                await PlainTextResponse(f"cross-origin request refused (Origin {origin!r})", 403)(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)
