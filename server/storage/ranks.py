"""The runs of one torch.distributed job: ranks streamed with ``init(all_ranks=True)`` share ``meta.group``."""

from __future__ import annotations

import json

from sqlalchemy import select

from gradwatch_server.storage import db, store


def get_ranks(conn, run_id: int) -> dict:
    """{"group", "world_size", "ranks": [{"rank", "id", "name", "status", "last_step"}]} in rank order."""
    run = store.get_run(conn, run_id)
    meta = run["meta"] or {}
    group = meta.get("group")
    world = meta.get("world_size", 1)
    if not isinstance(group, str) or not group:
        return {"group": None, "world_size": world, "ranks": [_brief(run, meta)]}
    rows = conn.execute(
        select(db.runs.c.id, db.runs.c.name, db.runs.c.status, db.runs.c.last_step, db.runs.c.meta)
        .where(db.runs.c.project == run["project"], db.runs.c.meta.contains(json.dumps(group)))
        .order_by(db.runs.c.id)
    )
    ranks = []
    for row in rows:
        other = json.loads(row.meta or "{}")
        if other.get("group") == group:  # the LIKE above only narrows; the JSON decides
            ranks.append(_brief(row._mapping, other))
    ranks.sort(key=lambda r: (r["rank"] if isinstance(r["rank"], int) else 1 << 30, r["id"]))
    return {"group": group, "world_size": world, "ranks": ranks}


def _brief(run, meta: dict) -> dict:
    return {
        "rank": meta.get("rank", 0),
        "id": run["id"],
        "name": run["name"],
        "status": run["status"],
        "last_step": run["last_step"],
    }
