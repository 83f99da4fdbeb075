"""Histograms, images, tables and text per run, key and step (the ``media`` table): written, read, deleted.

Rows are written by ``ingest/media.py`` on the writer thread and read here for the API. A histogram's
counts are packed int64 (its range, or its edges, and its NaN/inf counts in ``meta``); an image is its
PNG bytes; a table or a text is UTF-8 JSON. Reads of many steps thin them evenly (every step when
the range asked for holds fewer than ``max_steps``), so a long run's distribution still draws fast.
"""

from __future__ import annotations

import functools
import json

import numpy as np
from sqlalchemy import delete, func, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite

from gradwatch_server.storage import db
from gradwatch_server.storage.prepared import Prepared
from gradwatch_server.storage.store import NotFound, require_run


def store(conn, run_id: int, rows: list[dict]) -> None:
    """Insert media rows ({key, kind, step, idx, wall, meta, body}); a key logged again at a step replaces it.

    A histogram (one row, idx 0) is upserted on the unique (run, key, step, idx) index, one executemany
    for the lot: a watch() capture's hundreds of rows then cost no ``DELETE`` (which almost never matched,
    and cost more than the insert); images, tables and text have their (key, step) rows deleted first,
    so a list logged again with fewer images keeps none of the old ones.
    """
    m = db.media.c
    latest = {(r["key"], r["step"], r["idx"]): r for r in rows}  # the same key twice at a step in one batch: the last
    rows, upserted = [], []
    for r in latest.values():
        as_one = r["kind"] == "histogram" and r["idx"] == 0 and conn.dialect.name in UPSERT_DIALECTS
        (upserted if as_one else rows).append({"run_id": run_id, "nbytes": len(r["body"]), **r})
    pairs = sorted({(r["key"], r["step"]) for r in rows})
    for i in range(0, len(pairs), 400):  # one statement per 400 (key, step) pairs, not one per row
        conn.execute(delete(db.media).where(m.run_id == run_id, tuple_(m.key, m.step).in_(pairs[i : i + 400])))
    if rows:
        conn.execute(db.media.insert(), rows)
    if upserted:
        _upsert_statement(conn.dialect.name).run_many(conn, upserted)


UPSERT_DIALECTS = ("sqlite", "postgresql")
COLUMNS = ["run_id", "key", "kind", "step", "idx", "wall", "meta", "body", "nbytes"]


@functools.lru_cache(maxsize=4)
def _upsert_statement(dialect: str) -> Prepared:
    """INSERT ... ON CONFLICT (run_id, key, step, idx) DO UPDATE, built once per dialect."""
    stmt = (postgresql if dialect == "postgresql" else sqlite).insert(db.media)
    m, new = db.media.c, stmt.excluded
    stmt = stmt.on_conflict_do_update(
        index_elements=[m.run_id, m.key, m.step, m.idx],
        set_={c: new[c] for c in ("kind", "wall", "meta", "body", "nbytes")},
    )
    return Prepared(stmt, COLUMNS)


def run_bytes(conn, run_id: int) -> int:
    """Bytes of media a run holds (for its cap)."""
    return int(
        conn.execute(select(func.coalesce(func.sum(db.media.c.nbytes), 0)).where(db.media.c.run_id == run_id)).scalar()
    )


def delete_run(conn, run_id: int) -> None:
    """Remove a run's media (``runs rm``, retention)."""
    conn.execute(delete(db.media).where(db.media.c.run_id == run_id))


def list_media(conn, run_id: int) -> list[dict]:
    """Every media key of a run: kind, how many steps, the first and last step."""
    require_run(conn, run_id)
    m = db.media.c
    rows = conn.execute(
        select(m.key, m.kind, func.count(func.distinct(m.step)), func.min(m.step), func.max(m.step))
        .where(m.run_id == run_id)
        .group_by(m.key, m.kind)
        .order_by(m.key)
    )
    return [{"key": k, "kind": kind, "steps": n, "first_step": lo, "last_step": hi} for k, kind, n, lo, hi in rows]


def steps_of(conn, run_id: int, key: str) -> list[int]:
    """The steps a media key was logged at, in order."""
    m = db.media.c
    return list(
        conn.execute(select(m.step).where(m.run_id == run_id, m.key == key).distinct().order_by(m.step)).scalars()
    )


def histograms(
    conn, run_id: int, key: str, max_steps: int = 400, start: int | None = None, end: int | None = None
) -> dict:
    """A histogram key over steps: {"key", "steps": [...], "histograms": [{step, lo, hi | edges, counts, nan, inf, ninf}]}."""
    require_run(conn, run_id)
    m = db.media.c
    where = [m.run_id == run_id, m.key == key, m.kind == "histogram"]
    if start is not None:
        where.append(m.step >= start)
    if end is not None:
        where.append(m.step <= end)
    steps = list(conn.execute(select(m.step).where(*where).order_by(m.step)).scalars())
    total = len(steps)
    if total > max_steps:  # evenly thinned, always keeping the first and the last
        picks = np.unique(np.linspace(0, total - 1, max_steps).round().astype(int))
        steps = [steps[i] for i in picks]
    out = []
    for start_i in range(0, len(steps), 500):
        part = steps[start_i : start_i + 500]
        rows = conn.execute(select(m.step, m.meta, m.body).where(*where, m.step.in_(part)).order_by(m.step))
        for step, meta, body in rows:
            out.append({"step": step, **json.loads(meta), "counts": np.frombuffer(body, dtype="<i8").tolist()})
    return {"key": key, "total_steps": total, "histograms": out}


def images(conn, run_id: int, key: str, step: int | None = None) -> dict:
    """The images of a key at ``step`` (default the last): {"key", "step", "steps", "images": [{id, width, height, caption}]}."""
    require_run(conn, run_id)
    steps = steps_of(conn, run_id, key)
    if not steps:
        raise NotFound(f"no images {key!r} in run {run_id}")
    step = _nearest(steps, step)
    m = db.media.c
    rows = conn.execute(
        select(m.id, m.idx, m.meta)
        .where(m.run_id == run_id, m.key == key, m.step == step, m.kind == "image")
        .order_by(m.idx)
    )
    return {
        "key": key,
        "step": step,
        "steps": steps,
        "images": [{"id": i, "index": idx, **json.loads(meta)} for i, idx, meta in rows],
    }


def image_png(conn, run_id: int, media_id: int) -> bytes:
    """One image's PNG bytes (only if it belongs to ``run_id``: the run's access rules cover it)."""
    m = db.media.c
    body = conn.execute(select(m.body).where(m.id == media_id, m.run_id == run_id, m.kind == "image")).scalar()
    if body is None:
        raise NotFound(f"image {media_id} not found in run {run_id}")
    return bytes(body)


def table(conn, run_id: int, key: str, step: int | None = None) -> dict:
    """A table or text key at ``step`` (default the last): {"key", "kind", "step", "steps", "columns", "rows"} or "text"."""
    require_run(conn, run_id)
    steps = steps_of(conn, run_id, key)
    if not steps:
        raise NotFound(f"no table or text {key!r} in run {run_id}")
    step = _nearest(steps, step)
    m = db.media.c
    row = conn.execute(
        select(m.kind, m.body).where(m.run_id == run_id, m.key == key, m.step == step, m.kind.in_(("table", "text")))
    ).first()
    if row is None:
        raise NotFound(f"{key!r} in run {run_id} is not a table or a text")
    return {"key": key, "kind": row.kind, "step": step, "steps": steps, **json.loads(bytes(row.body).decode("utf-8"))}


def _nearest(steps: list[int], step: int | None) -> int:
    """The logged step at or before ``step`` (the first one when none is before; the last when None)."""
    if step is None:
        return steps[-1]
    before = [s for s in steps if s <= step]
    return before[-1] if before else steps[0]
