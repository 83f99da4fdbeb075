"""The audit log: who (a token's name and role) did what (a write through the API, a login, a token change), when.

Written through the writer, off the request's path; read by admins (``GET /api/audit``, ``gradwatch audit``).
"""

from __future__ import annotations

import json
import time

from sqlalchemy import select

from gradwatch_server.storage import db

MAX_ROWS = 1000


def record(conn, who: str, role: str, action: str, status: int | None, project=None, detail=None) -> None:
    conn.execute(
        db.audit.insert().values(
            at=time.time(),
            who=who[:200],
            role=role,
            action=action[:300],
            status=status,
            project=None if project is None else str(project)[:200],
            detail=None if detail is None else json.dumps(detail)[:4000],
        )
    )


def listing(conn, limit: int = 200, who: str | None = None, project: str | None = None) -> list[dict]:
    """The newest entries first, at most ``limit`` (at most MAX_ROWS)."""
    a = db.audit.c
    query = select(db.audit).order_by(a.id.desc()).limit(max(1, min(limit, MAX_ROWS)))
    if who:
        query = query.where(a.who == who)
    if project:
        query = query.where(a.project == project)
    cols = ("id", "at", "who", "role", "action", "status", "project")
    return [
        {**{c: getattr(r, c) for c in cols}, "detail": json.loads(r.detail) if r.detail else None}
        for r in conn.execute(query)
    ]


def note(writer, identity, action: str, status: int | None = None, project=None, detail=None) -> None:
    """Record an entry through ``writer`` without waiting for it (a request never waits on its audit line)."""
    writer.submit(record, identity.name, identity.role, action, status, project, detail)
