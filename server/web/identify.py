"""Who a request is: the server's token, named tokens (``web.tokens``), browser sessions, one-time login codes."""

from __future__ import annotations

import hmac
import secrets
import time

from gradwatch_server.web import pools, tokens
from gradwatch_server.web.roles import Identity

COOKIE = "gradwatch_session"


class Auth:
    """Who a request is: the server's token, named tokens (``web.tokens``), browser sessions, one-time codes."""

    def __init__(self, token: str, sessions=None, engine=None):
        self.token = token
        self.server_digest = tokens.digest(token) if token else None
        self.sessions = sessions  # None: no database (unit tests); only the bearer token then
        self.engine = engine
        self.named = False  # named tokens exist (then a token is required even without --token)
        self._once: set[str] = set()
        self._known: dict[str, tuple[Identity | None, float]] = {}  # digest -> (identity, checked at)

    @property
    def enabled(self) -> bool:
        return bool(self.token) or self.named

    def start(self) -> None:
        """Learn whether named tokens exist (they make a token required); called once the database is up."""
        if self.engine is not None:
            with self.engine.connect() as conn:
                self.named = tokens.any_exist(conn)

    def new_once_code(self) -> str:
        """A random code that /login?once= exchanges for a session (of the server token) exactly once."""
        code = secrets.token_urlsafe(24)
        self._once.add(code)
        return code

    def redeem(self, code: str) -> bool:
        """True (and the code is gone) if ``code`` is an unused one-time code."""
        for known in list(self._once):
            if hmac.compare_digest(known.encode(), code.encode()):
                self._once.discard(known)
                return True
        return False

    def token_matches(self, candidate: str) -> bool:
        return bool(self.token) and hmac.compare_digest(self.token.encode(), candidate.encode())

    async def of_secret(self, secret: str) -> Identity | None:
        """The identity of a token's secret (the server's, or a live named one), or None."""
        if not secret or len(secret) > 200:
            return None
        if self.token_matches(secret):
            return Identity(tokens.SERVER_TOKEN, "admin", None, self.server_digest)
        return await self.of_digest(tokens.digest(secret))

    async def of_digest(self, key: str | None) -> Identity | None:
        """The identity of a token digest (what a session stores); named ones cached CACHE_SECONDS."""
        if not key:
            return None
        if self.server_digest and hmac.compare_digest(key, self.server_digest):
            return Identity(tokens.SERVER_TOKEN, "admin", None, key)
        if self.engine is None:
            return None
        now = time.monotonic()
        known = self._known.get(key)
        if known is None or now - known[1] > tokens.CACHE_SECONDS:
            found = await pools.run("sessions", self._lookup, key)
            if len(self._known) >= 10000:
                self._known.clear()
            self._known[key] = known = (found, now)
        return known[0]

    def _lookup(self, key: str) -> Identity | None:
        with self.engine.begin() as conn:
            found = tokens.lookup(conn, key)
            if found is not None:
                tokens.touch(conn, key)
            return found

    def forget(self, key: str | None = None) -> None:
        """A token was revoked here: no cached answer for it (or any, with ``key`` None) survives."""
        if key is None:
            self._known.clear()
        else:
            self._known.pop(key, None)

    async def identify(self, headers: dict) -> Identity | None:
        """The identity of a bearer token or a live session cookie in the request's headers, or None."""
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            found = await self.of_secret(value.strip())
            if found is not None:
                return found
        if self.sessions is None:
            return None
        for candidate in cookie_values(headers.get("cookie", ""), COOKIE)[:4]:
            found = await self.of_digest(await self.sessions.token_of(candidate))
            if found is not None:
                return found
        return None


def cookie_values(header: str, name: str) -> list[str]:
    """Every value of cookie ``name`` in a Cookie header, read leniently: a malformed cookie of some
    other site or app on this host (the stdlib parser gives up on the whole header) hides nothing."""
    out = []
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key.strip() == name:
            out.append(value.strip().strip('"'))
    return out
