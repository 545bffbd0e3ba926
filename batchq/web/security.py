"""The console's safety rules, applied to every request before any route runs.

* **Bind.** Loopback is the default; any other address needs a token
  (:func:`check_bind` refuses to start without one).
* **Auth.** With a token, every request but the login page and the static assets must
  carry it: ``Authorization: Bearer <token>``, HTTP basic auth with the token as the
  password (``curl -u :TOKEN``), or the session cookie the login form sets (an HMAC of
  the token, HttpOnly, SameSite=Strict). Without one, ``401``.
* **Host.** Without a token, only loopback host names are answered, so a DNS-rebinding
  page cannot read the console through the operator's browser.
* **CSRF.** Every action is a POST that must send ``X-CSRF-Token`` (the value the page
  carries in a meta tag, unreadable cross-origin) and, when the browser says where it
  comes from (``Origin``, ``Sec-Fetch-Site``), come from this origin.
* **Read-only.** Actions are refused with ``403``.
* **Headers.** A strict Content-Security-Policy (scripts and styles from this origin
  only, no inline script, no framing), ``nosniff``, no referrer beyond this origin, no caching.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MIN_TOKEN_CHARS = 16
"""Shorter tokens are refused: the token is the only thing between the network and the
retry/purge buttons."""

COOKIE = "batchq_session"
CSRF_HEADER = "x-csrf-token"
USER_SCOPE = "batchq.user"
"""Where the request's scope carries who acts (``console:<name>``, the user name of
HTTP basic auth) for the audit log; absent: the anonymous console."""
MAX_USER_CHARS = 64
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make form posts "Origin: null"
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

PUBLIC_PREFIXES = ("/static/", "/login")
"""Paths answered without the token (the login form and its assets)."""


class InsecureBindError(ValueError):
    """The console would listen beyond loopback without a token, or the token is weak."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    h = host.strip("[]").lower()
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse a token too short, and a non-loopback bind without a token."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise InsecureBindError(
            f"the web token is too short ({len(token)} characters; at least "
            f"{MIN_TOKEN_CHARS}: e.g. `openssl rand -hex 16`)")
    if token is None and not is_loopback(host):
        raise InsecureBindError(
            f"refusing to serve the web console on {host!r} without a token: anyone who "
            "can reach it could retry or purge jobs. Set BATCHQ_WEB_TOKEN (or pass "
            "--token; --web-token to batchq worker), or bind to 127.0.0.1")


def session_value(token: str) -> str:
    """The login cookie's value: derived from the token, never the token itself."""
    return hmac.new(token.encode(), b"batchq-web-session", hashlib.sha256).hexdigest()


def csrf_value(token: str | None) -> str:
    """The CSRF token pages send back with every action. Derived from the auth token when
    there is one (so replicas behind one address agree), else random per process."""
    if token is None:
        return secrets.token_urlsafe(32)
    return hmac.new(token.encode(), b"batchq-web-csrf", hashlib.sha256).hexdigest()


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return bytes(v).decode("latin-1")
    return None


def _cookie(scope: Scope, name: str) -> str | None:
    raw = _header(scope, b"cookie") or ""
    for part in raw.split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


def same_secret(a: str, b: str) -> bool:
    """Constant-time comparison of two secrets."""
    return hmac.compare_digest(a.encode(), b.encode())


class Guard:
    """ASGI middleware enforcing the module docstring's rules around the routes."""

    def __init__(self, app: ASGIApp, *, token: str | None, csrf: str, read_only: bool,
                 actions: frozenset[str], login_page: bytes,
                 on_close: Callable[[], None] | None = None) -> None:
        self.app = app
        self.on_close = on_close
        self.console: Any = None
        """The routes' state (``routes.Console``), for a test to look at."""
        self.login_page = login_page
        self.token = token
        self.session = session_value(token) if token else None
        self.csrf = csrf
        self.read_only = read_only
        self.actions = actions

    def close(self) -> None:
        """The server stops: end what the routes run in the background."""
        if self.on_close is not None:
            self.on_close()

    @staticmethod
    def user_of(scope: Scope) -> str | None:
        """The user name of HTTP basic auth (``curl -u alice:TOKEN``), as the audit log
        records it: ``console:alice``; None without one."""
        scheme, _, cred = (_header(scope, b"authorization") or "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user = base64.b64decode(cred.strip()).decode().partition(":")[0]
        except (ValueError, UnicodeDecodeError):
            return None
        user = "".join(ch for ch in user if ch.isprintable())[:MAX_USER_CHARS]
        return f"console:{user}" if user else None

    def authorized(self, scope: Scope) -> bool:
        """The request carries the token (header, basic auth or session cookie)."""
        if self.token is None or self.session is None:
            return True
        auth = _header(scope, b"authorization") or ""
        scheme, _, cred = auth.partition(" ")
        if scheme.lower() == "bearer" and same_secret(cred.strip(), self.token):
            return True
        if scheme.lower() == "basic":
            try:
                _, _, password = base64.b64decode(cred.strip()).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                password = ""
            if same_secret(password, self.token):
                return True
        cookie = _cookie(scope, COOKIE)
        return cookie is not None and same_secret(cookie, self.session)

    def host_allowed(self, scope: Scope) -> bool:
        """Without a token only loopback names may be asked for (DNS rebinding)."""
        if self.token is not None:
            return True
        host = _header(scope, b"host") or ""
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return is_loopback(name)

    def same_origin(self, scope: Scope) -> bool:
        if (_header(scope, b"sec-fetch-site") or "same-origin") not in ("same-origin", "none"):
            return False
        origin = _header(scope, b"origin")
        if origin is None:
            return True
        return urlsplit(origin).netloc == (_header(scope, b"host") or "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secure(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", [])
                           if h[0].lower() not in {k for k, _ in SECURITY_HEADERS}]
                message["headers"] = headers + SECURITY_HEADERS
            await send(message)

        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        if not self.host_allowed(scope):
            await _refuse(send_secure, 421, "this console answers only to a loopback host "
                          "name (start it with --token to serve other names)")
            return
        public = path.startswith(PUBLIC_PREFIXES)
        if not public and not self.authorized(scope):
            if path.startswith("/api/") or method != "GET":
                await _refuse(send_secure, 401, "unauthorized: send the console token",
                              [(b"www-authenticate", b'Bearer realm="batchq"')])
            else:  # a page: the login form, still a 401
                await _send(send_secure, 401, self.login_page, b"text/html; charset=utf-8")
            return
        if method not in ("GET", "HEAD"):
            if not self.same_origin(scope):
                await _refuse(send_secure, 403, "cross-origin request refused")
                return
            if path != "/login":
                sent = _header(scope, CSRF_HEADER.encode()) or ""
                if not same_secret(sent, self.csrf):
                    await _refuse(send_secure, 403, "missing or wrong CSRF token: reload "
                                  "the page")
                    return
            if self.read_only and path in self.actions:
                await _refuse(send_secure, 403, "this console is read-only")
                return
            if self.token is not None:  # a name is only taken from an authorized client
                user = self.user_of(scope)
                if user is not None:
                    scope[USER_SCOPE] = user
        await self.app(scope, receive, send_secure)


async def _refuse(send: Send, status: int, error: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await _send(send, status, json.dumps({"error": error}).encode(), b"application/json",
                extra)


async def _send(send: Send, status: int, body: bytes, ctype: bytes,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
