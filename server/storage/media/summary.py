"""What a script set in ``run.summary`` (W&B's), per run and key (the ``run_summary`` table)."""

from __future__ import annotations

import json

from sqlalchemy import delete, func, select

from gradwatch_server.storage import db

MAX_KEYS = 1000  # run.summary keys kept per run


def set_values(conn, run_id: int, values: dict, removed: list) -> None:
    """Merge ``values`` (key -> JSON text) into a run's summary and drop ``removed`` keys."""
    s = db.run_summary.c
    gone = [*values, *removed]
    if gone:
        conn.execute(delete(db.run_summary).where(s.run_id == run_id, s.key.in_(gone)))
    held = conn.execute(select(func.count()).select_from(db.run_summary).where(s.run_id == run_id)).scalar()
    rows = [{"run_id": run_id, "key": k, "value": v} for k, v in list(values.items())[: max(0, MAX_KEYS - held)]]
    if rows:
        conn.execute(db.run_summary.insert(), rows)


def of_runs(conn, run_ids: list[int]) -> dict[int, dict]:
    """run id -> {key: value} of what scripts set in run.summary."""
    s = db.run_summary.c
    out: dict[int, dict] = {}
    for run_id, key, value in conn.execute(select(s.run_id, s.key, s.value).where(s.run_id.in_(run_ids))):
        out.setdefault(run_id, {})[key] = json.loads(value)
    return out


def delete_run(conn, run_id: int) -> None:
    """Remove a run's summary values (``runs rm``, retention)."""
    conn.execute(delete(db.run_summary).where(db.run_summary.c.run_id == run_id))
