"""Browser sessions: a random id per login that expires and can be ended (logout).

The cookie holds the random id; the database holds only its SHA-256, its expiry and the digest of the
token that logged in (table ``sessions``), so a database leak does not log anyone in, and every server
process of one database knows every session. A session is as good as its token: revoking the token, or
changing the server's ``--token``, ends it (``identify.Auth`` checks the token on every request). A check
reads the database at most once per ``CACHE_SECONDS`` per session.
"""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import delete, select

from gradwatch_server.storage import db
from gradwatch_server.web import pools

CACHE_SECONDS = 30.0  # a logout in another server process is seen within this
CACHE_LIMIT = 10000  # sessions remembered as checked; past it the memory starts over


def digest(value: str) -> str:
    """The stored form of a session id."""
    return hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()


class Sessions:
    """Create, check and end sessions; writes go through the one writer thread."""

    def __init__(self, engine, writer, days: float):
        self.engine, self.writer, self.lifetime = engine, writer, days * 86400
        self._checked: dict[str, tuple[float, str | None, float]] = {}  # digest -> (expires_at, token, checked)

    async def create(self, token_digest: str) -> str:
        """A new session of the token whose digest is given; returns the cookie value."""
        value = secrets.token_urlsafe(32)
        now = time.time()
        await self.writer.submit_here(_insert, digest(value), now, now + self.lifetime, token_digest)
        return value

    async def token_of(self, value: str) -> str | None:
        """The digest of the token that made session ``value``, if it has not expired or been ended."""
        if not value or len(value) > 100:
            return None
        key, now = digest(value), time.time()
        known = self._checked.get(key)
        if known is None or now - known[2] > CACHE_SECONDS:
            row = await pools.run("sessions", self._row, key)
            if row is None:
                self._checked.pop(key, None)
                return None
            if len(self._checked) >= CACHE_LIMIT:
                self._checked.clear()
            self._checked[key] = known = (row[0], row[1], now)
        return known[1] if known[0] > now else None

    async def end(self, value: str) -> None:
        """Log out: the session is gone here at once, in other server processes within CACHE_SECONDS."""
        key = digest(value)
        self._checked.pop(key, None)
        await self.writer.submit_here(_delete, key)

    def _row(self, key: str) -> tuple | None:
        with self.engine.connect() as conn:
            s = db.sessions.c
            return conn.execute(select(s.expires_at, s.token_digest).where(s.id == key)).first()


def _insert(conn, key: str, now: float, expires: float, token_digest: str) -> None:
    conn.execute(delete(db.sessions).where(db.sessions.c.expires_at < now))  # expired ones go as new ones come
    conn.execute(db.sessions.insert().values(id=key, created_at=now, expires_at=expires, token_digest=token_digest))


def end_of_token(conn, token_digest: str) -> None:
    """Every session a (revoked) token made, gone."""
    conn.execute(delete(db.sessions).where(db.sessions.c.token_digest == token_digest))


def _delete(conn, key: str) -> None:
    conn.execute(delete(db.sessions).where(db.sessions.c.id == key))
