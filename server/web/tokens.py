"""Named tokens: created with a role (web/roles.py), an optional project list and expiry; stored as SHA-256.

The secret is printed once at creation and never stored. The server's own ``--token`` stays valid as the
``admin`` token named ``server-token``. Lookups are cached for ``CACHE_SECONDS``, so a revocation made by
another server process is seen within that; in this process at once.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time

from sqlalchemy import select, update

from gradwatch_server.storage import db
from gradwatch_server.web.roles import ROLES, Identity

PREFIX = "gw_"
SERVER_TOKEN = "server-token"  # the name of the --token identity
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")
CACHE_SECONDS = 30.0


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()


def check(name, role, projects=None, expires_at=None) -> tuple:
    """(name, role, projects, expires_at) checked, or ValueError saying what is wrong."""
    if not isinstance(name, str) or not NAME.match(name) or name == SERVER_TOKEN:
        raise ValueError("name must be 1-100 letters, digits, '.', '_', '@' or '-' (and not 'server-token')")
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    if projects is not None:
        if isinstance(projects, str):
            projects = [p.strip() for p in projects.split(",") if p.strip()]
        if not isinstance(projects, list) or not projects or not all(isinstance(p, str) and p for p in projects):
            raise ValueError("projects must be a list of project names (or absent: every project)")
        projects = sorted(set(projects))[:100]
    if expires_at is not None and (isinstance(expires_at, bool) or not isinstance(expires_at, (int, float))):
        raise ValueError("expires_at must be a Unix time (seconds)")
    return name, role, projects, expires_at


def create(conn, name, role, projects=None, expires_at=None, by: str | None = None) -> dict:
    """A new token; its ``secret`` is in the answer only. ValueError for a bad field or a name in use."""
    name, role, projects, expires_at = check(name, role, projects, expires_at)
    if conn.execute(select(db.tokens.c.id).where(db.tokens.c.name == name)).first():
        raise ValueError(f"a token named {name!r} exists (revoke it first, or pick another name)")
    secret = PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        db.tokens.insert().values(
            name=name,
            digest=digest(secret),
            role=role,
            projects=None if projects is None else json.dumps(projects),
            created_at=time.time(),
            created_by=by,
            expires_at=expires_at,
        )
    )
    return {**_row(conn, name), "secret": secret}


def revoke(conn, name: str) -> dict:
    """Revoke (and free the name of) a token; KeyError when there is none by that name."""
    row = _row(conn, name)
    if row is None:
        raise KeyError(name)
    conn.execute(db.tokens.delete().where(db.tokens.c.name == name))
    return {**row, "revoked_at": time.time()}


def listing(conn) -> list[dict]:
    rows = conn.execute(select(db.tokens).order_by(db.tokens.c.id))
    return [_dict(r) for r in rows]


def _row(conn, name: str) -> dict | None:
    row = conn.execute(select(db.tokens).where(db.tokens.c.name == name)).first()
    return None if row is None else _dict(row)


def _dict(r) -> dict:
    now = time.time()
    return {
        "name": r.name,
        "role": r.role,
        "projects": None if r.projects is None else json.loads(r.projects),
        "created_at": r.created_at,
        "created_by": r.created_by,
        "expires_at": r.expires_at,
        "expired": r.expires_at is not None and r.expires_at <= now,
        "last_used_at": r.last_used_at,
    }


def lookup(conn, key: str) -> Identity | None:
    """The identity of a live (not expired) token by its digest, or None."""
    r = conn.execute(select(db.tokens).where(db.tokens.c.digest == key)).first()
    if r is None or (r.expires_at is not None and r.expires_at <= time.time()):
        return None
    projects = None if r.projects is None else frozenset(json.loads(r.projects))
    return Identity(r.name, r.role, projects, key)


def touch(conn, key: str) -> None:
    """Remember when a token was last used (at most once a cache period: the lookup's)."""
    conn.execute(update(db.tokens).where(db.tokens.c.digest == key).values(last_used_at=time.time()))


def any_exist(conn) -> bool:
    return conn.execute(select(db.tokens.c.id).limit(1)).first() is not None


def select_digest(name: str):
    return select(db.tokens.c.digest).where(db.tokens.c.name == name)
