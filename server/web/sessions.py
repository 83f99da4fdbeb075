"""Browser sessions: a random id per login that expires and can be ended (logout).

The cookie holds the random id; the database holds only its SHA-256 and expiry (table ``sessions``),
so a database leak does not log anyone in, and every server process of one database knows every
session. A check reads the database at most once per ``CACHE_SECONDS`` per session.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time

from sqlalchemy import delete, select

from gradwatch_server.storage import db

CACHE_SECONDS = 30.0  # a logout in another server process is seen within this
CACHE_LIMIT = 10000  # sessions remembered as checked; past it the memory starts over


def digest(value: str) -> str:
    """The stored form of a session id."""
    return hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()


class Sessions:
    """Create, check and end sessions; writes go through the one writer thread."""

    def __init__(self, engine, writer, days: float):
        self.engine, self.writer, self.lifetime = engine, writer, days * 86400
        self._checked: dict[str, tuple[float, float]] = {}  # digest -> (expires_at, checked at)

    async def create(self) -> str:
        """A new session; returns the cookie value."""
        value = secrets.token_urlsafe(32)
        now = time.time()
        await asyncio.wrap_future(self.writer.submit(_insert, digest(value), now, now + self.lifetime))
        return value

    async def valid(self, value: str) -> bool:
        """Whether ``value`` is a session that has not expired or been ended."""
        if not value or len(value) > 100:
            return False
        key, now = digest(value), time.time()
        known = self._checked.get(key)
        if known is None or now - known[1] > CACHE_SECONDS:
            expires = await asyncio.to_thread(self._expiry, key)
            if expires is None:
                self._checked.pop(key, None)
                return False
            if len(self._checked) >= CACHE_LIMIT:
                self._checked.clear()
            self._checked[key] = known = (expires, now)
        return known[0] > now

    async def end(self, value: str) -> None:
        """Log out: the session is gone here at once, in other server processes within CACHE_SECONDS."""
        key = digest(value)
        self._checked.pop(key, None)
        await asyncio.wrap_future(self.writer.submit(_delete, key))

    def _expiry(self, key: str) -> float | None:
        with self.engine.connect() as conn:
            return conn.execute(select(db.sessions.c.expires_at).where(db.sessions.c.id == key)).scalar()


def _insert(conn, key: str, now: float, expires: float) -> None:
    conn.execute(delete(db.sessions).where(db.sessions.c.expires_at < now))  # expired ones go as new ones come
    conn.execute(db.sessions.insert().values(id=key, created_at=now, expires_at=expires))


def _delete(conn, key: str) -> None:
    conn.execute(delete(db.sessions).where(db.sessions.c.id == key))
