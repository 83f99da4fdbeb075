"""``gradwatch db compact``: old (raw) chunk and rollup blocks rewritten compressed, online, resumably.

Safe beside a running server because every change keeps what the server's writer may hold in memory
true (ingest/pipeline.py caches each live key's small rows by id, with their points):

- a raw block is re-encoded *in place* (same row, same points; a rollup row only if its blob is
  still the one read: compare-and-swap, so a block the writer rewrote meanwhile is left to it);
- a key's small rows are merged into its oldest one (that row now holds all their points, the
  others are deleted): a writer that later merges them deletes all those ids and writes the points
  it holds, the same points, so nothing is lost or doubled.

Each key is one short transaction that takes the write lock first (SQLite ``BEGIN IMMEDIATE``;
PostgreSQL ``FOR UPDATE``), so the server's batches wait milliseconds, not the whole run. Only raw
blocks and unmerged small rows are selected, so a compaction stopped halfway resumes where it
stopped. At the end the file gives its free pages back (SQLite: ``incremental_vacuum``, after one
``VACUUM`` that switches the file to incremental auto-vacuum; PostgreSQL: ``VACUUM``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import bindparam, delete, event, func, select, text, tuple_, update

from gradwatch import contract
from gradwatch_server.storage import chunks, db
from gradwatch_server.storage.blocks import arrays, clock, codec, rechunk, slim


@dataclass
class Done:
    """What a compaction did."""

    keys: int = 0
    chunks: int = 0  # raw chunk rows re-encoded
    merged: int = 0  # small rows merged into another
    rollups: int = 0  # raw rollup and heat rows re-encoded
    clocked: int = 0  # chunk rows rewritten to leave their wall times to the run clock
    rechunked: int = 0  # old 16-step full chunks of wide vectors merged into 64-step ones (rechunk.py)
    slimmed: int = 0  # full summaries of ended runs' vector keys rewritten lean (slim.py)
    dropped: int = 0  # rollup rows of levels no longer read (0.2's 64-step blocks of scalar keys)
    cursor: dict = field(default_factory=dict)  # (table, key id) -> the last (level, block) looked at
    bytes_before: int = 0
    bytes_after: int = 0  # of the rows it touched


def open_engine(url: str):
    """An engine whose transactions take the write lock at BEGIN (SQLite), so reads and writes of a key are one step."""
    from gradwatch_server.storage import database

    engine = database.connect(url)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _manual(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # pysqlite's own BEGIN would be deferred

        @event.listens_for(engine, "begin")
        def _immediate(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def keys_of(conn, run_id: int | None = None) -> list[tuple[int, int]]:
    """(key id, slots) of every key, or of one run's."""
    k = db.metric_keys.c
    query = select(k.id, k.layers).order_by(k.run_id, k.id)
    if run_id is not None:
        query = query.where(k.run_id == run_id)
    return [(key_id, len(json.loads(layers)) if layers else 1) for key_id, layers in conn.execute(query)]


SLICE = 128  # rows per transaction: the server's writer waits at most one slice


def compact_slice(conn, key_id: int, done: Done) -> bool:
    """Up to SLICE raw chunk rows of a key re-encoded in place; True when it has none left."""
    c = db.chunks.c
    query = (
        select(c.id, c.first_step, c.last_step, c.n, c.steps, c.walls, c.data, c.missing)
        .where(c.key_id == key_id, func.length(c.data) % 8 != 5)
        .order_by(c.id)
        .limit(SLICE)
    )
    rows = conn.execute(_locked(conn, query)).all()
    for row in rows:
        points = chunks.decode_row(conn, key_id, row)
        if points is not None:  # a damaged row is left as it is (readers report it)
            _rewrite(conn, key_id, row, points, done)
    return len(rows) < SLICE


def merge_small(conn, key_id: int, slots: int, done: Done) -> None:
    """A key's small rows (not yet a full chunk) merged into its oldest one, compressed."""
    c = db.chunks.c
    query = (
        select(c.id, c.first_step, c.last_step, c.n, c.steps, c.walls, c.data, c.missing)
        .where(c.key_id == key_id, chunks.small_rows(slots))
        .order_by(c.id)
    )
    rows = conn.execute(_locked(conn, query)).all()
    parts = [chunks.decode_row(conn, key_id, r) for r in rows]
    keep = [(r, p) for r, p in zip(rows, parts) if p is not None and p.values.shape[1] == slots]
    if len(keep) > 1:
        merged = chunks.concat([p for _r, p in keep])
        small = len(merged) < chunks.capacity(slots)  # marked, so no pre-0009 full-chunk size is taken for it
        _rewrite(conn, key_id, keep[0][0], merged, done, [r for r, _p in keep[1:]], small)


def compact_rollups(conn, key_id: int, slots: int, done: Done) -> bool:
    """Up to SLICE raw rollup and heat rows of a key re-encoded in place; True when it has none left."""
    from gradwatch_server.storage import rollup

    left = False
    for table, rows_of in ((db.rollups, rollup.ROWS), (db.rollup_heat, None)):
        t = table.c
        raw = func.length(t.data) % 8 != 5
        if rows_of is None:  # a 0.2 heat row is 9 bytes a slot: 5 modulo 8 when the slots are
            raw = raw | (func.length(t.data) == 9 * slots)
        query = select(t.level, t.block, t.data).where(t.key_id == key_id, raw)
        after = done.cursor.get((table.name, key_id))  # pages by (level, block): a page of look-alikes ends too
        if after is not None:
            query = query.where(tuple_(t.level, t.block) > tuple_(*after))
        rows = conn.execute(query.order_by(t.level, t.block).limit(SLICE)).all()
        if rows:
            done.cursor[(table.name, key_id)] = (rows[-1].level, rows[-1].block)
        left = left or len(rows) == SLICE
        if rows_of is None:
            rows = [r for r in rows if not codec.is_encoded(r.data) or rollup.heat_is_raw(r.data, slots)]
        params = []
        for row in rows:
            blob = _reencode(row.data, rows_of)
            if blob is not None:
                params.append({"k": key_id, "lv": row.level, "b": row.block, "old": row.data, "new": blob})
                done.bytes_before += len(row.data)
                done.bytes_after += len(blob)
        if params:  # each only if its blob is still the one read (the writer may have rewritten it)
            same = (t.key_id == bindparam("k"), t.level == bindparam("lv"), t.block == bindparam("b"))
            conn.execute(update(table).where(*same, t.data == bindparam("old")).values(data=bindparam("new")), params)
        done.rollups += len(params)
    return not left


def drop_unread_levels(conn, key_id: int, slots: int, done: Done) -> None:
    """Rollup rows of levels this release no longer reads for the key (``rollup.all_levels``)."""
    from gradwatch_server.storage import rollup

    kept = rollup.all_levels(slots)
    for table in (db.rollups, db.rollup_heat):
        t = table.c
        gone = conn.execute(delete(table).where(t.key_id == key_id, t.level.not_in(kept))).rowcount
        done.dropped += gone if table is db.rollups else 0


def _locked(conn, query):
    """On PostgreSQL the rows read are locked until commit (SQLite: the whole write lock, at BEGIN)."""
    return query.with_for_update() if conn.dialect.name == "postgresql" else query


def _rewrite(conn, key_id: int, row, points, done: Done, gone=(), small: bool | None = None) -> None:
    """Row ``row`` now holds ``points`` compressed; the rows ``gone`` (merged into it) are deleted;
    ``small`` sets its mark (``chunks.small_rows``), None keeps it."""
    new = chunks.packed_row(key_id, points, small=bool(small))
    c = db.chunks.c
    names = ("first_step", "last_step", "n", "steps", "walls", "data", "missing") + (
        () if small is None else ("small",)
    )
    values = {name: new[name] for name in names}
    conn.execute(update(db.chunks).where(c.id == row.id).values(**values))
    if gone:
        conn.execute(db.chunks.delete().where(c.id.in_([r.id for r in gone])))
    done.bytes_before += sum(_size(r) for r in (row, *gone))
    done.bytes_after += len(new["data"])
    done.chunks += 1
    done.merged += len(gone)


def _size(row) -> int:
    return len(row.steps) + len(row.walls) + len(row.data) + len(row.missing or b"")


def _reencode(blob: bytes, rows: int | None) -> bytes | None:
    """A raw rollup (``rows`` float64 rows) or heat blob (float64 maxima, then flag bytes) encoded."""
    if rows is not None:
        if len(blob) % (8 * rows):
            return None
        return arrays.encode_array(np.frombuffer(blob, "<f8").reshape(rows, -1))
    if len(blob) % 9:
        return None
    slots = len(blob) // 9
    maxima = np.frombuffer(blob[: 8 * slots], "<f8")
    flags = np.frombuffer(blob[8 * slots :], np.uint8).astype(np.float64)
    return arrays.encode_array(np.stack([maxima, flags]))


def compact(url: str, run_id: int | None = None, progress=None, say=print, vacuum: bool = True) -> Done:
    """Compact every key (or one run's), key by key in short transactions, then (``vacuum``) give the space back.

    ``progress(done_rows, total_rows)`` is called after each slice.
    """
    engine = open_engine(url)
    done = Done()
    try:
        with engine.connect() as conn:
            keys = keys_of(conn, run_id)
            total = raw_left(conn, run_id)
        before = done.chunks
        for key_id, slots in keys:
            finished = False
            while not finished:
                with engine.begin() as conn:
                    finished = compact_slice(conn, key_id, done)
                    finished = compact_rollups(conn, key_id, slots, done) and finished
                if progress is not None:
                    progress(done.chunks - before, total)
            with engine.begin() as conn:
                merge_small(conn, key_id, slots, done)
                drop_unread_levels(conn, key_id, slots, done)
            done.keys += 1
        for run in runs_without_clock(engine, run_id):
            clock_run(engine, run, done)
            slim.slim_run(engine, run, keys_of_run(engine, run), done)  # against the clock just built
        for key_id, slots in keys:  # after the clock: merged chunks keep walls left to it
            rechunk.rechunk_key(engine, key_id, slots, done)
        if vacuum:
            give_back_space(engine, say)
    finally:
        engine.dispose()
    return done


def runs_without_clock(engine, run_id: int | None = None) -> list[int]:
    """Ended runs (or the one asked for, if ended) whose chunks may still carry their own wall times."""
    r = db.runs.c
    query = select(r.id).where(r.status.in_(sorted(contract.ENDED_STATUSES))).order_by(r.id)
    if run_id is not None:
        query = query.where(r.id == run_id)
    with engine.connect() as conn:
        return [row.id for row in conn.execute(query)]


def clock_run(engine, run_id: int, done: Done) -> None:
    """An ended run's clock built from its chunks (if it has none), then every chunk whose walls are
    all the clock's rewritten without them, SLICE rows per transaction (resumable: a pass skips those done).
    A run still active is left alone: its writer appends to its clock and must be the only one."""
    keys = [key_id for key_id, _slots in keys_of_run(engine, run_id)]
    with engine.begin() as conn:
        ended = select(db.runs.c.status).where(db.runs.c.id == run_id)
        if conn.execute(_locked(conn, ended)).scalar() not in contract.ENDED_STATUSES:
            return
        if not conn.execute(select(func.count()).where(db.run_clock.c.run_id == run_id)).scalar():
            points = [p for key_id in keys for p in _key_points(conn, key_id)]
            clock.build(conn, run_id, points)
    stored = None
    for key_id in keys:
        after = -1
        while after is not None:
            with engine.begin() as conn:
                if stored is None:
                    stored = clock.Clock.whole(conn, run_id)
                after = _clock_slice(conn, key_id, after, stored, done)


def keys_of_run(engine, run_id: int) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        return keys_of(conn, run_id)


def _key_points(conn, key_id: int) -> list:
    c = db.chunks.c
    rows = conn.execute(
        select(c.id, c.first_step, c.last_step, c.n, c.steps, c.walls, c.data, c.missing).where(c.key_id == key_id)
    )
    return [p for p in (chunks.decode_row(conn, key_id, r) for r in rows) if p is not None]


def _clock_slice(conn, key_id: int, after: int, run_clock, done: Done) -> int | None:
    """Up to SLICE chunk rows of a key after id ``after`` rewritten against the clock; the last id, or None at the end."""
    c = db.chunks.c
    query = (
        select(c.id, c.first_step, c.last_step, c.n, c.steps, c.walls, c.data, c.missing)
        .where(c.key_id == key_id, c.id > after)
        .order_by(c.id)
        .limit(SLICE)
    )
    rows = conn.execute(_locked(conn, query)).all()
    for row in rows:
        if codec.is_encoded(row.data) and codec.leaves_walls(row.data):
            continue
        points = chunks.decode_row(conn, key_id, row)
        if points is not None and run_clock.omits(conn, points.steps, points.walls):
            new = chunks.packed_row(key_id, points, functools.partial(run_clock.omits, conn))
            conn.execute(
                update(db.chunks).where(c.id == row.id).values(steps=b"", walls=b"", data=new["data"], missing=None)
            )
            done.bytes_before += _size(row)
            done.bytes_after += len(new["data"])
            done.clocked += 1
    return rows[-1].id if len(rows) == SLICE else None


def raw_left(conn, run_id: int | None = None) -> int:
    """Raw chunk rows still to compact (optionally of one run)."""
    c, k = db.chunks.c, db.metric_keys.c
    query = select(func.count()).select_from(db.chunks).where(func.length(c.data) % 8 != 5)
    if run_id is not None:
        query = query.where(c.key_id.in_(select(k.id).where(k.run_id == run_id)))
    return conn.execute(query).scalar()


def give_back_space(engine, say=print) -> None:
    """Return free pages to the file system, in short steps where the engine allows it."""
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in ("chunks", "rollups", "rollup_heat"):
                conn.execute(text(f"VACUUM (ANALYZE) {table}"))
        say("gradwatch: VACUUM done: the space is reusable by PostgreSQL; `VACUUM FULL` returns it to the disk")
        return
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if cur.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            say("gradwatch: switching the file to incremental auto-vacuum (one VACUUM; writes wait until it ends)")
            cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
            cur.execute("VACUUM")
        while cur.execute("PRAGMA freelist_count").fetchone()[0]:
            cur.execute("PRAGMA incremental_vacuum(2048)")  # 8 MiB of pages a step: writers wait briefly
            cur.fetchall()
        cur.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # the file shrinks when the WAL is checkpointed
    finally:
        raw.close()
