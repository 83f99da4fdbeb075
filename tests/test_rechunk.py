"""Upgrades to 64-step chunks of wide vectors (revision 0009): a file written before it keeps working (its
16-step full chunks are never taken for small rows), and `gradwatch db compact` merges them into 64-step
chunks beside a server that keeps ingesting, every read identical and the file smaller."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from compact_live import compact_while_streaming
from old_format import before_0009, disk_size
from server_process import ServerProcess, get_json
from test_ingest_ws import _columns_batch

from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import chunks, database, store
from gradwatch_server.storage.blocks import compact

LAYERS = [f"l{i}" for i in range(300)]
NAN_PAYLOAD = np.frombuffer(np.uint64(0x7FF8_0000_0000_1234).tobytes(), "<f8")[0]


def _vector(i: int, rng) -> list:
    """A step of float32-born norms with a missing layer, NaN (with a payload), +inf and -inf now and then."""
    row = (np.exp(rng.normal(-2, 1, len(LAYERS))) * (1 + rng.normal(0, 0.1, len(LAYERS)))).astype(np.float32)
    out: list = row.astype(np.float64).tolist()
    out[i % len(LAYERS)] = None
    if i % 37 == 5:
        out[3], out[4], out[5] = NAN_PAYLOAD, math.inf, -math.inf
    return out


def _ingest(engine, run_id: int, steps: range, rng, seq: int, per_batch: int) -> int:
    """Steps through the real ingest in batches of ``per_batch`` (1: live-shaped); the last seq used."""
    state = None
    with engine.begin() as conn:
        state = load_state(conn, run_id)
    for lo in range(steps.start, steps.stop, per_batch):
        records = [
            (i, 1.76e9 + 0.1 * i, {"loss": float(np.float32(1 / (1 + i)))}, {"grad": _vector(i, rng)})
            for i in range(lo, min(lo + per_batch, steps.stop))
        ]
        seq += 1
        with engine.begin() as conn:
            apply_batch(conn, state, decode(_columns_batch(seq, records, layouts={"grad": LAYERS})))
    return seq


def _build(path: Path | str, steps: int = 700, tail: int = 9) -> int:
    """A 300-layer run (a SQLite file or a URL): bulk batches, then ``tail`` live steps that stay small rows;
    the last seq."""
    engine = database.make_engine(f"sqlite:///{path}" if isinstance(path, Path) else path)
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "old", "project": "p", "name": "before 0009"}, {})["run_id"]
    rng = np.random.default_rng(1)
    seq = _ingest(engine, run_id, range(steps), rng, 0, 200)
    seq = _ingest(engine, run_id, range(steps, steps + tail), rng, seq, 1)
    engine.dispose()
    return seq


def _reads(conn, run_id: int) -> dict:
    """Every point of the vector, bit for bit, and what a page shows of it."""
    key_id = conn.exec_driver_sql("SELECT id FROM metric_keys WHERE key = 'grad'").scalar()
    p = chunks.read(conn, key_id)
    out = {"bits": (p.steps.tobytes(), p.walls.tobytes(), p.values.tobytes(), p.present().tobytes())}
    out["layer"] = store.get_series(conn, run_id, "grad/l4")
    out["heatmap"] = store.get_heatmap(conn, run_id, "grad", max_steps=50)
    out["zoom"] = store.get_heatmap(conn, run_id, "grad", max_steps=50, start=100, end=300)
    return out


def _sizes(path: Path) -> dict[int, int]:
    """Chunk row id -> steps it holds, of the vector."""
    con = sqlite3.connect(path)
    grad = "(SELECT id FROM metric_keys WHERE key = 'grad' AND run_id = 1)"
    sizes = dict(con.execute(f"SELECT id, n FROM chunks WHERE key_id = {grad} ORDER BY id").fetchall())
    con.close()
    return sizes


def test_old_full_chunks_are_never_taken_for_small_rows(tmp_path):
    path = tmp_path / "gw.db"
    seq = _build(path)
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        before = _reads(conn, 1)
    engine.dispose()
    before_0009(path)
    old = _sizes(path)
    full = {i for i, n in old.items() if n == 16}
    assert len(full) >= 700 // 16 and max(old.values()) == 16  # the old full chunks, and small rows
    engine = database.make_engine(f"sqlite:///{path}")  # upgrades 0008 -> 0009
    with engine.connect() as conn:
        assert _reads(conn, 1) == before
        key_id = conn.exec_driver_sql("SELECT id FROM metric_keys WHERE key = 'grad'").scalar()
        tail = chunks.load_tail(conn, key_id, len(LAYERS))
    assert tail.n == sum(n for n in old.values() if n < 16) > 0  # only the rows the old writer left small
    _ingest(engine, 1, range(709, 709 + 64), np.random.default_rng(2), seq, 1)  # live steps after the upgrade
    engine.dispose()
    new = _sizes(path)
    assert all(new.get(i) == 16 for i in full)  # old full chunks left as they were, not merged again
    assert 64 in new.values() and sum(new.values()) == 709 + 64


# The live run's own blobs (run 2): what the file grew by while it was compacted, at least.
LIVE_BYTES = " + ".join(
    f"(SELECT coalesce(sum(length(data)), 0) FROM {t} WHERE key_id IN (SELECT id FROM metric_keys WHERE run_id = 2))"
    for t in ("chunks", "rollups", "rollup_heat")
).join(("SELECT ", " + (SELECT coalesce(sum(length(data)), 0) FROM run_clock WHERE run_id = 2)"))


def test_compaction_merges_old_chunks_beside_a_live_server(tmp_path):
    path = tmp_path / "gw.db"
    _build(path, steps=1600)
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        before = _reads(conn, 1)
    engine.dispose()
    before_0009(path)
    old_size, old_rows = disk_size(path), _sizes(path)
    server = ServerProcess(f"sqlite:///{path}")
    rng = np.random.default_rng(3)
    try:
        _out, sent, _during = compact_while_streaming(  # a live 300-layer run, one step a batch
            server,
            f"sqlite:///{path}",
            lambda step: ({}, {"grad": _vector(step, rng)}),
            layouts={"grad": LAYERS},
            warm_at=21,
            min_steps=100,
        )
        runs = get_json(server.url + "/api/runs")
        live = next(r for r in (runs["runs"] if isinstance(runs, dict) else runs) if r["name"] == "n")
        got = get_json(f"{server.url}/api/runs/{live['id']}/series?key=grad/l7")
        assert got["steps"] == sent  # every acked step once, in order
    finally:
        server.stop()
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert _reads(conn, 1) == before
        live_bytes = conn.exec_driver_sql(LIVE_BYTES).scalar()
    engine.dispose()
    sizes = _sizes(path)
    assert max(sizes.values()) == 64 and len(sizes) < len(old_rows) / 3  # the old run's 16-step chunks merged
    assert disk_size(path) - live_bytes < old_size, (disk_size(path), live_bytes, old_size)
    again = compact.compact(f"sqlite:///{path}", say=lambda _line: None)  # resumable: nothing left to merge
    assert again.rechunked == 0


@pytest.mark.slow
def test_postgres_old_chunks_compact_the_same_way(postgres_url):
    from pg_cluster import fresh_database

    url = fresh_database(postgres_url)
    _build(url, steps=900)
    engine = database.make_engine(url)
    with engine.begin() as conn:
        before = _reads(conn, 1)
        conn.exec_driver_sql("UPDATE runs SET status = 'finished'")
    engine.dispose()
    before_0009(url)
    engine = database.make_engine(url)
    with engine.connect() as conn:
        assert _reads(conn, 1) == before
    engine.dispose()
    done = compact.compact(url, say=lambda _line: None)
    assert done.rechunked > 0
    engine = database.make_engine(url)
    with engine.connect() as conn:
        assert _reads(conn, 1) == before
        grad = "SELECT id FROM metric_keys WHERE key = 'grad'"
        sizes = [n for (n,) in conn.exec_driver_sql(f"SELECT n FROM chunks WHERE key_id = ({grad})")]
    engine.dispose()
    assert 64 in sizes and sum(sizes) == 909


def test_compaction_across_a_layout_change_merges_each_width_apart(tmp_path):
    """A model that gained layers mid-run: rows of the old width and the new lie next to each other."""
    path = tmp_path / "gw.db"
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "u", "project": "p", "name": "grew"}, {})["run_id"]
        state = load_state(conn, run_id)
    rng = np.random.default_rng(7)
    for seq, (lo, width) in enumerate(((0, 200), (40, 200), (80, 300), (180, 300)), start=1):
        names = LAYERS[:width]
        records = [
            (i, 1.76e9 + i, {}, {"grad": _vector(i, rng)[:width]})
            for i in range(lo, lo + (40 if width == 200 else 100))
        ]
        with engine.begin() as conn:
            apply_batch(conn, state, decode(_columns_batch(seq, records, layouts={"grad": names})))
    with engine.connect() as conn:
        before = _reads(conn, run_id)
    engine.dispose()
    before_0009(path)
    database.make_engine(f"sqlite:///{path}").dispose()  # upgraded first, as `gradwatch db compact` does
    done = compact.compact(f"sqlite:///{path}", say=lambda _line: None)
    assert done.rechunked > 0
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert _reads(conn, run_id) == before
    engine.dispose()
