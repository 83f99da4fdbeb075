"""A database as the previous release (0.2, revision 0002) stored it: every block a raw array.

The 0.2 format is the one ``storage/chunks.py`` still reads: steps int64, wall times and values
float64 little-endian, a uint8 mask of missing slots (NULL when none); a rollup 12 float64 rows; a
heat row float64 maxima then a flags byte a slot (and before revision 0010 every summary whole, not lean).
Tests of upgrades (test_compact.py) and the storage benchmark's "0.2" column build it from a database
written now (SQLite or PostgreSQL).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
from sqlalchemy import text

from gradwatch_server.storage import chunks, database, rollup
from gradwatch_server.storage.blocks import arrays, clock, codec, rollup_rows


def as_release_0_2(path_or_url) -> int:
    """Every block rewritten as 0.2 stored it, revision 0002, with the 64-step rollup blocks 0.2 also
    kept for scalar keys; returns how many of those it added. A Path is a SQLite file (vacuumed after)."""
    url = f"sqlite:///{path_or_url}" if isinstance(path_or_url, Path) else path_or_url
    engine = database.make_engine(url)
    with engine.begin() as conn:
        full_summaries(conn)
        _as_16_step_chunks(conn)
        added = _scalar_blocks_of_64(conn)
        for row_id, key_id, data in conn.execute(text("SELECT id, key_id, data FROM chunks")).all():
            if codec.is_encoded(data):
                steps, walls, values, missing = codec.decode_chunk(data)
                if walls is None:  # left to the run clock, which 0.2 did not have
                    walls = clock.walls_of(conn, key_id, steps)
                raw = {
                    "s": steps.astype("<i8").tobytes(),
                    "w": walls.tobytes(),
                    "d": np.ascontiguousarray(values).tobytes(),
                    "m": None if missing is None else np.ascontiguousarray(missing).astype(np.uint8).tobytes(),
                    "id": row_id,
                }
                conn.execute(
                    text("UPDATE chunks SET steps = :s, walls = :w, data = :d, missing = :m WHERE id = :id"), raw
                )
        for table in ("rollups", "rollup_heat"):
            for key_id, level, block, data in conn.execute(
                text(f"SELECT key_id, level, block, data FROM {table}")
            ).all():
                if codec.is_encoded(data):
                    a = arrays.decode_array(data)
                    raw = a.tobytes() if table == "rollups" else a[0].tobytes() + a[1].astype(np.uint8).tobytes()
                    conn.execute(
                        text(f"UPDATE {table} SET data = :d WHERE key_id = :k AND level = :lv AND block = :b"),
                        {"d": raw, "k": key_id, "lv": level, "b": block},
                    )
        conn.execute(text("DROP TABLE run_clock"))
        conn.execute(text("UPDATE alembic_version SET version_num = '0002'"))
    engine.dispose()
    _vacuum(path_or_url)
    return added


def before_0009(path_or_url) -> None:
    """The database as releases before 0009 stored it (revision 0008): a wide vector's full chunks of 16
    steps, no ``small`` mark on any row (blocks stay as they are: compressed, clocked). A Path is vacuumed."""
    url = f"sqlite:///{path_or_url}" if isinstance(path_or_url, Path) else path_or_url
    engine = database.make_engine(url)
    with engine.begin() as conn:
        full_summaries(conn)
        _as_16_step_chunks(conn)
        conn.execute(text("UPDATE alembic_version SET version_num = '0008'"))
    engine.dispose()
    _vacuum(path_or_url)


def full_summaries(conn) -> int:
    """Every lean summary (revision 0010) rewritten whole, as releases before it stored every summary;
    returns how many. (Before the clock or the heat rows are taken away: a lean one is made whole from them.)"""
    rewritten = 0
    for key_id, level, block, data in conn.execute(text("SELECT key_id, level, block, data FROM rollups")).all():
        if rollup_rows.is_lean(data):
            whole = rollup_rows.summary_of(conn, key_id, level, block, data, codec.width_of(data))
            conn.execute(
                text("UPDATE rollups SET data = :d WHERE key_id = :k AND level = :lv AND block = :b"),
                {"d": rollup.encode(whole), "k": key_id, "lv": level, "b": block},
            )
            rewritten += 1
    return rewritten


def _as_16_step_chunks(conn) -> None:
    """Every chunk of a wide vector cut into rows of the old full size (the rest a small row, as the old
    writer left it), in the same id order; the ``small`` column dropped (0009 adds it back at upgrade)."""
    for key_id, layers in conn.execute(text("SELECT id, layers FROM metric_keys WHERE layers IS NOT NULL")).all():
        legacy = chunks.legacy_capacity(len(json.loads(layers)))
        if legacy == chunks.capacity(len(json.loads(layers))):
            continue
        cols = "id, first_step, last_step, n, steps, walls, data, missing"
        rows = conn.execute(text(f"SELECT {cols} FROM chunks WHERE key_id = :k ORDER BY id"), {"k": key_id}).all()
        conn.execute(text("DELETE FROM chunks WHERE key_id = :k"), {"k": key_id})
        for row in rows:
            for new in _pieces(conn, key_id, row, legacy):
                new.pop("small", None)
                names = ", ".join(new)
                conn.execute(text(f"INSERT INTO chunks ({names}) VALUES ({', '.join(':' + n for n in new)})"), new)
    conn.execute(text("ALTER TABLE chunks DROP COLUMN small"))


def _pieces(conn, key_id: int, row, legacy: int) -> list[dict]:
    """A chunk row as rows of at most ``legacy`` steps (itself, unchanged, if it has no more)."""
    if row.n < legacy:
        names = ("first_step", "last_step", "n", "steps", "walls", "data", "missing")
        return [{"key_id": key_id, **{k: getattr(row, k) for k in names}}]
    points = chunks.decode_row(conn, key_id, row)
    clocked = codec.is_encoded(row.data) and codec.leaves_walls(row.data)
    out = []
    for at in range(0, len(points), legacy):
        part = chunks.packed_row(key_id, points.take(slice(at, at + legacy)), (lambda _s, _w: clocked))
        out.append({**part, "key_id": key_id})
    return out


def _vacuum(path_or_url) -> None:
    if isinstance(path_or_url, Path):
        con = sqlite3.connect(path_or_url)
        con.execute("VACUUM")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()


def _scalar_blocks_of_64(conn) -> int:
    """The 64-step summaries of every scalar key, from its points (as 0.2's writer made them)."""
    rows = []
    for (key_id,) in conn.execute(text("SELECT id FROM metric_keys WHERE layers IS NULL")).all():
        p = chunks.read(conn, key_id, slots=1)
        if len(p):
            blocks, counts, data = rollup.summarise(
                p.steps.astype(np.float64), p.walls, p.values, p.present(), p.steps // 64
            )
            rows += [{"k": key_id, "b": int(b), "n": int(n), "d": d.tobytes()} for b, n, d in zip(blocks, counts, data)]
    if rows:
        conn.execute(text("INSERT INTO rollups (key_id, level, block, n, data) VALUES (:k, 64, :b, :n, :d)"), rows)
    return len(rows)


def disk_size(path: Path) -> int:
    """The database on disk: the file and its write-ahead log."""
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def without_clock(path: Path) -> None:
    """Every chunk and summary rewritten with its own wall times (as before the run clock), the clock rows
    deleted, vacuumed."""
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        full_summaries(conn)
        for row_id, key_id, data in conn.execute(text("SELECT id, key_id, data FROM chunks")).all():
            if codec.is_encoded(data) and codec.leaves_walls(data):
                steps, _walls, values, missing = codec.decode_chunk(data)
                blob = codec.encode_chunk(
                    steps, clock.walls_of(conn, key_id, steps), np.ascontiguousarray(values), missing
                )
                conn.execute(text("UPDATE chunks SET data = :d WHERE id = :id"), {"d": blob, "id": row_id})
        conn.execute(text("DELETE FROM run_clock"))
    engine.dispose()
    con = sqlite3.connect(path)
    con.execute("VACUUM")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
