"""Runs one measurement for one tool inside that tool's own virtualenv; prints ``RESULT {json}``.

Run by bench_peers.py as ``<venv>/bin/python benchmarks/peers/worker.py TOOL TASK SIZE ROOT``.
Every task drives the tool only through ``base.Tool``, so each tool gets exactly the same calls.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
from pathlib import Path

# import `peers` as a package; this folder itself stays off sys.path so that nothing in it can ever
# shadow a tool's own top-level package
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from peers.base import wait_until  # noqa: E402

KEYS = ["loss", "acc", "lr", "grad_norm", "throughput"]  # the 5 scalars of a typical log() call


def metrics(step: int) -> dict:
    return {k: 1.0 / (1 + step) + j for j, k in enumerate(KEYS)}


def log_cost(tool, n: int) -> dict:
    """Mean µs per log() of 5 scalars on the calling (training) thread, background work included."""
    tool.open("logcost")
    for s in range(200):  # warm-up: first calls pay for lazy imports and connections
        tool.log(metrics(s), s)
    t0 = time.perf_counter()
    for s in range(200, 200 + n):
        tool.log(metrics(s), s)
    value = (time.perf_counter() - t0) / n * 1e6
    tool.close()
    return {"value": value}


def train_loop(tool, steps: int, block: int = 10) -> dict:
    """Step time of a small CPU MLP logging loss + 4 scalars each step vs the same loop without.

    Blocks of ``block`` steps alternate A B B A (A: log() replaced by a no-op, B: logging), all
    while the run is open, so drift of the shared machine hits both alike; ``steps`` logged steps in
    all. Overhead = the mean of the B/A ratios of each pair with the 10 % most extreme at each end
    dropped (bursts from other processes on the 2 shared cores, not the tool). Background work a tool started in a B block and finishes in the next A block is
    counted against the baseline, so this slightly favours tools that defer work.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)  # 2 shared cores: one thread keeps the loop's own time steady
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
    step = 0

    def run_block(log) -> float:
        nonlocal step
        t0 = time.perf_counter()
        for _ in range(block):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            log({"loss": loss.item(), "acc": 0.5, "lr": 1e-3, "grad_norm": 1.0, "throughput": 32.0 * step}, step)
            step += 1
        return time.perf_counter() - t0

    def no_log(m, s):
        return None

    tool.open("loop")
    run_block(no_log), run_block(tool.log)  # warm-up of both paths
    ratios, plain = [], []
    for i in range(max(1, steps // block)):
        if i % 2 == 0:
            a = run_block(no_log)
            b = run_block(tool.log)
        else:
            b = run_block(tool.log)
            a = run_block(no_log)
        ratios.append(b / a)
        plain.append(a)
    tool.close()
    ratios.sort()
    cut = len(ratios) // 10
    kept = ratios[cut:len(ratios) - cut]
    return {"value": (sum(kept) / len(kept) - 1) * 100, "step_ms": statistics.median(plain) / block * 1e3}


def ingest(tool, n: int) -> dict:
    """Points/s from the first log() until every point is readable by the tool's reader; bytes/point."""
    tool.open("ingest")
    t0 = time.perf_counter()
    for s in range(n):
        tool.log(metrics(s), s)
    loop = time.perf_counter() - t0
    tool.close()
    wait_until(lambda: all(tool.visible(k, n - 1) for k in KEYS), 1800, 0.01)
    elapsed = time.perf_counter() - t0
    points = n * len(KEYS)
    return {"value": points / elapsed, "loop_s": loop, "bytes_per_point": tool.stored_bytes() / points}


def latency(tool, n: int, rate: float = 10.0) -> dict:
    """Median ms from log() of one point to the tool's reader returning it, at ``rate`` steps/s."""
    tool.open("latency")
    tool.log({"x": 0.0}, 0)
    tool.flush_for_read()
    wait_until(lambda: tool.visible("x", 0), 120, 0.01)  # the key exists; readers are warm
    lat = []
    start = time.perf_counter()
    for s in range(1, n + 1):
        t0 = time.perf_counter()
        tool.log({"x": float(s)}, s)
        tool.flush_for_read()
        wait_until(lambda: tool.visible("x", s), 300, 0.002)
        lat.append((time.perf_counter() - t0) * 1e3)
        time.sleep(max(0.0, start + s / rate - time.perf_counter()))
    tool.close()
    return {"value": statistics.median(lat), "p90": sorted(lat)[max(0, int(len(lat) * 0.9) - 1)]}


def chart(tool, n: int, reads: int = 3) -> dict:
    """Seconds for a fresh reader to return all n points of one key (and gradwatch's 2000-point view)."""
    t0 = time.perf_counter()
    tool.bulk_write("x", n)
    write_s = time.perf_counter() - t0
    full, down = [], []
    for _ in range(reads):
        t = time.perf_counter()
        got = tool.read_series("x")
        full.append(time.perf_counter() - t)
        if got != n:
            raise RuntimeError(f"{tool.name} read {got} points of {n}")
        if tool.name == "gradwatch":
            t = time.perf_counter()
            tool.read_series("x", max_points=2000)
            down.append(time.perf_counter() - t)
    return {"values": full, "down": down, "write_s": write_s}


TASKS = {"logcost": log_cost, "loop": train_loop, "ingest": ingest, "latency": latency, "chart": chart}


def main() -> None:
    name, task, size, root = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    tool = importlib.import_module(f"peers.use_{name}").Tool(root)
    if task == "version":
        result = {"version": tool.version(), "visible": tool.visible_means}
    elif task in tool.not_applicable:
        result = {"na": tool.not_applicable[task]}
    else:
        result = TASKS[task](tool, size)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
