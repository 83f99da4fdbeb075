"""A project's notification channels (stored, validated) and the record of every delivery."""

from __future__ import annotations

import json
import re
import time
import urllib.parse

from sqlalchemy import select

from gradwatch import contract
from gradwatch_server.notify.formats import FORMATS
from gradwatch_server.storage import db

MAX_CHANNELS = 20
EMAIL = re.compile(r"^[^@\s,]+@[^@\s,]+$")


def check(i: int, ch) -> dict:
    """One channel normalised, or ValueError naming what is wrong."""
    where = f"channels[{i}]"
    if not isinstance(ch, dict) or ch.get("kind") not in ("webhook", "email"):
        raise ValueError(f"{where}.kind must be 'webhook' or 'email'")
    severity = ch.get("min_severity", "warning")
    if severity not in contract.SEVERITIES:
        raise ValueError(f"{where}.min_severity must be one of {', '.join(contract.SEVERITIES)}")
    if ch["kind"] == "webhook":
        url, fmt = ch.get("url"), ch.get("format", "json")
        if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https") or len(url) > 2000:
            raise ValueError(f"{where}.url must be an http(s) URL")
        if fmt not in FORMATS:
            raise ValueError(f"{where}.format must be one of {', '.join(FORMATS)}")
        return {"kind": "webhook", "url": url, "format": fmt, "min_severity": severity}
    to = ch.get("to")
    if isinstance(to, str):
        to = [t.strip() for t in to.split(",") if t.strip()]
    if not isinstance(to, list) or not to or not all(isinstance(t, str) and EMAIL.match(t) for t in to):
        raise ValueError(f"{where}.to must be one or more email addresses")
    return {"kind": "email", "to": to[:50], "min_severity": severity}


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
    if ch["kind"] == "email":
        return ("email " + ", ".join(ch["to"]))[:400]
    parts = urllib.parse.urlsplit(ch["url"])
    return f"{ch['format']} {parts.scheme}://{parts.netloc}{parts.path}"[:400]


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
