"""Run states the server decides: alive (heartbeat), crashed, stalled, and running again."""

from __future__ import annotations

import time

from sqlalchemy import func, select, update

from gradwatch.contract import ACTIVE_STATUSES
from gradwatch_server.health import monitor as health
from gradwatch_server.health.alerts import AlertBook
from gradwatch_server.storage import db


def heartbeat(conn, run_ids: list[int], now: float | None = None) -> None:
    """This server process holds these runs' connections: their clients are alive."""
    if run_ids:
        conn.execute(update(db.runs).where(db.runs.c.id.in_(run_ids)).values(seen_at=now or time.time()))


def mark_crashed(conn, cutoff: float, now: float | None = None) -> list[int]:
    """Running (or stalled) runs that no server process has heard from since ``cutoff``: 'crashed'.

    One conditional update: with several server processes, each crashed run is marked (and
    announced) by exactly one of them.
    """
    seen = func.coalesce(db.runs.c.seen_at, db.runs.c.updated_at)
    rows = conn.execute(
        update(db.runs)
        .where(db.runs.c.status.in_(ACTIVE_STATUSES), seen < cutoff)
        .values(status="crashed", updated_at=now or time.time())
        .returning(db.runs.c.id)
    ).all()
    return [r.id for r in rows]


def mark_stalled(conn, run_ids: list[int], intervals: dict, now: float | None = None) -> list[int]:
    """Connected runs that stopped sending: status 'stalled' and a 'stalled' alert saying for how long."""
    now = now or time.time()
    for run_id in run_ids:
        row = conn.execute(
            select(db.runs.c.updated_at, db.runs.c.last_step, db.runs.c.status).where(db.runs.c.id == run_id)
        ).first()
        if row is None or row.status != "running":
            continue
        conn.execute(update(db.runs).where(db.runs.c.id == run_id).values(status="stalled"))
        usual = intervals.get(run_id)
        AlertBook.load(conn, run_id).record(
            conn,
            health.Alert(
                "stalled",
                row.last_step,
                now - row.updated_at,
                "warning",
                message=(
                    f"The training process is still connected but has sent nothing for {now - row.updated_at:.0f} s"
                    + (f" (it usually sends every {usual:.1f} s)" if usual else "")
                    + ". A hung collective "
                    "(NCCL/gloo waiting for a rank), a deadlocked DataLoader or a stuck I/O call are common causes; "
                    "py-spy dump --pid <pid> shows where it waits."
                ),
            ),
            now,
        )
    return run_ids


def resume_stalled(conn, run_id: int) -> bool:
    """A stalled run sent data again: it is running."""
    conn.execute(update(db.runs).where(db.runs.c.id == run_id, db.runs.c.status == "stalled").values(status="running"))
    return True
