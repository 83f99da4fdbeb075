"""``gradwatch db compact``: a wide vector's full chunks of 16 steps (before 0009) merged into 64-step ones.

Only full chunks are touched, never small rows: the server's writer caches a live key's small rows by
id, not its full chunks, so this is safe beside a running server, on live runs too. Only rows next to
each other in the key's id order are merged (into the first of them, the others deleted): readers keep
repeated steps in id order, and no other row of the key lies between them, so every read is the same.
A merged row holds a full chunk of this release and is not selected again: a compaction stopped
halfway resumes where it stopped.
"""

from __future__ import annotations

from sqlalchemy import and_, select, update

from gradwatch_server.storage import chunks, db
from gradwatch_server.storage.blocks import codec

GROUPS = 32  # merges per transaction: the server's writer waits at most that long


def rechunk_key(engine, key_id: int, slots: int, done) -> None:
    """Every run of a key's old full chunks merged, GROUPS merges per short transaction."""
    if chunks.capacity(slots) == chunks.legacy_capacity(slots):
        return  # this width's full chunks did not change size
    skip = -1  # groups before this id were looked at (a damaged row leaves its group as it is)
    while True:
        with engine.begin() as conn:
            groups = [g for g in _groups(conn, key_id, slots) if g[0] > skip][:GROUPS]
            for group in groups:
                _merge(conn, key_id, group, done)
        if len(groups) < GROUPS:
            return
        skip = groups[-1][-1]


def _groups(conn, key_id: int, slots: int) -> list[list[int]]:
    """Ids of runs of old full chunks, next to each other in id order, that together fit one new chunk."""
    c, cap, legacy = db.chunks.c, chunks.capacity(slots), chunks.legacy_capacity(slots)
    # n first: SQLite then reads ``small`` (after the blobs in an upgraded file) only for rows of that size.
    old = and_(c.n >= legacy, c.n < cap, c.small.is_(None))
    rows = conn.execute(select(c.id, c.n, old).where(c.key_id == key_id).order_by(c.id)).all()
    out, group, size = [], [], 0
    for row_id, n, is_old in rows:
        if group and (not is_old or size + n > cap):
            out.append(group)
            group, size = [], 0
        if is_old:
            group, size = group + [row_id], size + n
    out.append(group)
    return [g for g in out if len(g) > 1]


def _merge(conn, key_id: int, ids: list[int], done) -> None:
    """Rows ``ids`` as one compressed full chunk in the first of them; a damaged one leaves all as they are."""
    c = db.chunks.c
    query = select(c.id, c.first_step, c.last_step, c.n, c.steps, c.walls, c.data, c.missing)
    query = query.where(c.id.in_(ids)).order_by(c.id)
    rows = conn.execute(query.with_for_update() if conn.dialect.name == "postgresql" else query).all()
    parts = [chunks.decode_row(conn, key_id, r) for r in rows]
    if len(rows) != len(ids) or any(p is None or p.values.shape[1] != parts[0].values.shape[1] for p in parts):
        return  # damaged, or on both sides of a layout change (two widths): left as they are
    # Walls the run clock held stay left to it (what was read from it is what it holds).
    clocked = all(codec.is_encoded(r.data) and codec.leaves_walls(r.data) for r in rows)
    new = chunks.packed_row(key_id, chunks.concat(parts), (lambda _s, _w: True) if clocked else None, small=False)
    names = ("first_step", "last_step", "n", "steps", "walls", "data", "missing", "small")
    conn.execute(update(db.chunks).where(c.id == ids[0]).values(**{k: new[k] for k in names}))
    conn.execute(db.chunks.delete().where(c.id.in_(ids[1:])))
    done.bytes_before += sum(len(r.steps) + len(r.walls) + len(r.data) + len(r.missing or b"") for r in rows)
    done.bytes_after += len(new["data"])
    done.rechunked += len(rows)
