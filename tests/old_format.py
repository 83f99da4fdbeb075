"""A database as the previous release (0.2, revision 0002) stored it: every block a raw array.

The 0.2 format is the one ``storage/chunks.py`` still reads: steps int64, wall times and values
float64 little-endian, a uint8 mask of missing slots (NULL when none); a rollup 12 float64 rows; a
heat row float64 maxima then a flags byte a slot. Tests of upgrades (test_compact.py) and the
storage benchmark's "before" column build it from a database written now.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from gradwatch_server.storage import chunks, database, rollup
from gradwatch_server.storage.blocks import codec


def as_release_0_2(path: Path) -> int:
    """Every block rewritten as the previous release stored it (raw little-endian arrays), revision 0002,
    with the 64-step rollup blocks 0.2 also kept for scalar keys; returns how many of those it added."""
    added = _scalar_blocks_of_64(path)
    con = sqlite3.connect(path)
    for row_id, data in con.execute("SELECT id, data FROM chunks").fetchall():
        if codec.is_encoded(data):
            steps, walls, values, missing = codec.decode_chunk(data)
            raw_missing = None if missing is None else np.ascontiguousarray(missing).astype(np.uint8).tobytes()
            con.execute(
                "UPDATE chunks SET steps = ?, walls = ?, data = ?, missing = ? WHERE id = ?",
                (
                    steps.astype("<i8").tobytes(),
                    walls.tobytes(),
                    np.ascontiguousarray(values).tobytes(),
                    raw_missing,
                    row_id,
                ),
            )
    for table in ("rollups", "rollup_heat"):
        for key_id, level, block, data in con.execute(f"SELECT key_id, level, block, data FROM {table}").fetchall():
            if codec.is_encoded(data):
                array = codec.decode_array(data)
                raw = (
                    array.tobytes() if table == "rollups" else array[0].tobytes() + array[1].astype(np.uint8).tobytes()
                )
                con.execute(
                    f"UPDATE {table} SET data = ? WHERE key_id = ? AND level = ? AND block = ?",
                    (raw, key_id, level, block),
                )
    con.execute("UPDATE alembic_version SET version_num = '0002'")
    con.commit()
    con.execute("VACUUM")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return added


def _scalar_blocks_of_64(path: Path) -> int:
    """The 64-step summaries of every scalar key, from its points (as 0.2's writer made them)."""
    engine = database.make_engine(f"sqlite:///{path}")
    rows = []
    with engine.begin() as conn:
        for (key_id,) in conn.exec_driver_sql("SELECT id FROM metric_keys WHERE layers IS NULL").all():
            p = chunks.read(conn, key_id, slots=1)
            if len(p):
                blocks, counts, data = rollup.summarise(
                    p.steps.astype(np.float64), p.walls, p.values, p.present(), p.steps // 64
                )
                rows += [(key_id, int(b), int(n), d.tobytes()) for b, n, d in zip(blocks, counts, data)]
        if rows:
            conn.exec_driver_sql("INSERT INTO rollups (key_id, level, block, n, data) VALUES (?, 64, ?, ?, ?)", rows)
    engine.dispose()
    return len(rows)


def disk_size(path: Path) -> int:
    """The database on disk: the file and its write-ahead log."""
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
