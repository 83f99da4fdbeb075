"""A big generated sweep written straight into a database (runs, configs, summaries, optional points), for the
10,000-run table tests and benchmarks/bench_sweep.py; small sweeps in tests go through the real client instead."""

from __future__ import annotations

import itertools
import json
import math
import time

import numpy as np
from sqlalchemy import func, select

from gradwatch_server.storage import chunks, database, db, summaries

LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
BATCH_SIZES = (32, 64, 128, 256)
OPTIMIZERS = ("adam", "sgd", "adamw")


def curve(lr: float, bs: int, opt: str, seed: int, steps: np.ndarray) -> np.ndarray:
    """A validation loss that depends on the config (best near lr 1e-3, adam) plus seed noise."""
    base = 0.3 + abs(math.log10(lr) + 3) * 0.2 + (0.1 if opt == "sgd" else 0.0) + 32 / bs * 0.05
    rng = np.random.default_rng(seed * 7919 + int(lr * 1e6) + bs)
    return base + 2.0 / (1 + steps / 20) + rng.normal(0, 0.02, len(steps))


def make(url: str, n: int, steps: int = 0, project: str = "sweep", points_for: int | None = None) -> list[dict]:
    """``n`` finished runs (lr x batch_size x optimizer x seed) with val/loss and loss summaries; with
    ``steps``, their points too (chunks; only the first ``points_for`` runs' if given) so charts and the compare
    series have data. Returns the configs."""
    engine = database.make_engine(url, synchronous="normal")
    grid = list(itertools.product(LRS, BATCH_SIZES, OPTIMIZERS))
    configs, now = [], time.time()
    with engine.begin() as conn:
        start = (conn.execute(select(func.max(db.runs.c.id))).scalar() or 0) + 1
        rows, sums = [], []
        for i in range(n):
            lr, bs, opt = grid[i % len(grid)]
            seed = i // len(grid)
            config = {"lr": lr, "batch_size": bs, "optimizer": opt, "seed": seed, "epochs": 3}
            configs.append(config)
            run_id = start + i
            rows.append(
                dict(
                    id=run_id,
                    uid=f"gen-{run_id}",
                    project=project,
                    name=f"{opt}-lr{lr:g}-bs{bs}-s{seed}",
                    status="finished",
                    created_at=now - n + i,
                    updated_at=now,
                    finished_at=now,
                    last_step=(steps or 300) - 1,
                    last_seq=0,
                    config=json.dumps(config),
                )
            )
            at = np.arange(steps or 300, dtype=np.int64)
            val = curve(lr, bs, opt, seed, at)
            sums.append(summaries.batch_row(run_id, "val/loss", at, val))
            sums.append(summaries.batch_row(run_id, "loss", at, val * 0.9))
        conn.execute(db.runs.insert(), rows)
        for part in range(0, len(sums), 5000):
            summaries.upsert(conn, sums[part : part + 5000])
        if steps:
            _points(conn, start, configs[:points_for], steps)
    engine.dispose()
    return configs


def _points(conn, start: int, configs: list[dict], steps: int) -> None:
    at = np.arange(steps, dtype=np.int64)
    walls = 1.7e9 + at.astype(np.float64)
    for i, c in enumerate(configs):
        val = curve(c["lr"], c["batch_size"], c["optimizer"], c["seed"], at)
        for key, values in (("val/loss", val), ("loss", val * 0.9), ("tokens", at * 4096.0 * c["batch_size"] / 32)):
            key_id = conn.execute(db.metric_keys.insert().values(run_id=start + i, key=key)).inserted_primary_key[0]
            tail = chunks.Tail(slots=1)
            chunks.append_now(conn, tail, key_id, chunks.Points(at, walls, values.reshape(-1, 1).astype(np.float64)))
            if key == "tokens":  # the others' summaries are written with the runs
                summaries.upsert(conn, [summaries.batch_row(start + i, key, at, values)])
