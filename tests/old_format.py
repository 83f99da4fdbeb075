"""A database as the previous release (0.2, revision 0002) stored it: every block a raw array.

The 0.2 format is the one ``storage/chunks.py`` still reads: steps int64, wall times and values
float64 little-endian, a uint8 mask of missing slots (NULL when none); a rollup 12 float64 rows; a
heat row float64 maxima then a flags byte a slot. Tests of upgrades (test_compact.py) and the
storage benchmark's "0.2" column build it from a database written now (SQLite or PostgreSQL).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
from sqlalchemy import text

from gradwatch_server.storage import chunks, database, rollup
from gradwatch_server.storage.blocks import codec


def as_release_0_2(path_or_url) -> int:
    """Every block rewritten as 0.2 stored it, revision 0002, with the 64-step rollup blocks 0.2 also
    kept for scalar keys; returns how many of those it added. A Path is a SQLite file (vacuumed after)."""
    url = f"sqlite:///{path_or_url}" if isinstance(path_or_url, Path) else path_or_url
    engine = database.make_engine(url)
    with engine.begin() as conn:
        added = _scalar_blocks_of_64(conn)
        for row_id, data in conn.execute(text("SELECT id, data FROM chunks")).all():
            if codec.is_encoded(data):
                steps, walls, values, missing = codec.decode_chunk(data)
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
                    a = codec.decode_array(data)
                    raw = a.tobytes() if table == "rollups" else a[0].tobytes() + a[1].astype(np.uint8).tobytes()
                    conn.execute(
                        text(f"UPDATE {table} SET data = :d WHERE key_id = :k AND level = :lv AND block = :b"),
                        {"d": raw, "k": key_id, "lv": level, "b": block},
                    )
        conn.execute(text("UPDATE alembic_version SET version_num = '0002'"))
    engine.dispose()
    if isinstance(path_or_url, Path):
        con = sqlite3.connect(path_or_url)
        con.execute("VACUUM")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
    return added


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
