"""Who may change what: the dashboard's guard for state-changing requests.

The rules (tests/seeing/test_dashboard.py checks each):

* Read-only unless the app was built with ``actions=True`` AND a token; ``actions=True``
  without a token is a :class:`~echomq_core.errors.ConfigurationError` at start, not an open
  door at run time.
* Every state-changing request is a POST (reads are GETs and change nothing). A POST is
  accepted with either
  - ``Authorization: Bearer <token>`` (scripts; not sent by browsers on their own, so it
    cannot be forged cross-site), or
  - a session cookie (set by ``POST /login`` with the token) AND the CSRF field of the form
    that page carried (HMAC of the session id under a per-process secret), AND an ``Origin``
    header, when the browser sends one, naming this host.
  Anything else is answered 403 and changes nothing.
* The session cookie is ``HttpOnly``, ``SameSite=Strict``, scoped to the app's path; a
  session lives as long as the process (the secret is drawn at start).

Tokens and HMACs are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigurationError

SESSION_COOKIE = "echomq_session"
CSRF_FIELD = "csrf"
#: The shortest token accepted: guessing must be hopeless even on an open port.
MIN_TOKEN = 16


@dataclass
class Guard:
    """The token (None: read-only) and the per-process secret sessions are signed with."""

    actions: bool = False
    token: str | None = None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def __post_init__(self) -> None:
        if self.actions and not self.token:
            raise ConfigurationError(
                "dashboard actions need a token (--token-file or $ECHOMQ_DASHBOARD_TOKEN): "
                "without one it stays read-only"
            )
        if self.token is not None and len(self.token) < MIN_TOKEN:
            raise ConfigurationError(
                f"the dashboard token must be at least {MIN_TOKEN} characters long"
            )

    @property
    def enabled(self) -> bool:
        return self.actions and self.token is not None

    # -- sessions --------------------------------------------------------------------------
    def new_session(self) -> str:
        """A cookie value: a random id and its signature."""
        sid = secrets.token_hex(16)
        return f"{sid}.{self._sign('session', sid)}"

    def session_id(self, cookie: str | None) -> str | None:
        """The session id of a valid cookie, else None."""
        if not self.enabled or not cookie or "." not in cookie:
            return None
        sid, _, sig = cookie.partition(".")
        return sid if hmac.compare_digest(sig, self._sign("session", sid)) else None

    def csrf_for(self, sid: str) -> str:
        return self._sign("csrf", sid)

    def token_ok(self, given: str | None) -> bool:
        if not self.enabled or given is None or self.token is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def _sign(self, purpose: str, value: str) -> str:
        return hmac.new(self.secret, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    # -- the check of a state-changing request ----------------------------------------------
    def refuse(
        self,
        *,
        authorization: str | None,
        cookie: str | None,
        csrf: str | None,
        origin: str | None,
        host: str | None,
    ) -> str | None:
        """Why this POST is refused, or None when it may go ahead."""
        if not self.enabled:
            return "this dashboard is read-only (start it with --actions and a token)"
        if authorization is not None:
            scheme, _, given = authorization.partition(" ")
            if scheme.lower() == "bearer" and self.token_ok(given.strip()):
                return None
            return "wrong token"
        sid = self.session_id(cookie)
        if sid is None:
            return "not signed in (POST the token to login first)"
        if origin is not None and origin != "null" and urlsplit(origin).netloc != host:
            return f"cross-site request from {origin!r} refused"
        if origin == "null":
            return "cross-site request from an opaque origin refused"
        if csrf is None or not hmac.compare_digest(csrf, self.csrf_for(sid)):
            return "missing or wrong CSRF token (reload the page and try again)"
        return None


#: Security headers of every response. frame-ancestors 'self': Airflow shows the app in an
#: iframe of its own origin; no other site may frame it (clickjacking).
HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'self'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


class SecurityHeaders:
    """ASGI middleware: :data:`HEADERS` on every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
