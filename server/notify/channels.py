"""A project's notification channels (stored, validated) and the record of every delivery."""

from __future__ import annotations

import json
import time

from sqlalchemy import select

from gradwatch import contract
from gradwatch_server.notify import kinds
from gradwatch_server.storage import db

MAX_CHANNELS = 20


def check(i: int, ch) -> dict:
    """One channel normalised (its kind's stored fields, its options, min_severity), or ValueError naming what is wrong."""
    where = f"channels[{i}]"
    if not isinstance(ch, dict):
        raise ValueError(f"{where} must be an object")
    try:
        kind = kinds.of(ch)
    except ValueError as exc:
        raise ValueError(f"{where} {exc}") from None
    severity = ch.get("min_severity", "warning")
    if severity not in contract.SEVERITIES:
        raise ValueError(f"{where}.min_severity must be one of {', '.join(contract.SEVERITIES)}")
    return {**kind.stored, **kind.check(where, ch), "min_severity": severity}


def validate(body) -> list[dict]:
    chans = body.get("channels") if isinstance(body, dict) else None
    if not isinstance(chans, list) or len(chans) > MAX_CHANNELS:
        raise ValueError(f"channels must be a list of at most {MAX_CHANNELS}")
    return [check(i, c) for i, c in enumerate(chans)]


def load(conn, project: str) -> list[dict]:
    row = conn.execute(select(db.notify_channels.c.channels).where(db.notify_channels.c.project == project)).first()
    return json.loads(row.channels) if row else []


def save(conn, project: str, chans: list[dict]) -> list[dict]:
    values = {"channels": json.dumps(chans), "updated_at": time.time()}
    if conn.execute(select(db.notify_channels.c.project).where(db.notify_channels.c.project == project)).first():
        conn.execute(db.notify_channels.update().where(db.notify_channels.c.project == project).values(**values))
    else:
        conn.execute(db.notify_channels.insert().values(project=project, **values))
    return chans


def describe(ch: dict) -> str:
    """How a delivery names its channel (a webhook's URL without its query, where secrets live)."""
    return kinds.of(ch).describe(ch)


def record(conn, project: str, run_id, incident_id, channel: str, status: str, reason, attempts: int) -> None:
    conn.execute(
        db.deliveries.insert().values(
            project=project,
            run_id=run_id,
            incident_id=incident_id,
            channel=channel,
            status=status,
            reason=None if reason is None else str(reason)[:2000],
            attempts=attempts,
            at=time.time(),
        )
    )


def deliveries(conn, project: str, limit: int = 100) -> list[dict]:
    rows = conn.execute(
        select(db.deliveries).where(db.deliveries.c.project == project).order_by(db.deliveries.c.id.desc()).limit(limit)
    )
    cols = ("id", "run_id", "incident_id", "channel", "status", "reason", "attempts", "at")
    return [{c: getattr(r, c) for c in cols} for r in rows]
