"""A project's notification channels (stored, validated) and the record of every delivery."""

from __future__ import annotations

import json
import time
import urllib.parse

from sqlalchemy import select

from gradwatch import contract
from gradwatch_server.notify import kinds
from gradwatch_server.storage import db

MAX_CHANNELS = 20
MAX_RECIPIENTS = 50  # email addresses over all of a project's channels (a test would mail each of them)
MASK = "…"  # a secret option as the API shows it: its start, this, its last 4 characters


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


def validate(body, stored: list[dict] | None = None) -> list[dict]:
    """The channels of a PUT body, normalised; a secret sent back masked (as GET shows it) keeps its stored value."""
    chans = body.get("channels") if isinstance(body, dict) else None
    if not isinstance(chans, list) or len(chans) > MAX_CHANNELS:
        raise ValueError(f"channels must be a list of at most {MAX_CHANNELS}")
    known = {masked_value(v): v for ch in stored or [] for v in _secrets(ch).values()}
    chans = [_unmasked(c, known) if isinstance(c, dict) else c for c in chans]
    out = [check(i, c) for i, c in enumerate(chans)]
    recipients = sum(len(c.get("to", ())) for c in out)
    if recipients > MAX_RECIPIENTS:
        raise ValueError(f"at most {MAX_RECIPIENTS} email recipients over all channels, got {recipients}")
    return out


def _secrets(ch: dict) -> dict:
    """The channel's secret options (a webhook's URL): name -> value."""
    try:
        kind = kinds.of(ch)
    except ValueError:
        return {}
    return {o.name: ch[o.name] for o in kind.options if o.secret and isinstance(ch.get(o.name), str)}


def _unmasked(ch: dict, known: dict) -> dict:
    return {**ch, **{name: known[v] for name, v in _secrets(ch).items() if v in known}}


def masked_value(value: str) -> str:
    """``https://hooks.slack.com/…abcd``: enough to tell channels apart, not enough to post to one."""
    parts = urllib.parse.urlsplit(value)
    head = f"{parts.scheme}://{parts.netloc}/" if parts.scheme else ""
    return f"{head}{MASK}{value[-4:]}"


def masked(chans: list[dict]) -> list[dict]:
    """Channels as the API shows them: secrets write-only (masked)."""
    return [{**ch, **{name: masked_value(v) for name, v in _secrets(ch).items()}} for ch in chans]


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
