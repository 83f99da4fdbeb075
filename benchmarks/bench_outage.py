"""What a server outage costs the training thread, and what log() and finish() cost.

Run: .venv/bin/python benchmarks/bench_outage.py [--quick]

1. A watched torch model trains at ~500 steps/s against a real `gradwatch serve` process, which is
   SIGKILLed mid-run; every log() call is timed, and every garbage collection is recorded with
   its generation, duration and whether it ran inside log(). Numbers before / during the outage.
2. log() cost on an idle link (one scalar, five scalars).
3. finish() of a run that logged N steps as fast as Python can call log() (default 1M).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch
from torch import nn

import gradwatch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from server_process import ServerProcess  # noqa: E402

QUICK = "--quick" in sys.argv


class GcLog:
    """Every collection: (generation, seconds, ran on the training thread inside log())."""

    def __init__(self):
        self.events: list = []
        self.in_log = False
        self._start = 0.0
        self._main = threading.main_thread()

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            inside = self.in_log and threading.current_thread() is self._main
            self.events.append((info["generation"], time.perf_counter() - self._start, inside))


def outage(url: str, server: ServerProcess, seconds: float) -> None:
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(8)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    run = gradwatch.init(project="bench", name="outage", server=url, flush_interval=0.05)
    run.watch(model, opt)
    x = torch.randn(16, 32)
    gclog = GcLog()
    gc.callbacks.append(gclog)
    times = {"before": [], "during": []}
    gcs = {"before": [], "during": []}
    phase, start, killed_at = "before", time.perf_counter(), None
    try:
        while time.perf_counter() - start < seconds:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            gclog.in_log = True
            t0 = time.perf_counter()
            run.log({"loss": loss, "acc": 0.5})
            times[phase].append(time.perf_counter() - t0)
            gclog.in_log = False
            gcs[phase] += gclog.events
            gclog.events = []
            if killed_at is None and time.perf_counter() - start > seconds / 3:
                server.kill()
                killed_at, phase = time.perf_counter(), "during"
            time.sleep(0.002)
    finally:
        gc.callbacks.remove(gclog)
    t0 = time.perf_counter()
    run.finish(timeout=5)
    finish_s = time.perf_counter() - t0
    for name, values in times.items():
        ms = sorted(v * 1000 for v in values)
        in_log = [(g, d) for g, d, inside in gcs[name] if inside]
        full = [d for g, d, _ in gcs[name] if g == 2]
        print(
            f"  {name:6} outage: {len(ms):6} log() calls  median {statistics.median(ms):.3f} ms  "
            f"p99 {ms[int(len(ms) * 0.99)]:.3f} ms  worst {ms[-1]:.2f} ms  | gen-2 collections {len(full)}"
            f"{f' (longest {max(full) * 1000:.0f} ms)' if full else ''}, collections inside log() {len(in_log)}"
            f"{f' (longest {max(d for _, d in in_log) * 1000:.1f} ms)' if in_log else ''}"
        )
    print(f"  finish() with the server gone: {finish_s:.2f} s (spooled)")


def log_cost(url: str) -> None:
    run = gradwatch.init(project="bench", name="cost", server=url)
    for data in ({"loss": 0.5}, {"loss": 0.5, "acc": 0.9, "lr": 1e-3, "tokens": 1024.0, "epoch": 1.0}):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(20_000):
                run.log(data)
            best = min(best, (time.perf_counter() - t0) / 20_000)
        print(f"  log() of {len(data)} scalar(s): {best * 1e6:.2f} us per call")
    run.finish(timeout=30)


def big_finish(url: str, steps: int) -> None:
    run = gradwatch.init(project="bench", name=f"{steps}-steps", server=url)
    t0 = time.perf_counter()
    for i in range(steps):
        run.log({"loss": 1.0 / (i + 1)})
    loop = time.perf_counter() - t0
    t1 = time.perf_counter()
    run.finish(timeout=30)
    done = time.perf_counter() - t1
    with urllib.request.urlopen(f"{url}/api/runs/{run.id}", timeout=30) as resp:
        last = __import__("json").loads(resp.read())["last_step"]
    print(
        f"  {steps:,} steps: loop {loop:.2f} s ({steps / loop:,.0f} log()/s), finish() {done:.2f} s, "
        f"stored up to step {last} (expected {steps - 1})"
    )


def main() -> None:
    torch.set_num_threads(1)  # the sender and the server share the machine
    print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GRADWATCH_SPOOL_DIR"] = str(Path(tmp) / "spool")
        server = ServerProcess(f"sqlite:///{Path(tmp) / 'b.db'}")
        print("1. server SIGKILLed mid-run (log() timed on the training thread):")
        outage(server.url, server, 6.0 if QUICK else 15.0)
        server = ServerProcess(f"sqlite:///{Path(tmp) / 'b.db'}")
        try:
            print("2. log() cost, idle link:")
            log_cost(server.url)
            print("3. finish() after logging as fast as Python can:")
            big_finish(server.url, 100_000 if QUICK else 1_000_000)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
