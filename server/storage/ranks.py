"""The runs of one torch.distributed job: ranks streamed with ``init(all_ranks=True)`` share ``meta.group``."""

from __future__ import annotations

import json

import numpy as np
from sqlalchemy import select

from gradwatch.contract import keys
from gradwatch_server.storage import chunks, db, store

STEP_TIME, DATA_WAIT = keys.STEP_TIME, keys.DATA_WAIT  # what gradwatch.capture.step_timer records
RECENT = 50  # steps: a rank's pace is the median over its latest this many step times
STRAGGLER_RATIO = 1.3  # a rank 30 % slower than the ranks' median is the straggler (see ``straggler``)


def get_ranks(conn, run_id: int) -> dict:
    """{"group", "world_size", "straggler", "ranks": [{"rank", "id", "name", "status", "last_step", "step_time",
    "data_wait", "straggler"}]} in rank order; ``straggler`` at the top is that rank's run id (or None)."""
    run = store.get_run(conn, run_id)
    meta = run["meta"] or {}
    group = meta.get("group")
    world = meta.get("world_size", 1)
    if not isinstance(group, str) or not group:
        return _paced(conn, {"group": None, "world_size": world, "ranks": [_brief(run, meta)]})
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
    return _paced(conn, {"group": group, "world_size": world, "ranks": ranks})


def _paced(conn, job: dict) -> dict:
    """Each rank's recent median step time and data wait, and the straggler among them named."""
    for r in job["ranks"]:
        keys = _scalar_keys(conn, r["id"])
        r["step_time"] = recent_median(conn, keys.get(STEP_TIME))
        r["data_wait"] = recent_median(conn, keys.get(DATA_WAIT))
    job["straggler"] = straggler(job["ranks"])
    for r in job["ranks"]:
        r["straggler"] = r["id"] == job["straggler"]
    return job


def straggler(ranks: list[dict]) -> int | None:
    """The run id of the rank the job waits for, or None.

    Either its median step time is >= STRAGGLER_RATIO x the ranks' median (ranks that do not synchronise
    every step), or, in synchronous data-parallel training where every rank's step takes as long as the
    slowest's, its data wait exceeds the ranks' median wait by (STRAGGLER_RATIO - 1) x the median step:
    the time it spends before its forward, the others spend waiting for it in the all-reduce.
    """
    known = [r for r in ranks if r["step_time"] is not None and r["step_time"] > 0]
    if len(known) < 2:
        return None
    pace = float(np.median([r["step_time"] for r in known]))
    slowest = max(known, key=lambda r: r["step_time"])
    if slowest["step_time"] >= STRAGGLER_RATIO * pace:
        return slowest["id"]
    waits = [r for r in known if r["data_wait"] is not None]
    if len(waits) < 2:
        return None
    usual = float(np.median([r["data_wait"] for r in waits]))
    waiter = max(waits, key=lambda r: r["data_wait"])
    return waiter["id"] if waiter["data_wait"] - usual >= (STRAGGLER_RATIO - 1) * pace else None


def _scalar_keys(conn, run_id: int) -> dict:
    c = db.metric_keys.c
    rows = conn.execute(
        select(c.key, c.id).where(c.run_id == run_id, c.key.in_((STEP_TIME, DATA_WAIT)), c.layers.is_(None))
    )
    return {row.key: row.id for row in rows}


def recent_median(conn, key_id: int | None) -> float | None:
    """The median of a scalar key's latest RECENT finite points (None without any): read from the last chunks only."""
    if key_id is None:
        return None
    _, hi = chunks.bounds(conn, key_id, None, None)
    if hi is None:
        return None
    values = chunks.read(conn, key_id, max(0, hi - RECENT + 1), hi, column=0).values[:, 0]
    values = values[np.isfinite(values)][-RECENT:]
    return float(np.median(values)) if len(values) else None


def _brief(run, meta: dict) -> dict:
    return {
        "rank": meta.get("rank", 0),
        "id": run["id"],
        "name": run["name"],
        "status": run["status"],
        "last_step": run["last_step"],
        "step_time": None,
        "data_wait": None,
        "straggler": False,
    }
