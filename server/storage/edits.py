"""User edits to runs (rename, tags, notes, delete) and the config diff used by comparisons."""

from __future__ import annotations

import json

from sqlalchemy import delete, select, update

from gradwatch import protocol
from gradwatch.contract import MAX_NAME_LEN, MAX_TAG_LEN, MAX_TAGS
from gradwatch_server.storage import chunks, db
from gradwatch_server.storage.blocks import clock
from gradwatch_server.storage.media import rows as media_rows
from gradwatch_server.storage.media import summary as run_summary
from gradwatch_server.storage.store import NotFound


def check_changes(body: dict) -> dict:
    """Validate a PATCH body; raises ValueError naming the bad field."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    unknown = set(body) - {"name", "tags", "notes"}
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(sorted(unknown))}; allowed: name, tags, notes")
    for field, value in body.items():
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(t, str) and not protocol.valid_unicode(t) for t in texts):
            raise ValueError(f"{field} is not valid Unicode text (it holds a lone surrogate)")
    changes = {}
    if "name" in body:
        if not isinstance(body["name"], str) or not body["name"].strip() or len(body["name"]) > MAX_NAME_LEN:
            raise ValueError(f"name must be a non-empty string of at most {MAX_NAME_LEN} characters")
        changes["name"] = body["name"].strip()
    if "tags" in body:
        tags = body["tags"]
        if (
            not isinstance(tags, list)
            or len(tags) > MAX_TAGS
            or not all(isinstance(t, str) and 0 < len(t) <= MAX_TAG_LEN for t in tags)
        ):
            raise ValueError(f"tags must be a list of at most {MAX_TAGS} strings (1-{MAX_TAG_LEN} characters each)")
        changes["tags"] = json.dumps(list(dict.fromkeys(tags)))
    if "notes" in body:
        if not isinstance(body["notes"], str) or len(body["notes"]) > 20000:
            raise ValueError("notes must be a string of at most 20000 characters")
        changes["notes"] = body["notes"]
    return changes


def update_run(conn, run_id: int, changes: dict) -> None:
    """Apply validated changes; NotFound for an unknown run."""
    if conn.execute(select(db.runs.c.id).where(db.runs.c.id == run_id)).first() is None:
        raise NotFound(f"run {run_id} not found")
    if changes:
        conn.execute(update(db.runs).where(db.runs.c.id == run_id).values(**changes))


def delete_run(conn, run_id: int) -> None:
    """Remove a run and every point, vector, rollup and alert it owns."""
    if conn.execute(select(db.runs.c.id).where(db.runs.c.id == run_id)).first() is None:
        raise NotFound(f"run {run_id} not found")
    key_ids = select(db.metric_keys.c.id).where(db.metric_keys.c.run_id == run_id).scalar_subquery()
    chunks.delete_keys(conn, key_ids)
    clock.delete_run(conn, run_id)
    conn.execute(delete(db.rollups).where(db.rollups.c.key_id.in_(key_ids)))
    conn.execute(delete(db.rollup_heat).where(db.rollup_heat.c.key_id.in_(key_ids)))
    conn.execute(delete(db.metric_keys).where(db.metric_keys.c.run_id == run_id))
    conn.execute(delete(db.alerts).where(db.alerts.c.run_id == run_id))
    conn.execute(delete(db.incidents).where(db.incidents.c.run_id == run_id))
    media_rows.delete_run(conn, run_id)
    run_summary.delete_run(conn, run_id)
    conn.execute(delete(db.runs).where(db.runs.c.id == run_id))


def _flatten(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_diff(runs: list[dict]) -> dict:
    """Flattened configs side by side; ``differs`` lists keys whose values are not all equal."""
    flat = [_flatten(r.get("config") or {}) for r in runs]
    keys = sorted(set().union(*flat)) if flat else []
    rows = [
        {
            "key": k,
            "values": [f.get(k) for f in flat],
            "differs": len({json.dumps(f.get(k, "\u2205missing"), sort_keys=True) for f in flat}) > 1,
        }
        for k in keys
    ]
    return {
        "runs": [{k: r[k] for k in ("id", "name", "project", "status")} for r in runs],
        "rows": rows,
        "differs": [row["key"] for row in rows if row["differs"]],
    }
