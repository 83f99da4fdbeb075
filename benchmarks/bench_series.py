"""Chart reads of big runs next to a raw SQLite scan of the same points, in one run.

Run: .venv/bin/python benchmarks/bench_series.py [--quick] [--steps N [--vector-steps N] [--noisy]]
Builds runs through the real ingest path (a scalar key with a spike, a NaN and an inf; a 300-layer
gradient-norm vector), then times chart requests (``store.get_series`` / ``get_heatmap``, server
time without HTTP) against the baseline: a plain ``SELECT step, value`` scan of the same points
stored one row each in a (key, step) WITHOUT ROWID table of a separate SQLite file. The heatmap is
timed twice: from the small per-block heat rows (``rollup_heat``), and as before they existed (the
heat rows deleted, and lean summaries made whole, inside a transaction that is rolled back, so every
block's full summary is read).
The full run builds a 1M-step, 300-layer vector (2.4 GB of points; ~10 minutes to ingest).
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from sqlalchemy import delete

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from old_format import full_summaries  # noqa: E402

from gradwatch import protocol  # noqa: E402
from gradwatch_server.ingest.apply import apply_batch, load_state  # noqa: E402
from gradwatch_server.ingest.batch import decode  # noqa: E402
from gradwatch_server.ingest.hello import open_run  # noqa: E402
from gradwatch_server.storage import database, db, store  # noqa: E402

LAYERS = 300
BATCH = 20_000


def build(engine, steps: int, vector_steps: int, noisy: bool = False) -> tuple[int, float]:
    """Ingest ``steps`` steps of 'loss' (and 'grad' vectors for the first ``vector_steps``); (run id, steps/s).

    The vectors are constant per layer (they compress to almost nothing), or with ``noisy`` float32-born
    norms with 10 % noise a step around a scale per layer, as bench_storage.py's realistic stream.
    """
    rng = np.random.default_rng(0)
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": f"bench-{steps}", "project": "bench", "name": "big"}, {})["run_id"]
        state = load_state(conn, run_id)
    scale = np.array([10.0 ** -(j % 6) for j in range(LAYERS)])
    start = time.perf_counter()
    for seq, lo in enumerate(range(0, steps, BATCH), start=1):
        hi = min(lo + BATCH, steps)
        vecs = vector_rows(rng, scale, hi - lo, noisy)
        loss = (1 / (1 + np.arange(lo, hi) * 1e-4) + rng.random(hi - lo) * 0.01).tolist()
        for i, v in spikes(steps).items():
            if lo <= i < hi:
                loss[i - lo] = v
        records = [
            (i, float(i), {"loss": loss[i - lo]}, {"grad": vecs[i - lo]} if i < vector_steps else {})
            for i in range(lo, hi)
        ]
        msg = {
            "type": "batch",
            "seq": seq,
            "columns": protocol.encode_columns(records),
            "layouts": {"grad": [f"layer{j}" for j in range(LAYERS)]},
        }
        with engine.begin() as conn:
            apply_batch(conn, state, decode(msg))
    return run_id, steps / (time.perf_counter() - start)


def vector_rows(rng, scale: np.ndarray, n: int, noisy: bool) -> list:
    """``n`` steps of per-layer norms as lists: the scales themselves, or float32-born with 10 % noise."""
    if not noisy:
        return [scale.tolist()] * n
    return (scale * np.exp(rng.normal(0, 0.1, (n, LAYERS)))).astype(np.float32).astype(np.float64).tolist()


def spikes(steps: int) -> dict:
    return {steps // 3: 1e6, steps // 2: math.nan, 2 * steps // 3: math.inf}


def raw_table(path: Path, steps: int) -> sqlite3.Connection:
    """The baseline: the same points, one row each, in a (key, step) WITHOUT ROWID table."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE points (key INTEGER, step INTEGER, value REAL, PRIMARY KEY (key, step)) WITHOUT ROWID")
    for lo in range(0, steps, 1_000_000):
        con.executemany(
            "INSERT INTO points VALUES (1, ?, ?)",
            ((i, 1 / (1 + i * 1e-4)) for i in range(lo, min(lo + 1_000_000, steps))),
        )
    con.commit()
    return con


def raw_scan(con: sqlite3.Connection, lo: int, hi: int) -> int:
    return len(
        con.execute("SELECT step, value FROM points WHERE key = 1 AND step BETWEEN ? AND ?", (lo, hi)).fetchall()
    )


def timed(fn, repeat: int = 5) -> float:
    """Median seconds over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def report(tmp: Path, steps: int, vector_steps: int, noisy: bool = False) -> None:
    engine = database.make_engine(f"sqlite:///{tmp / f'run-{steps}.db'}")
    run_id, rate = build(engine, steps, vector_steps, noisy)
    con = raw_table(tmp / f"raw-{steps}.db", steps)
    print(
        f"\n{steps:,} steps of 'loss' ({vector_steps:,} with {LAYERS}-layer {'noisy ' if noisy else ''}norms), ingested at {rate:,.0f} "
        "steps/s through apply_batch\n"
    )
    print("| request | gradwatch (ms) | raw SQLite scan of the range (ms) | ratio |\n|---|---|---|---|")
    zoom = (steps // 2, steps // 2 + steps // 100)
    with engine.connect() as conn:
        cases = [
            ("loss, whole run, 2000 pts", lambda: store.get_series(conn, run_id, "loss", 2000), (0, steps - 1)),
            ("loss, 1% zoom, 2000 pts", lambda: store.get_series(conn, run_id, "loss", 2000, *zoom), zoom),
            (
                "loss, 1,000 steps full detail",
                lambda: store.get_series(conn, run_id, "loss", None, 5000, 5999),
                (5000, 5999),
            ),
            (
                "one layer of 300, whole run",
                lambda: store.get_series(conn, run_id, "grad/layer7", 2000),
                (0, vector_steps - 1),
            ),
            (
                "heatmap 300 layers x 400 steps",
                lambda: store.get_heatmap(conn, run_id, "grad", 400),
                (0, vector_steps - 1),
            ),
        ]
        for name, fn, (lo, hi) in cases:
            ours, raw = timed(fn), timed(lambda lo=lo, hi=hi: raw_scan(con, lo, hi))
            print(f"| {name} | {ours * 1e3:.1f} | {raw * 1e3:.1f} | **{ours / raw:.3f}** |")
        with _without_heat_rows(conn):
            ours = timed(lambda: store.get_heatmap(conn, run_id, "grad", 400))
        raw = timed(lambda: raw_scan(con, 0, vector_steps - 1))
        print(
            f"| heatmap, as before heat rows (full summaries) | {ours * 1e3:.1f} | {raw * 1e3:.1f} | **{ours / raw:.3f}** |"
        )
        kept = dict(zip(*(lambda s: (s["steps"], s["values"]))(store.get_series(conn, run_id, "loss", 2000))))
        marks = spikes(steps)
        ok = [kept.get(s) == protocol.encode_float(v) for s, v in marks.items()]
        print(f"\nspike, NaN and inf all in the whole-run view: {all(ok)}")
    engine.dispose()
    con.close()


@contextmanager
def _without_heat_rows(conn):
    """The heat rows gone (a run stored before they existed) for a while, then put back (rolled back)."""
    trans = conn.begin_nested() if conn.in_transaction() else conn.begin()
    full_summaries(conn)  # as stored then: lean summaries (revision 0010) need their heat rows
    conn.execute(delete(db.rollup_heat))
    try:
        yield
    finally:
        trans.rollback()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI keeps the script working)")
    parser.add_argument("--steps", type=int, help="one run of this many steps (with --vector-steps) instead")
    parser.add_argument("--vector-steps", type=int, default=100_000)
    parser.add_argument(
        "--noisy", action="store_true", help="realistic per-layer norms (10 %% noise a step), not constants"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.steps:
            report(Path(tmp), args.steps, min(args.steps, args.vector_steps), args.noisy)
        elif args.quick:
            report(Path(tmp), 100_000, 10_000)
        else:
            report(Path(tmp), 1_000_000, 1_000_000)  # the heatmap of a 1M-step, 300-layer run
            report(Path(tmp), 10_000_000, 100_000)


if __name__ == "__main__":
    main()
