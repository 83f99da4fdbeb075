"""``gradwatch db compact``: an ended run's full vector summaries (before revision 0010) rewritten lean.

A summary is rewritten lean (rollup.LEAN_ROWS) only where every wall time in it is the run clock's at its
step, as the writer decides it, and its heat row is written with it (one from before heat rows had none).
Only ended runs: their clocks are whole and no writer touches their rows. Each row is swapped only if its
blob is still the one read, and only lean rows are skipped, so a compaction stopped halfway resumes.
"""

from __future__ import annotations

import functools

from sqlalchemy import bindparam, select, tuple_, update

from gradwatch_server.storage import db, rollup
from gradwatch_server.storage.blocks import clock
from gradwatch_server.storage.blocks.rollup_rows import is_lean
from gradwatch_server.storage.rollup_writes import upsert_heat

SLICE = 128  # rows per transaction


def slim_run(engine, run_id: int, keys: list[tuple[int, int]], done) -> None:
    """Every full summary of the run's vector keys (``keys``: (key id, slots)) rewritten lean where it can be."""
    run_clock = None
    for key_id, slots in keys:
        if slots < 2:
            continue
        after = (-1, -1)
        while after is not None:
            with engine.begin() as conn:
                run_clock = run_clock or clock.Clock.whole(conn, run_id)
                after = _slice(conn, key_id, slots, after, run_clock, done)


def _slice(conn, key_id: int, slots: int, after: tuple, run_clock, done) -> tuple | None:
    """Up to SLICE rollup rows of a key after (level, block) ``after`` made lean; the last one read, or None at the end."""
    r = db.rollups.c
    query = select(r.level, r.block, r.data).where(r.key_id == key_id, tuple_(r.level, r.block) > tuple_(*after))
    query = query.order_by(r.level, r.block).limit(SLICE)
    rows = conn.execute(query.with_for_update() if conn.dialect.name == "postgresql" else query).all()
    omits = functools.partial(run_clock.omits, conn)
    for row in rows:
        whole = None if is_lean(row.data) else rollup.decode(row.data, slots)
        if whole is None or not rollup.lean_walls([whole], omits)[0]:
            continue  # lean already, damaged, of another layout, or its walls are not all the clock's
        blob = rollup.encode_lean(whole)
        swapped = conn.execute(_SWAP, {"k": key_id, "lv": row.level, "b": row.block, "old": row.data, "new": blob})
        if swapped.rowcount == 1:
            upsert_heat(
                conn, [{"key_id": key_id, "level": row.level, "block": row.block, "data": rollup.heat_of(whole)}]
            )
            done.slimmed += 1
            done.bytes_before += len(row.data)
            done.bytes_after += len(blob)
    return (rows[-1].level, rows[-1].block) if len(rows) == SLICE else None


_r = db.rollups.c
_SWAP = (
    update(db.rollups)
    .where(_r.key_id == bindparam("k"), _r.level == bindparam("lv"), _r.block == bindparam("b"))
    .where(_r.data == bindparam("old"))
    .values(data=bindparam("new"))
)
