"""Bytes on disk per point: realistic streams stored now, as the previous release stored them, and by TensorBoard.

Run: .venv/bin/python benchmarks/bench_storage.py [--quick] [--steps N] [--vector-steps N] [--watch-steps N]
     [--no-tensorboard] [--postgres]

One run of 10 scalar keys logged together (float32-born losses with noise, one with NaN bursts, a
noisy gradient norm, float64 counters, a constant LR, a cosine LR, a memory counter, and step time
and throughput as gradwatch's step timer records them: 1 us, 4 digits) and one run of 300-layer
gradient norms (float32-born, noisy, NaN bursts, one layer without gradients), each through the
real ingest (``apply_batch``, batches of 200 steps) into a fresh SQLite file; and one run shaped as
``watch()``'s defaults on a nanoGPT-sized model (per-layer gradient norms every step, update ratios and
output RMS every 10th; noise as measured on a real nanoGPT run), sent one step a batch as a training loop does. Wall times: 0.1 s a
step with 1 ms of jitter, shared by a step's keys, as the client stamps one record. For each file, in the same run:

- **now**: the file after ``VACUUM``, whole (schema pages included), and blob bytes per key;
- **walls per key**: the same database with every chunk holding its own wall times (as before the
  run clock, storage/blocks/clock.py), after ``VACUUM``;
- **0.2**: the same database with every block rewritten as the previous release stored it
  (``tests/old_format.py``), after ``VACUUM``;
- TensorBoard: the same scalars through ``torch.utils.tensorboard.SummaryWriter.add_scalar``
  (and, for the vectors, one ``add_scalar`` per layer, on the first 2,000 steps; both peers on the first 100
  steps with ``--quick``), the event file's size;
- trackio: the same records through ``trackio.log`` (vectors: the first 2,000 steps) in trackio's own
  venv (``python benchmarks/peers/venvs.py trackio`` makes it, as bench_peers.py does; "-" without it),
  its SQLite files after ``VACUUM`` (``peers/trackio_stream.py``);
- with ``--postgres``, the same runs on a throwaway PostgreSQL cluster: the block tables after
  ``VACUUM FULL`` (heap, TOAST, indexes), now and in the 0.2 form, whose raw blobs PostgreSQL's own
  TOAST compression (pglz) shrinks.

Every key is read back and compared bit for bit (NaN payloads, infinities) with what was logged.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "benchmarks"))

from old_format import as_release_0_2, disk_size, without_clock  # noqa: E402
from peers import venvs  # noqa: E402

from gradwatch import protocol  # noqa: E402
from gradwatch.capture.step_timer import four_digits, microseconds  # noqa: E402
from gradwatch.contract import keys  # noqa: E402
from gradwatch_server.ingest.apply import apply_batch, load_state  # noqa: E402
from gradwatch_server.ingest.batch import decode  # noqa: E402
from gradwatch_server.ingest.hello import open_run  # noqa: E402
from gradwatch_server.storage import chunks, database, db  # noqa: E402

LAYERS = 300
BATCH = 200


def scalar_streams(steps: int, rng) -> dict:
    """The 10 keys of one run, (steps,) float64 each."""
    i = np.arange(steps)
    f32 = lambda a: a.astype(np.float32).astype(np.float64)  # noqa: E731 - values read off float32 tensors
    loss = f32(2.5 * np.exp(-i / (steps / 3)) + 0.3 + rng.normal(0, 0.05, steps))
    bursty = f32(loss + rng.normal(0, 0.01, steps))
    for start in rng.integers(0, steps, max(1, steps // 20000)):
        bursty[start : start + 50] = np.nan  # a NaN burst of 50 steps
    return {
        "loss": loss,
        "loss_with_nan_bursts": bursty,
        "grad/global_norm": f32(np.exp(rng.normal(0, 0.3, steps))),
        "lr": np.full(steps, 3e-4),
        "lr_cosine": 3e-4 * 0.5 * (1 + np.cos(np.pi * i / steps)),
        "tokens": (i * 4096).astype(np.float64),
        "epoch": np.floor(i / max(1, steps // 10)).astype(np.float64),
        # gradwatch's own step timer (capture/step_timer.py) keeps these at 1 us and 4 digits
        keys.STEP_TIME: np.array([microseconds(t) for t in 0.1 + rng.exponential(0.002, steps)]),
        "mem/allocated": np.where(i < steps // 10, 2.0e9, 2.5e9) + (i % 1000 == 999) * 4096.0,
        keys.SAMPLES_PER_SEC: np.array([four_digits(r) for r in 5000 + rng.normal(0, 50, steps)]),
    }


def vector_stream(steps: int, rng) -> np.ndarray:
    """(steps, LAYERS) float32-born per-layer norms: a scale per layer, 10 % noise a step, NaN bursts, a dead layer."""
    scale = np.exp(rng.normal(-2, 1.5, LAYERS))
    out = (scale * np.exp(rng.normal(0, 0.1, (steps, LAYERS)))).astype(np.float32).astype(np.float64)
    for start in rng.integers(0, steps, max(1, steps // 5000)):
        out[start : start + 5, rng.integers(0, LAYERS, 20)] = np.nan
    out[:, LAYERS - 1] = np.nan  # marked missing below (no gradient)
    return out


# watch()'s defaults on karpathy/nanoGPT (4 layers, 128 wide: 27 parameters, 41 modules), as measured on a
# 3,000-step shakespeare_char run on CPU: a layer's log norm moves by a median 0.17 a step (i.i.d. noise of
# sd 0.12), its update ratio by 0.12, its output RMS by 0.035; ratios and RMS every 10th step (signals_every)
WATCH_KEYS = {"grad": (27, 1, 0.12), "update_ratio": (27, 10, 0.086), "act_rms": (41, 10, 0.025)}  # width, every, sd


def watch_streams(steps: int, rng) -> dict:
    """key -> (every, (steps // every, width) float32-born values): watch()'s three per-layer keys."""
    out = {}
    for key, (width, every, sd) in WATCH_KEYS.items():
        n = -(-steps // every)
        scale = np.exp(rng.normal(-3, 1.5, width))
        out[key] = (every, (scale * np.exp(rng.normal(0, sd, (n, width)))).astype(np.float32).astype(np.float64))
    return out


def ingest_watch(path: Path, steps: int, walls: np.ndarray, streams: dict) -> None:
    """watch()'s keys through apply_batch, live-shaped: one step a batch, as a training loop sends them."""
    engine = database.make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "watch", "project": "bench", "name": "watch"}, {})["run_id"]
        state = load_state(conn, run_id)
    layouts = {key: [f"{key}{j}" for j in range(v.shape[1])] for key, (_every, v) in streams.items()}
    for i in range(steps):
        vec = {key: v[i // every].tolist() for key, (every, v) in streams.items() if i % every == 0}
        msg = {"type": "batch", "seq": i + 1, "columns": protocol.encode_columns([(i, float(walls[i]), {}, vec)])}
        if i == 0:
            msg["layouts"] = layouts
        if i == steps - 1:
            msg["events"] = [{"type": "status", "status": "finished"}]
        with engine.begin() as conn:
            apply_batch(conn, state, decode(msg))
    engine.dispose()


def watch_exact(path: Path, steps: int, walls: np.ndarray, streams: dict) -> bool:
    """Every watch() key read back bit for bit: steps, wall times and values."""
    engine = database.make_engine(f"sqlite:///{path}")
    ok = True
    with engine.connect() as conn:
        ids = {r.key: r.id for r in conn.execute(db.metric_keys.select())}
        for key, (every, values) in streams.items():
            p = chunks.read(conn, ids[key], slots=values.shape[1])
            at = np.arange(0, steps, every)
            ok &= bool((p.steps == at).all() and (p.walls.view(np.int64) == walls[at].view(np.int64)).all())
            ok &= bool((np.ascontiguousarray(p.values).view(np.int64) == values.view(np.int64)).all())
    engine.dispose()
    return ok


def measure_watch(tmp: Path, steps: int, walls: np.ndarray, rng) -> dict:
    streams = watch_streams(steps, rng)
    path = tmp / "watch.db"
    ingest_watch(path, steps, walls, streams)
    values = {key: v.size for key, (_every, v) in streams.items()}
    return {"exact": watch_exact(path, steps, walls, streams), "keys": per_key_bytes(path), "values": values,
            "now": vacuumed(path), "steps": steps}  # fmt: skip


def ingest(path, steps: int, walls: np.ndarray, scalars: dict, vectors: np.ndarray | None) -> float:
    """The streams through apply_batch into a SQLite file (a Path) or a database URL; seconds taken."""
    engine = database.make_engine(f"sqlite:///{path}" if isinstance(path, Path) else path)
    layout = [f"layer{j}" for j in range(LAYERS)]
    start = time.perf_counter()
    with engine.begin() as conn:
        run_id = open_run(conn, {"uid": "bench", "project": "bench", "name": "bench"}, {})["run_id"]
        state = load_state(conn, run_id)
    for seq, lo in enumerate(range(0, steps, BATCH), start=1):
        hi = min(lo + BATCH, steps)
        records = []
        for i in range(lo, hi):
            vec = {}
            if vectors is not None:
                row = vectors[i].tolist()
                row[-1] = None
                vec = {"grad": row}
            records.append((i, float(walls[i]), {k: float(v[i]) for k, v in scalars.items()}, vec))
        msg = {"type": "batch", "seq": seq, "columns": protocol.encode_columns(records)}
        if hi == steps:  # the run ends (its last small rows are sealed into one compressed row)
            msg["events"] = [{"type": "status", "status": "finished"}]
        if vectors is not None:
            msg["layouts"] = {"grad": layout}
        with engine.begin() as conn:
            apply_batch(conn, state, decode(msg))
    seconds = time.perf_counter() - start
    engine.dispose()
    return seconds


def check_bit_exact(path: Path, steps: int, walls: np.ndarray, scalars: dict, vectors) -> bool:
    """Every stored key equals what was logged, bit for bit (steps, wall times, values, missing slots)."""
    engine = database.make_engine(f"sqlite:///{path}")
    ok = True
    with engine.connect() as conn:
        ids = {r.key: r.id for r in conn.execute(db.metric_keys.select())}
        for key, values in scalars.items():
            p = chunks.read(conn, ids[key], slots=1)
            ok &= bool((p.steps == np.arange(steps)).all() and (p.walls.view(np.int64) == walls.view(np.int64)).all())
            ok &= bool((np.ascontiguousarray(p.values[:, 0]).view(np.int64) == values.view(np.int64)).all())
        if vectors is not None:
            p = chunks.read(conn, ids["grad"], slots=LAYERS)
            got = np.ascontiguousarray(p.values[:, :-1]).view(np.int64)
            ok &= bool((got == vectors[:, :-1].view(np.int64)).all() and p.missing[:, -1].all())
            ok &= bool(not p.missing[:, :-1].any())
    engine.dispose()
    return ok


def per_key_bytes(path: Path) -> dict:
    """key -> (chunk blob bytes, rollup + heat blob bytes)."""
    con = sqlite3.connect(path)
    out = {}
    for key_id, key in con.execute("SELECT id, key FROM metric_keys"):
        size = "SUM(length(steps) + length(walls) + length(data) + COALESCE(length(missing), 0))"
        c = con.execute(f"SELECT COALESCE({size}, 0) FROM chunks WHERE key_id = ?", (key_id,)).fetchone()[0]
        r = sum(
            con.execute(f"SELECT COALESCE(SUM(length(data)), 0) FROM {t} WHERE key_id = ?", (key_id,)).fetchone()[0]
            for t in ("rollups", "rollup_heat")
        )
        out[key] = (c, r)
    con.close()
    return out


def per_level_bytes(path: Path) -> dict:
    """rollup level -> (summary blob bytes, heat blob bytes): what each level costs on disk."""
    con = sqlite3.connect(path)
    out: dict = {}
    for col, table in enumerate(("rollups", "rollup_heat")):
        for level, size in con.execute(f"SELECT level, SUM(length(data)) FROM {table} GROUP BY level"):
            out.setdefault(level, [0, 0])[col] = size
    con.close()
    return dict(sorted(out.items()))


def vacuumed(path: Path) -> int:
    con = sqlite3.connect(path)
    con.execute("VACUUM")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return disk_size(path)


TB_VECTOR_STEPS = 2000  # TensorBoard writes a layer value per add_scalar call: its file is measured on these
# --quick: the peers' files on their first steps only (TensorBoard's writer thread spent 35 of the 37 seconds
# --quick took on its 240,000 add_scalar calls); their fixed overhead then weighs more a value: --quick keeps
# the script working, the full run measures them
QUICK_PEER_STEPS = 100


def peer_steps(steps: int, vectors, quick: bool) -> int:
    """The steps a peer's file is measured on: all, but the first TB_VECTOR_STEPS of the vectors (its file grows
    linearly) and the first QUICK_PEER_STEPS with --quick."""
    steps = min(steps, TB_VECTOR_STEPS) if vectors is not None else steps
    return min(steps, QUICK_PEER_STEPS) if quick else steps


def tensorboard_bytes(tmp: Path, name: str, steps: int, walls, scalars: dict, vectors) -> float | None:
    """Bytes per value of the event file TensorBoard writes for the first ``steps`` of the stream (None: not installed)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    logdir = tmp / f"tb-{name}"
    writer = SummaryWriter(str(logdir), max_queue=10_000, flush_secs=3600)
    for i in range(steps):
        for key, values in scalars.items():
            writer.add_scalar(key, values[i], i, walltime=walls[i])
        if vectors is not None:
            for j in range(LAYERS - 1):
                writer.add_scalar(f"grad/layer{j}", vectors[i, j], i, walltime=walls[i])
    writer.close()
    values = steps * (len(scalars) if vectors is None else LAYERS - 1)
    return sum(f.stat().st_size for f in logdir.rglob("*") if f.is_file()) / values


def trackio_bytes(tmp: Path, name: str, steps: int, scalars: dict, vectors) -> float | None:
    """Bytes per value of trackio's SQLite files for the first ``steps`` of the records (None: its venv is not made)."""
    if not venvs.status("trackio")["ok"]:
        return None
    stream = tmp / f"trackio-{name}.npz"
    arrays = {f"key:{key}": np.asarray(values[:steps], dtype=np.float64) for key, values in scalars.items()}
    if vectors is not None:
        arrays["layers"] = np.asarray(vectors[:steps, : LAYERS - 1], dtype=np.float64)
    np.savez(stream, steps=np.arange(steps), **arrays)
    script = ROOT / "benchmarks" / "peers" / "trackio_stream.py"
    done = subprocess.run([str(venvs.python("trackio")), str(script), str(stream), str(tmp / f"trackio-{name}")],
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if done.returncode:
        print(f"trackio failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    values = steps * (len(scalars) if vectors is None else LAYERS - 1)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith('{"bytes"')][-1]  # trackio prints around it
    return json.loads(line)["bytes"] / values


def empty_database(tmp: Path) -> int:
    path = tmp / "empty.db"
    database.make_engine(f"sqlite:///{path}").dispose()
    return vacuumed(path)


def measure(tmp: Path, name: str, steps: int, scalars: dict, vectors, walls, tb: bool, quick: bool = False) -> dict:
    path = tmp / f"{name}.db"
    seconds = ingest(path, steps, walls, scalars, vectors)
    exact = check_bit_exact(path, steps, walls, scalars, vectors)
    keys = per_key_bytes(path)
    levels = per_level_bytes(path)
    now = vacuumed(path)
    con = sqlite3.connect(path)
    clock_bytes = con.execute("SELECT COALESCE(SUM(length(data)), 0) FROM run_clock").fetchone()[0]
    con.close()
    shutil.copy(path, tmp / f"{name}-walls.db")
    without_clock(tmp / f"{name}-walls.db")
    walls_keys = per_key_bytes(tmp / f"{name}-walls.db")
    per_key_walls = disk_size(tmp / f"{name}-walls.db")
    as_release_0_2(path)
    old_keys = per_key_bytes(path)
    old = vacuumed(path)
    values = steps * len(scalars) if vectors is None else steps * (LAYERS - 1)
    board = tensorboard_bytes(tmp, name, peer_steps(steps, vectors, quick), walls, scalars, vectors) if tb else None
    track = trackio_bytes(tmp, name, peer_steps(steps, vectors, quick), scalars, vectors) if tb else None
    return {"seconds": seconds, "exact": exact, "keys": keys, "old_keys": old_keys, "now": now, "old": old,
            "values": values, "tensorboard": board, "trackio": track, "walls": per_key_walls, "walls_keys": walls_keys,
            "clock": clock_bytes, "levels": levels}  # fmt: skip


BLOCK_TABLES = ("chunks", "rollups", "rollup_heat")


def postgres_bytes(url: str) -> int:
    """The block tables on PostgreSQL after VACUUM FULL: heap, TOAST (pglz-compressed) and indexes."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for table in BLOCK_TABLES:
            conn.execute(text(f"VACUUM FULL {table}"))
        size = sum(conn.execute(text(f"SELECT pg_total_relation_size('{t}')")).scalar() for t in BLOCK_TABLES)
    engine.dispose()
    return size


def postgres_rows(steps: int, vector_steps: int, walls, scalars: dict, vectors) -> list:
    """(label, values, 0.2 bytes with TOAST, now bytes) of the two runs on a throwaway PostgreSQL cluster."""
    from pg_cluster import cluster, fresh_database

    out = []
    with cluster() as cluster_url:
        for label, n, sc, vec, values in (
            ("scalars", steps, scalars, None, steps * len(scalars)),
            ("vectors", vector_steps, {}, vectors, vector_steps * (LAYERS - 1)),
        ):
            url = fresh_database(cluster_url)
            ingest(url, n, walls, sc, vec)
            now = postgres_bytes(url)
            as_release_0_2(url)
            out.append((label, values, postgres_bytes(url), now))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI keeps the script working)")
    parser.add_argument("--steps", type=int, default=100_000, help="steps of the 10-scalar run [100,000]")
    parser.add_argument("--vector-steps", type=int, default=20_000, help="steps of the 300-layer run [20,000]")
    parser.add_argument("--watch-steps", type=int, default=20_000, help="steps of the watch()-shaped run [20,000]")
    parser.add_argument("--no-tensorboard", action="store_true", help="skip the peers (TensorBoard, trackio)")
    parser.add_argument("--postgres", action="store_true", help="also on PostgreSQL: its TOAST beside the codec")
    args = parser.parse_args()
    steps, vector_steps = (6_000, 600) if args.quick else (args.steps, args.vector_steps)
    watch_steps = 1_000 if args.quick else args.watch_steps
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        empty = empty_database(tmp)
        most = max(steps, vector_steps, watch_steps)
        walls = 1.76e9 + np.arange(most) * 0.1 + rng.normal(0, 1e-3, most)
        scalars, vectors = scalar_streams(steps, rng), vector_stream(vector_steps, rng)
        peers = not args.no_tensorboard
        s = measure(tmp, "scalars", steps, scalars, None, walls, peers, args.quick)
        v = measure(tmp, "vectors", vector_steps, {}, vectors, walls, peers, args.quick)
        w = measure_watch(tmp, watch_steps, walls, rng)
        pg = postgres_rows(steps, vector_steps, walls, scalars, vectors) if args.postgres else []
    print(f"\nempty database (schema only, after VACUUM): {empty:,} bytes; every figure below read back bit-exact: "
          f"{s['exact'] and v['exact'] and w['exact']}\n")  # fmt: skip
    print("| run | values | 0.2: whole file, bytes/value | now: whole file, bytes/value | now: without the empty "
          "schema | ratio 0.2 / now | TensorBoard event file, bytes/value | trackio SQLite, bytes/value | ingest (s) | walls per key (no run "
          "clock): whole file, bytes/value |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, r in ((f"{steps:,} steps x 10 scalar keys", s), (f"{vector_steps:,} steps x {LAYERS} layers", v)):
        board = f"{r['tensorboard']:.1f}" if r["tensorboard"] else "-"
        track = f"{r['trackio']:.1f}" if r["trackio"] else "-"
        print(
            f"| {label} | {r['values']:,} | {r['old'] / r['values']:.2f} | **{r['now'] / r['values']:.2f}** | "
            f"{(r['now'] - empty) / r['values']:.2f} | {r['old'] / r['now']:.1f} | {board} | {track} | "
            f"{r['seconds']:.1f} | "
            f"{r['walls'] / r['values']:.2f} |"
        )
    if pg:
        print("\nPostgreSQL (block tables after VACUUM FULL: heap, TOAST and indexes; 0.2's raw blobs over 2 KB are")
        print("TOAST-compressed by PostgreSQL itself, pglz):\n")
        print("| run | 0.2 with TOAST, bytes/value | now, bytes/value | ratio |\n|---|---|---|---|")
        for label, values, old, now in pg:
            print(f"| {label} | {old / values:.2f} | **{now / values:.2f}** | {old / now:.1f} |")
    print("\nPer key, blob bytes per value (row and index overhead not counted): chunks + rollups (and heat rows)\n")
    print("(walls per key: each chunk with its own wall times; now: the run clock's, counted once per run below)\n")
    print("| key | 0.2: chunks | 0.2: rollups | walls per key: chunks | now: chunks | now: rollups | now: total |")
    print("|---|---|---|---|---|---|---|")
    for r, n, run_steps in ((s, steps, steps), (v, vector_steps * (LAYERS - 1), vector_steps)):
        for key, (c, roll) in r["keys"].items():
            oc, oroll = r["old_keys"][key]
            wc = r["walls_keys"][key][0]
            print(
                f"| {key} | {oc / n:.2f} | {oroll / n:.2f} | {wc / n:.2f} | {c / n:.2f} | {roll / n:.2f} | "
                f"**{(c + roll) / n:.2f}** |"
            )
        print(f"| (run clock, per step of the run) | - | - | - | {r['clock'] / run_steps:.2f} | - | - |")
    print_watch(w, empty)
    print("\nWhat each rollup level costs, blob bytes per value of the run (summaries + heat rows):\n")
    print("| run | " + " | ".join(f"level {lv}" for lv in sorted(set(s["levels"]) | set(v["levels"]))) + " |")
    print("|---|" + "---|" * len(set(s["levels"]) | set(v["levels"])))
    for label, r in (("scalars", s), ("vectors", v)):
        cells = [r["levels"].get(lv) for lv in sorted(set(s["levels"]) | set(v["levels"]))]
        print(
            f"| {label} | "
            + " | ".join("-" if c is None else f"{c[0] / r['values']:.3f} + {c[1] / r['values']:.3f}" for c in cells)
            + " |"
        )


def print_watch(w: dict, empty: int) -> None:
    widths = ", ".join(f"{k} {width} wide every {every}" for k, (width, every, _sd) in WATCH_KEYS.items())
    n = sum(w["values"].values())
    print(f"\nwatch()'s defaults on a nanoGPT-sized model ({widths}), {w['steps']:,} steps one at a time: "
          f"{n:,} layer values, whole file **{w['now'] / n:.2f}** bytes/layer value "
          f"({(w['now'] - empty) / n:.2f} without the empty schema)\n")  # fmt: skip
    print("| key | values | chunks | rollups and heat rows | total |\n|---|---|---|---|---|")
    for key, (c, roll) in w["keys"].items():
        k = w["values"][key]
        print(f"| {key} | {k:,} | {c / k:.2f} | {roll / k:.2f} | **{(c + roll) / k:.2f}** |")


if __name__ == "__main__":
    main()
