"""What every request passes before a page or an action answers: the peer's uid (only
coordd-web's own uid and root may use it), the Host allowlist (against DNS rebinding), the
response headers (a CSP without inline scripts or styles), and, for actions, the
per-start token and the same-origin check.

Rule: an action runs only with all three of a same-origin `Sec-Fetch-Site`, the token in
the `X-Coordd-Token` header and the token cookie; coordd applies its own admin check to
this process's uid after that.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordd_web.peer import PeerUnknown, tcp_peer_uid

logger = logging.getLogger(__name__)

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
TOKEN_COOKIE = "coordd_web_token"
TOKEN_HEADER = "x-coordd-token"
TOKEN_BYTES = 24
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


def new_token() -> str:
    """A random URL-safe token for one start of coordd-web (Jupyter style)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9.-]+))(?::[0-9]{1,5})?")


def host_name(host_header: str) -> str:
    """The host part of a Host header: `[::1]:8787` -> `::1`, `Example:80` -> `example`;
    "" for anything that is not exactly a name or [IPv6] with an optional port
    (`127.0.0.1:1@evil`, `[::1]evil.com`)."""
    m = _HOST.fullmatch(host_header.strip().lower())
    if m is None:
        return ""
    return m.group("v6") or m.group("name")


class HostGuard:
    """ASGI middleware: refuse (403) any request whose Host is not a loopback name or one
    of `extra` hosts; add HEADERS to every HTTP response."""

    def __init__(self, app: ASGIApp, extra: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = LOOPBACK_HOSTS | ({host_name(h) for h in extra} - {""})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = ""
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
                break
        if host_name(host) not in self.allowed:
            resp = PlainTextResponse(f"host {host!r} is not allowed (coordd-web answers "
                                     "loopback names and --allow-host only)", 403)
            resp.raw_headers.extend(HEADERS)
            await resp(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + HEADERS
            await send(message)
        await self.app(scope, receive, with_headers)


PeerLookup = Callable[[tuple[str, int], tuple[str, int]], int]


class PeerGuard:
    """ASGI middleware: answer only TCP peers owned by this process's uid or root;
    refuse (403, logged) any other uid and any peer whose uid cannot be found.

    Args:
        app: the app behind the guard.
        lookup: `lookup(client, server)` -> the peer's uid, raising PeerUnknown
            (coordd_web.peer.tcp_peer_uid; tests of the app in-process give their own).
    """

    def __init__(self, app: ASGIApp, lookup: PeerLookup = tcp_peer_uid) -> None:
        self.app = app
        self.lookup = lookup
        self.allowed = frozenset({os.getuid(), 0})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client, server = scope.get("client"), scope.get("server")
        try:
            if client is None or server is None:
                raise PeerUnknown("the server did not say the connection's addresses")
            uid = self.lookup(tuple(client), tuple(server))  # type: ignore[arg-type]
            why = None if uid in self.allowed else f"uid {uid} may not use this coordd-web"
        except PeerUnknown as exc:
            uid, why = None, f"cannot tell who is connecting: {exc}"
        if why is None:
            await self.app(scope, receive, send)
            return
        logger.warning("refused %s %s from %s: %s", scope.get("method"), scope.get("path"),
                       client, why, extra={"action": "web_peer_refused", "uid": uid})
        resp = PlainTextResponse(f"{why} (coordd-web answers only its own user and root)",
                                 403)
        await resp(scope, receive, send)


def token_ok(given: str | None, token: str | None) -> bool:
    """Whether `given` is this start's token (constant-time; no token set: never)."""
    return bool(token and given and hmac.compare_digest(given.encode(), token.encode()))


def action_refusal(request: Request, token: str | None) -> str | None:
    """Why an action request is refused, or None when it may run."""
    site = request.headers.get("sec-fetch-site")
    if site != "same-origin":
        return f"cross-site request refused (Sec-Fetch-Site: {site or 'absent'})"
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host')}":
        return f"cross-origin request refused (Origin: {origin})"
    if not token_ok(request.headers.get(TOKEN_HEADER), token):
        return "the action token is missing or wrong (open the URL coordd-web printed)"
    if not token_ok(request.cookies.get(TOKEN_COOKIE), token):
        return "no token cookie (open the URL coordd-web printed, with its ?token=)"
    return None


def session_token(request: Request, token: str | None) -> str | None:
    """The token when this browser holds it (its cookie), for the page to send back."""
    return token if token_ok(request.cookies.get(TOKEN_COOKIE), token) else None


def cookie_args(token: str) -> dict[str, Any]:
    """Set-Cookie arguments for the token: not readable by scripts, same-site only."""
    return {"key": TOKEN_COOKIE, "value": token, "httponly": True, "samesite": "strict",
            "path": "/"}
