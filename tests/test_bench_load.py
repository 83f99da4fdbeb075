"""bench_load.py --quick keeps working: a real server, simulated live runs, a page timing the points."""

from __future__ import annotations

import re

from conftest import run_benchmark


def test_quick_mode_measures_cpu_latency_memory_and_stores_every_step_once(tmp_path):
    stdout = run_benchmark("bench_load.py", "--quick", timeout=120)
    assert "command: " in stdout and "cores" in stdout
    row = next(line for line in stdout.splitlines() if re.match(r"\| \d+ \(\d+ real\)", line))
    cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
    runs, rate, achieved, cpu, per_step, per_batch, latency, rss, behind, bad = cells
    assert runs.startswith("4 ") and float(rate) == 10
    assert float(achieved) > 8  # the simulated runs kept (about) their rate
    assert float(per_step) > 0 and float(cpu.rstrip(" %")) > 0  # the server's CPU was read from /proc
    p50, p99 = (float(x) for x in latency.split("/"))
    assert 0 < p50 <= p99 < 5000  # the page saw the points
    assert float(rss) > 20 and float(per_batch) >= 1 and float(behind) >= 0
    assert bad == "0"  # every run's steps stored exactly once
