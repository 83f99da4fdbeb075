"""What the layer signals (update ratios, output RMS, NaN probe) cost the training thread, per sampling setting.

Run: .venv/bin/python benchmarks/bench_signals.py [--quick]
Prints the median step time of plain training, of watch() without signals, and of watch() with the signals
sampled every 1, 10 and 100 steps, one step of each in turn so drift hits all alike (one torch thread).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import train_steps as steps  # noqa: E402  (the same timed loop as bench_overhead)
from server_process import ServerProcess  # noqa: E402

import gradwatch  # noqa: E402

CONFIGS = {
    "plain": None,
    "no signals": dict(signals=False),
    "every 1": {"signals_every": 1},
    "every 10": {"signals_every": 10},
}
CONFIGS["every 100"] = {"signals_every": 100}


def bench(url: str, layers: int, width: int, rounds: int, per_round: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])
    x, y = torch.randn(64, width), torch.randn(64, width)
    runs = {}
    for name, kwargs in CONFIGS.items():
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        run = None
        if kwargs is not None:
            run = gradwatch.init(project="bench", name=f"signals-{name}", server=url)
            run.watch(model, opt, **kwargs)
        runs[name] = (run, opt)
    times: dict = {name: [] for name in runs}
    for run, opt in runs.values():
        steps(model, opt, x, y, 5, run)  # warm-up
    for _ in range(rounds * per_round):  # one step each in turn: load on a shared machine hits all alike
        for name, (run, opt) in runs.items():
            times[name] += steps(model, opt, x, y, 1, run)
    for run, _ in runs.values():
        if run is not None:
            run.finish(timeout=60)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a noisier number)")
    args = ap.parse_args()
    rounds, per_round = (4, 15) if args.quick else (10, 30)
    torch.set_num_threads(1)  # one thread: steadier medians on a shared machine
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(f"sqlite:///{tmp}/bench.db")
        try:
            print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Adam; server in its own process")
            for layers, width in ((24, 256), (8, 1024)):
                med = bench(server.url, layers, width, rounds, per_round)
                base = med["plain"]
                cells = ", ".join(f"{k} {v * 1e3:.2f} ms ({v / base:.2f}x)" for k, v in med.items())
                print(f"MLP {layers} x {width}: {cells}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
