"""Reading big runs: chart requests served from rollups next to the raw read they replace.

Run: .venv/bin/python benchmarks/bench_series.py [--steps 1000000] [--vector-steps 100000]
Builds one run through the real ingest path (a scalar key with a spike, a NaN and an inf, and a
300-layer gradient-norm vector), then times each chart request both ways in the same process.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

from gradwatch import protocol
from gradwatch_server import db, rollup, series, store
from gradwatch_server.downsample import envelope
from gradwatch_server.ingest import apply_batch, load_state, open_run

LAYERS = 300


def build(engine, steps: int, vector_steps: int) -> tuple[int, float]:
    """Ingest the run in 1000-step batches; returns its id and the ingest rate (steps/s)."""
    rng = random.Random(0)
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "bench", "project": "bench", "name": "big"}, {})["run_id"]
        state = load_state(conn, run_id)
    spikes = {steps // 3: 1e6, steps // 2: math.nan, 2 * steps // 3: math.inf}
    vec = [protocol.encode_float(10.0 ** -(j % 6)) for j in range(LAYERS)]
    t0 = time.perf_counter()
    for seq, lo in enumerate(range(0, steps, 1000), start=1):
        records = [{"step": i, "t": float(i), "scalars": {"loss": protocol.encode_float(
            spikes.get(i, 1 / (1 + i * 1e-4) + rng.random() * 0.01))},
                    **({"vectors": {"grad": vec}} if i < vector_steps else {})} for i in range(lo, lo + 1000)]
        msg = {"seq": seq, "records": records, "layouts": {"grad": [f"layer{j}" for j in range(LAYERS)]}}
        with engine.begin() as conn:
            apply_batch(conn, state, msg)
    return run_id, steps / (time.perf_counter() - t0)


def live_writer_rate(path: Path, steps: int = 3000, batch: int = 20) -> float:
    """Writer steps/s for live-sized batches (20 steps, as at ~100-200 steps/s) with 300-layer vectors."""
    engine = db.make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        state = load_state(conn, open_run(conn, {"uid": "live", "project": "bench", "name": "live"}, {})["run_id"])
    vec = [0.001 * (j + 1) for j in range(LAYERS)]
    start = time.perf_counter()
    for seq, lo in enumerate(range(0, steps, batch), start=1):
        records = [{"step": i, "t": float(i), "scalars": {"loss": 1 / (1 + i), "grad/global_norm": 1.0, "lr": 1e-3,
                                                          "memory/rss": 1e9}, "vectors": {"grad": list(vec)}}
                   for i in range(lo, lo + batch)]
        msg = {"seq": seq, "records": records, "layouts": {"grad": [f"layer{j}" for j in range(LAYERS)]}}
        with engine.begin() as conn:
            apply_batch(conn, state, msg)
    return steps / (time.perf_counter() - start)


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def raw_envelope(conn, run_id: int, key: str, max_points: int, start=None, end=None) -> int:
    """What a chart request cost before rollups: read every point in range, envelope in Python."""
    _, key_id, slot, _ = store._resolve_key(conn, run_id, key)
    table = db.points if slot is None else db.vectors
    lo, hi = series.step_bounds(conn, table, key_id, start, end)
    steps, values, _, _ = series.raw(conn, table, key_id, slot, lo, hi)
    return len(envelope(steps, values, max_points))


def raw_heatmap(conn, key_id: int, max_steps: int) -> int:
    lo, hi = series.step_bounds(conn, db.vectors, key_id, None, None)
    return len(series._heat_units_raw(conn, key_id, LAYERS, lo, hi)[0]) // max(1, -(-(hi - lo + 1) // max_steps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--vector-steps", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = db.make_engine(f"sqlite:///{Path(tmp) / 'bench.db'}")
        run_id, rate = build(engine, args.steps, args.vector_steps)
        levels, rollup.LEVELS = rollup.LEVELS, ()  # the same ingest with rollups switched off, as the baseline
        n = min(args.steps, 200_000)
        _, base = build(db.make_engine(f"sqlite:///{Path(tmp) / 'base.db'}"), n, min(args.vector_steps, n // 10))
        live_off = live_writer_rate(Path(tmp) / "live-off.db")
        rollup.LEVELS = levels
        live_on = live_writer_rate(Path(tmp) / "live-on.db")
        print(f"writer, live-sized 20-step batches with {LAYERS}-layer vectors: {live_on:,.0f} steps/s with rollups, "
              f"{live_off:,.0f} without (ratio {live_off / live_on:.2f}x)")
        print(f"ingest: {rate:,.0f} steps/s with rollups ({args.steps:,} steps, {args.vector_steps:,} with "
              f"{LAYERS} layer norms); {base:,.0f} steps/s without (first {n:,} steps); ratio {base / rate:.2f}x")
        with engine.connect() as conn:
            vec_id = store._resolve_key(conn, run_id, "grad/layer0")[1]
            cases = [
                ("loss, whole run, 4000 pts", lambda: store.get_series(conn, run_id, "loss", 4000),
                 lambda: raw_envelope(conn, run_id, "loss", 4000)),
                ("loss, 10% zoom, 4000 pts", lambda: store.get_series(conn, run_id, "loss", 4000, 0, args.steps // 10),
                 lambda: raw_envelope(conn, run_id, "loss", 4000, 0, args.steps // 10)),
                ("one layer, whole run", lambda: store.get_series(conn, run_id, "grad/layer7", 4000),
                 lambda: raw_envelope(conn, run_id, "grad/layer7", 4000)),
                ("heatmap 300 layers x 400", lambda: store.get_heatmap(conn, run_id, "grad", 400),
                 lambda: raw_heatmap(conn, vec_id, 400)),
            ]
            print(f"{'request':28} {'rollups':>10} {'raw read':>10} {'speed-up':>9}")
            for name, new, old in cases:
                t_new, out = timed(new)
                t_old, _ = timed(old, repeat=1)
                print(f"{name:28} {t_new * 1000:8.1f}ms {t_old * 1000:8.1f}ms {t_old / t_new:8.1f}x")
            s = store.get_series(conn, run_id, "loss", 4000)
            kept = dict(zip(s["steps"], s["values"]))
            print("spike, NaN and inf kept in the whole-run view:",
                  kept.get(args.steps // 3) == 1e6, kept.get(args.steps // 2) == "NaN",
                  kept.get(2 * args.steps // 3) == "Infinity")


if __name__ == "__main__":
    main()
