"""Lean summaries (revision 0010): a vector's summary stored without its maxima (its heat row's) and its wall
times (the run clock's) reads exactly as the full summary of the same points, on every read path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from old_format import full_summaries
from sqlalchemy import delete, select, update

from gradwatch import protocol
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import chunks, database, db, rollup, store
from gradwatch_server.storage.blocks import compact, rollup_rows

SLOTS = 9


def _run(engine, seed: int, steps: int) -> int:
    """A 9-layer vector and a scalar through real ingest, in random batches: NaN, ±inf, layers without a value,
    and now and then a rewind that logs steps again at other wall times (their blocks keep their own walls)."""
    rng = np.random.default_rng(seed)
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": f"lean{seed}", "project": "p", "name": "n"}, {})["run_id"]
        state = load_state(conn, run_id)
    pool = [math.nan, math.inf, -math.inf, None]
    lo, seq = 0, 0
    while lo < steps:
        if rng.random() < 0.05:
            lo = max(0, lo - int(rng.integers(1, 40)))  # a rewind: these steps come again, later
        hi = min(steps, lo + int(rng.integers(1, 400)))
        records = []
        for i in range(lo, hi):
            vec = [float(v) for v in rng.normal(size=SLOTS) * 10.0 ** rng.integers(-3, 3)]
            for j in np.flatnonzero(rng.random(SLOTS) < 0.01).tolist():
                vec[j] = pool[int(rng.integers(0, 4))]
            scalars = {"loss": float(rng.normal())}
            vectors = {"grad": [protocol.encode_float(v) for v in vec]}
            records.append({"step": i, "t": 1e9 + i + seq * 1e-3, "scalars": scalars, "vectors": vectors})
        seq += 1
        layouts = {"grad": [f"l{j}" for j in range(SLOTS)]}
        with engine.begin() as conn:
            apply_batch(conn, state, decode({"type": "batch", "seq": seq, "records": records, "layouts": layouts}))
        lo = hi
    return run_id


def _every_read(conn, run_id: int, key_id: int, rng) -> list:
    """The answers of every read that uses summaries: envelopes of each layer, heatmaps, blocks whole or one slot."""
    ranges = [
        (None, None),
        (0, 5_999),
        *((int(a), int(a + rng.integers(50, 4_000))) for a in rng.integers(0, 5_000, 5)),
    ]
    out = []
    for start, end in ranges:
        for points in (8, 40, 400, 4_000):
            out += [store.get_series(conn, run_id, f"grad/l{j}", points, start, end) for j in range(SLOTS)]
            out.append(store.get_heatmap(conn, run_id, "grad", points, start, end))
    for level in rollup.levels_for(SLOTS):
        for slot in (None, 0, SLOTS - 1):
            blocks, counts, data = rollup_rows.read_blocks(conn, key_id, level, 0, 1 << 40, SLOTS, slot)
            out.append((blocks.tolist(), counts.tolist(), data.view(np.int64).tolist()))  # bit for bit
    return out


def _lean_count(conn) -> tuple[int, int]:
    blobs = conn.execute(select(db.rollups.c.data)).scalars().all()
    return sum(rollup_rows.is_lean(b) for b in blobs), len(blobs)


def _lean_reads_equal_whole_reads(engine, seed: int) -> None:
    run_id = _run(engine, seed, 6_000)
    with engine.begin() as conn:
        key_id = conn.execute(select(db.metric_keys.c.id).where(db.metric_keys.c.key == "grad")).scalar()
        lean, total = _lean_count(conn)
        assert 0 < lean < total  # mixed: the scalar's and the rewound blocks' summaries are whole
        lean_reads = _every_read(conn, run_id, key_id, np.random.default_rng(seed))
        assert full_summaries(conn) == lean
        assert _lean_count(conn)[0] == 0
        assert _every_read(conn, run_id, key_id, np.random.default_rng(seed)) == lean_reads


@pytest.mark.parametrize("seed", range(3))
def test_every_read_of_lean_summaries_equals_the_read_of_the_same_summaries_whole(tmp_path, seed):
    _lean_reads_equal_whole_reads(database.make_engine(f"sqlite:///{tmp_path / 'lean.db'}"), seed)


@pytest.mark.slow
def test_on_postgres_every_read_of_lean_summaries_equals_the_read_of_them_whole(postgres_url):
    from pg_cluster import fresh_database

    engine = database.make_engine(fresh_database(postgres_url))
    _lean_reads_equal_whole_reads(engine, 3)
    engine.dispose()


def test_a_spike_keeps_its_step_and_wall_time_through_a_lean_summary(tmp_path):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'spike.db'}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "spike", "project": "p", "name": "n"}, {})["run_id"]
        state = load_state(conn, run_id)
    records = [
        {"step": i, "t": 1e9 + 0.1 * i, "scalars": {}, "vectors": {"grad": [1.0 + (i == 4_321) * 1e6, 2.0, 3.0]}}
        for i in range(8_192)
    ]
    with engine.begin() as conn:
        apply_batch(conn, state, decode({"type": "batch", "seq": 1, "records": records}))
        assert _lean_count(conn)[0] > 0
        got = store.get_series(conn, run_id, "grad/param[0]", 200)
    at = got["steps"].index(4_321)
    assert got["values"][at] == 1e6 + 1.0 and got["wall_times"][at] == 1e9 + 0.1 * 4_321


def test_a_lean_block_without_its_heat_row_is_read_from_the_raw_points(tmp_path):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'noheat.db'}")
    run_id = _run(engine, 7, 3_000)
    with engine.begin() as conn:
        key_id = conn.execute(select(db.metric_keys.c.id).where(db.metric_keys.c.key == "grad")).scalar()
        r = db.rollups.c
        rows = conn.execute(select(r.block, r.data).where(r.key_id == key_id, r.level == 64)).all()
        block = next(row.block for row in rows if rollup_rows.is_lean(row.data))
        h = db.rollup_heat.c
        conn.execute(delete(db.rollup_heat).where(h.key_id == key_id, h.level == 64, h.block == block))
        assert rollup_rows.read_blocks(conn, key_id, 64, 0, 1 << 40, SLOTS, 0) == (None, None, None)
        got = store.get_series(conn, run_id, "grad/l0", 160)  # 40 buckets of 75 steps: level 64 would be read
        points = chunks.read(conn, key_id, slots=SLOTS)
    assert got["total_points"] == len(points)  # every point of the block, none of them lost


def test_compaction_makes_an_ended_runs_full_summaries_lean_and_every_read_stays_the_same(tmp_path):
    path = tmp_path / "old.db"
    engine = database.make_engine(f"sqlite:///{path}")
    run_id = _run(engine, 11, 4_000)
    with engine.begin() as conn:
        key_id = conn.execute(select(db.metric_keys.c.id).where(db.metric_keys.c.key == "grad")).scalar()
        conn.execute(update(db.runs).values(status="finished"))
        lean = full_summaries(conn)  # as releases before 0010 wrote them
        h = db.rollup_heat.c
        conn.execute(delete(db.rollup_heat).where(h.block % 3 == 0))  # and some from before heat rows
        before = _every_read(conn, run_id, key_id, np.random.default_rng(1))
    engine.dispose()
    done = compact.compact(f"sqlite:///{path}", say=lambda _line: None)
    assert done.slimmed >= lean > 0 and done.bytes_after < done.bytes_before
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert _lean_count(conn)[0] == done.slimmed
        assert _every_read(conn, run_id, key_id, np.random.default_rng(1)) == before
    assert compact.compact(f"sqlite:///{path}", say=lambda _line: None).slimmed == 0  # nothing left to do
    engine.dispose()
