"""Upgrades: a database of raw (0.2-format) blocks keeps working, and `gradwatch db compact` rewrites it
compressed, online, beside a server that is ingesting, with every point read back identical."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from compact_live import compact_while_streaming
from old_format import as_release_0_2, disk_size
from server_process import ServerProcess, get_json
from test_ingest_ws import _columns_batch

from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import database, store
from gradwatch_server.storage.blocks import codec, compact, stats

LAYERS = [f"l{i}" for i in range(12)]


def _loss(i: int, rng) -> float:
    if i % 997 == 13:
        return [math.nan, math.inf, -math.inf][i % 3]
    return float(np.float32(2.0 / (1 + i * 1e-3) + rng.normal(0, 0.02)))


def _build(path: Path | str, steps: int = 9000, vector_steps: int = 1500) -> None:
    """A run through the real ingest: bulk batches, then a live-shaped tail of 1-step batches (a SQLite file or a URL)."""
    engine = database.make_engine(f"sqlite:///{path}" if isinstance(path, Path) else path)
    rng = np.random.default_rng(0)
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "old", "project": "p", "name": "before the upgrade"}, {})["run_id"]
        state = load_state(conn, run_id)
    norms = np.exp(rng.normal(0, 1, len(LAYERS)))
    seq = 0
    bounds = [*range(0, steps - 40, 2000), steps - 40, *range(steps - 39, steps + 1)]
    for lo, hi in zip(bounds, bounds[1:]):
        records = []
        for i in range(lo, hi):
            vec = {}
            if i < vector_steps:
                layer = (norms * (1 + rng.normal(0, 0.1, len(LAYERS)))).astype(np.float32).tolist()
                vec = {"grad": [None if (i + j) % 50 == 0 else v for j, v in enumerate(layer)]}
            scalars = {"loss": _loss(i, rng), "lr": 3e-4, "tokens": float(i * 4096)}
            records.append((i, 1.76e9 + i * 0.1 + rng.normal(0, 1e-3), scalars, vec))
        seq += 1
        with engine.begin() as conn:
            apply_batch(conn, state, decode(_columns_batch(seq, records, layouts={"grad": LAYERS})))
    engine.dispose()


def _reads(conn, run_id: int) -> dict:
    """Everything a page shows of the run: full series, envelopes, one layer, heatmaps."""
    out = {}
    for key in ("loss", "lr", "tokens", "grad/l3"):
        out[key] = store.get_series(conn, run_id, key)
        out[key + " envelope"] = store.get_series(conn, run_id, key, max_points=300)
        out[key + " zoom"] = store.get_series(conn, run_id, key, max_points=300, start=1000, end=5000)
    out["heatmap"] = store.get_heatmap(conn, run_id, "grad", max_steps=60)
    out["heatmap zoom"] = store.get_heatmap(conn, run_id, "grad", max_steps=60, start=100, end=700)
    return out


def _blocks(path: Path) -> tuple[int, int]:
    """(raw blocks, encoded blocks) of chunks and rollups."""
    con = sqlite3.connect(path)
    counts = [0, 0]
    for table in ("chunks", "rollups", "rollup_heat"):
        for (data,) in con.execute(f"SELECT data FROM {table}"):
            counts[codec.is_encoded(data)] += 1
    con.close()
    return counts[0], counts[1]


def test_old_blocks_read_as_before_and_compact_to_identical_smaller_ones(tmp_path):
    path = tmp_path / "gw.db"
    _build(path)
    url = f"sqlite:///{path}"
    engine = database.make_engine(url)
    with engine.connect() as conn:
        new_reads = _reads(conn, 1)
    engine.dispose()
    unread = as_release_0_2(path)  # with 0.2's 64-step blocks of scalar keys (no longer read)
    raw_size = disk_size(path)
    assert _blocks(path)[1] == 0
    engine = database.make_engine(url)  # upgrades 0002 -> 0003 and reads the old blocks as they are
    with engine.connect() as conn:
        assert _reads(conn, 1) == new_reads
        small_rows = conn.exec_driver_sql("SELECT count(*) FROM chunks WHERE n < 16").scalar()
    engine.dispose()
    assert small_rows > 3  # the live-shaped tail: one small row per batch
    with engine.begin() as conn:  # an ended run: compaction also gives it a clock
        conn.exec_driver_sql("UPDATE runs SET status = 'finished'")
    engine.dispose()
    done = compact.compact(url, say=lambda _line: None)
    assert done.chunks > 0 and done.rollups > 0 and done.merged > 0 and done.bytes_after < done.bytes_before / 2
    assert done.dropped == unread > 0
    assert _blocks(path)[0] == 0  # nothing raw is left
    con = sqlite3.connect(path)
    chunk_blobs = [data for (data,) in con.execute("SELECT data FROM chunks")]
    con.close()
    assert done.clocked > 0 and all(codec.leaves_walls(b) for b in chunk_blobs)  # one wall time per record
    engine = database.make_engine(url)
    with engine.connect() as conn:
        assert _reads(conn, 1) == new_reads
        usage = stats.collect(conn)
        assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2  # later compactions shrink in steps
    engine.dispose()
    assert {k.rows for k in usage.kinds.values()} and all(k.encoded == k.rows for k in usage.kinds.values())
    assert usage.runs[0][:3] == (1, "p", "before the upgrade") and usage.runs[0][3] == 9000 * 3 + 1500 * len(LAYERS)
    assert disk_size(path) < raw_size / 2.5, (disk_size(path), raw_size)
    again = compact.compact(url, say=lambda _line: None)  # resumable and idempotent: nothing left to do
    assert again.chunks == again.merged == again.rollups == 0


def test_compaction_beside_a_live_server_loses_and_doubles_nothing(tmp_path):
    path = tmp_path / "gw.db"
    _build(path)
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        before = _reads(conn, 1)
    engine.dispose()
    as_release_0_2(path)
    raw_size = disk_size(path)
    server = ServerProcess(f"sqlite:///{path}")
    try:
        out, sent, during = compact_while_streaming(
            server,
            f"sqlite:///{path}",
            lambda step: ({"loss": 1.0 / (1 + step)}, {"grad": [0.5, 1.0 * step, None]}),
            layouts={"grad": ["a", "b", "c"]},
            warm_at=40,
            min_steps=300,
        )
        assert "compacted" in out.stdout
        assert during > 0 and len(sent) >= 300  # the run kept streaming through the compaction
        runs = get_json(server.url + "/api/runs")
        live = next(r for r in (runs["runs"] if isinstance(runs, dict) else runs) if r["name"] == "n")
        for key in ("loss", "grad/b"):
            got = get_json(f"{server.url}/api/runs/{live['id']}/series?key={key}")
            assert got["steps"] == sent, key  # every acked step once, in order
        grad_a = get_json(f"{server.url}/api/runs/{live['id']}/series?key=grad/c")
        assert grad_a["values"] == [None] * len(sent)
        stats_out = subprocess.run(
            [sys.executable, "-m", "gradwatch_server.cli", "db", "stats", "--db", f"sqlite:///{path}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stats_out.returncode == 0 and "before the upgrade" in stats_out.stdout, stats_out.stderr
        with urllib.request.urlopen(server.url + "/healthz", timeout=10):
            pass
    finally:
        server.stop()
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert _reads(conn, 1) == before
    engine.dispose()
    assert disk_size(path) < raw_size / 2, (disk_size(path), raw_size)


@pytest.mark.slow
def test_postgres_old_blocks_read_and_compact_the_same_way(postgres_url):
    from pg_cluster import fresh_database

    url = fresh_database(postgres_url)
    _build(url, steps=5000, vector_steps=600)
    engine = database.make_engine(url)
    with engine.connect() as conn:
        new_reads = _reads(conn, 1)
    engine.dispose()
    unread = as_release_0_2(url)
    engine = database.make_engine(url)
    with engine.connect() as conn:
        assert _reads(conn, 1) == new_reads
    engine.dispose()
    done = compact.compact(url, say=lambda _line: None)
    assert done.chunks > 0 and done.rollups > 0 and done.dropped == unread > 0
    engine = database.make_engine(url)
    with engine.connect() as conn:
        assert _reads(conn, 1) == new_reads
        usage = stats.collect(conn)
    engine.dispose()
    assert all(k.encoded == k.rows for k in usage.kinds.values()) and usage.file_bytes > 0
