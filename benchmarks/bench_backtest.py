"""Replaying a project's rules on its history: ``POST /api/projects/{p}/rules/backtest``'s work, timed.

Run: .venv/bin/python benchmarks/bench_backtest.py [--quick]
Builds a project of runs through the real ingest path (loss, val/loss every 100 steps, global gradient norm
and LR per step; one run in ten spikes, one in ten diverges), then times ``rules.backtest.backtest`` with the
current rules next to proposed ones (a rule turned off, three rules' thresholds changed, so replayed, and a
custom z-score rule): the issue's bound is 2 s for 100 runs x 10k steps.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from gradwatch import protocol
from gradwatch_server.health import registry
from gradwatch_server.ingest.apply import apply_batch, load_state
from gradwatch_server.ingest.batch import decode
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.rules import backtest, policy
from gradwatch_server.storage import database

BATCH = 2000


def records(run: int, steps: int) -> list:
    rng = np.random.default_rng(run)
    s = np.arange(steps)
    loss = (2.0 * np.exp(-s / 3000) + 0.1) * (1 + 0.03 * rng.standard_normal(steps))
    if run % 10 == 3:
        loss[steps // 2] *= 40  # a bad batch
    if run % 10 == 7:
        loss[int(steps * 0.8) :] *= 100  # diverged
    norm = np.abs(1 + 0.2 * rng.standard_normal(steps))
    lr = 1e-3 * np.minimum(1, (s + 1) / 500)
    out = []
    for i in range(steps):
        sc = {"loss": float(loss[i]), "grad/global_norm": float(norm[i]), "lr": float(lr[i])}
        if i % 100 == 0:
            sc["val/loss"] = float(loss[i] * 1.1)
        out.append((i, 1000.0 + i, sc, {}))
    return out


def build(path: Path, runs: int, steps: int):
    engine = database.make_engine(f"sqlite:///{path}")
    for run in range(runs):
        with engine.begin() as conn:
            run_id = open_run(conn, {"uid": f"u{run}", "project": "bench", "name": f"run{run}"}, {})["run_id"]
            state = load_state(conn, run_id)
        recs = records(run, steps)
        for seq, lo in enumerate(range(0, steps, BATCH), 1):
            msg = {"type": "batch", "seq": seq, "columns": protocol.encode_columns(recs[lo : lo + BATCH])}
            with engine.begin() as conn:
                apply_batch(conn, state, decode(msg))
    return engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="10 runs x 10k steps instead of 100")
    args = ap.parse_args()
    runs, steps = (10, 10_000) if args.quick else (100, 10_000)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        engine = build(Path(tmp) / "bt.db", runs, steps)
        print(f"built {runs} runs x {steps} steps in {time.perf_counter() - t0:.1f} s")
        current = policy.validate({})
        proposed = policy.validate(
            {
                "disabled": ["loss_plateau"] if "loss_plateau" in registry.kinds() else [],
                "thresholds": {"loss_divergence.factor": 5, "loss_spike.factor": 8, "exploding_gradients.factor": 50},
                "custom": [{"name": "val z", "key": "val/loss", "type": "zscore", "z": 4}],
            }
        )
        for _ in range(2):
            t0, c0 = time.perf_counter(), time.process_time()
            with engine.connect() as conn:
                out = backtest.backtest(conn, "bench", current, proposed)
            took, cpu = time.perf_counter() - t0, time.process_time() - c0
            fired = sum(len(r["current"]) + len(r["proposed"]) for r in out["runs"])
            print(
                f"backtest: {len(out['runs'])} runs, {out['points']:,} points replayed ({', '.join(out['replayed'])}), "
                f"{fired} firings, {took:.2f} s wall, {cpu:.2f} s CPU (this process)"
            )


if __name__ == "__main__":
    main()
