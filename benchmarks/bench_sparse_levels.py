"""Which rollup levels a sparse key should keep: bytes and heatmap reads of a key logged every 10th step.

Run: .venv/bin/python benchmarks/bench_sparse_levels.py [--quick] [--steps N] [--rounds N]

One run as ``watch()`` sends its update ratios on a nanoGPT-sized model: a 27-layer vector every 10th step
(float32-born, the noise measured on a real nanoGPT run) beside a loss every step, through the real ingest
(``apply_batch``, 1,000-step batches) into three SQLite files that differ only in ``rollup.MIN_POINTS``, the
fewest points a kept level's blocks must hold: 0 (every level, as before revision 0011), 4 (this release) and
8. For each: the file after ``VACUUM``, and the time of the page's heatmap (400 columns) over ranges whose
columns are 63, 250 and 500 steps wide and over a 1,000-step zoom, each the median of ``--rounds`` reads taken
in turn across the three files (so a slower minute hits all three). The answers are the same points (the
heatmaps differ only where a block that lies across two columns counts in the one it starts in).
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

from gradwatch import protocol
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.storage import database, rollup, store

LAYERS, EVERY, BATCH = 27, 10, 1000
CHOICES = {"every level (before 0011)": 0, "MIN_POINTS 4 (now)": 4, "MIN_POINTS 8": 8}


def build(path: Path, steps: int, values: np.ndarray) -> int:
    """The run through apply_batch into a fresh file; its run id."""
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "sparse", "project": "bench", "name": "sparse"}, {})["run_id"]
        state = load_state(conn, run_id)
    layout = {"grad": [f"l{j}" for j in range(LAYERS)]}
    for seq, lo in enumerate(range(0, steps, BATCH), start=1):
        records = [
            (
                i,
                1.76e9 + 0.1 * i,
                {"loss": 1.0 / (1 + i)},
                {"grad": values[i // EVERY].tolist()} if i % EVERY == 0 else {},
            )
            for i in range(lo, min(lo + BATCH, steps))
        ]
        msg = {"type": "batch", "seq": seq, "columns": protocol.encode_columns(records), "layouts": layout}
        if lo + BATCH >= steps:
            msg["events"] = [{"type": "status", "status": "finished"}]
        with engine.begin() as conn:
            apply_batch(conn, state, decode(msg))
    engine.dispose()
    return run_id


def vacuumed(path: Path) -> int:
    con = sqlite3.connect(path)
    con.execute("VACUUM")
    con.close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 steps, 3 rounds (CI keeps the script working)")
    parser.add_argument("--steps", type=int, default=200_000, help="steps of the run [200,000]")
    parser.add_argument("--rounds", type=int, default=15, help="reads of each range per file [15]")
    args = parser.parse_args()
    steps, rounds = (20_000, 3) if args.quick else (args.steps, args.rounds)
    rng = np.random.default_rng(0)
    scale = np.exp(rng.normal(-3, 1.5, LAYERS))
    values = (scale * np.exp(rng.normal(0, 0.086, (-(-steps // EVERY), LAYERS)))).astype(np.float32).astype(np.float64)
    cases = [(0, s * 400 - 1, 400) for s in (63, 250, 500) if s * 400 <= steps] + [(steps // 4, steps // 4 + 999, 40)]
    default = rollup.MIN_POINTS
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, fewest in CHOICES.items():
            rollup.MIN_POINTS = fewest  # the one thing that differs between the files (written, then read)
            path = Path(tmp) / f"{fewest}.db"
            run_id = build(path, steps, values)
            files[name] = (vacuumed(path), database.make_engine(f"sqlite:///{path}"), run_id)
        rollup.MIN_POINTS = default
        times: dict = {}
        for _ in range(rounds):
            for name, (_size, engine, run_id) in files.items():
                with engine.connect() as conn:
                    for case in cases:
                        start = time.perf_counter()
                        store.get_heatmap(conn, run_id, "grad", case[2], case[0], case[1])
                        times.setdefault((name, case), []).append(time.perf_counter() - start)
        for _size, engine, _run in files.values():
            engine.dispose()
    print(f"\n{steps:,} steps: loss every step, a {LAYERS}-layer vector every {EVERY}th; heatmap read times are "
          f"medians of {rounds} (ms)\n")  # fmt: skip
    head = " | ".join(f"heatmap, {c[2]} columns of {-(-(c[1] - c[0] + 1) // c[2])} steps" for c in cases)
    print(f"| levels kept | whole file (bytes) | {head} |\n|---|---|" + "---|" * len(cases))
    for name, (size, _engine, _run) in files.items():
        cells = " | ".join(f"{1000 * float(np.median(times[(name, c)])):.1f}" for c in cases)
        print(f"| {name} | {size:,} | {cells} |")


if __name__ == "__main__":
    main()
