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


def test_find_doubles_then_bisects_to_within_an_eighth_of_the_largest_n_held():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_load.py"
    spec = importlib.util.spec_from_file_location("bench_load_under_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    capacity, probed = 300, []

    def run(n):  # a server that holds up to ``capacity`` runs
        probed.append(n)
        p99 = 100.0 if n <= capacity else 900.0
        return {
            "runs": n,
            "real": 0,
            "rate": 10,
            "achieved": 10.0,
            "cpu_pct": 50,
            "cpu_ms_per_step": 0.5,
            "steps_per_batch": 2.0,
            "p50": 50,
            "p99": p99,
            "rss": 100,
            "behind_s": 0.0,
            "bad_runs": 0,
        }

    results = [run(20)]
    best = bench.find_largest(results, 20, run)
    assert best is not None and best <= capacity < best + max(1, best // 8) + 1
    assert probed[:5] == [20, 40, 80, 160, 320]  # doubled until one did not hold (20 measured once)
    assert len(probed) == len(set(probed))  # no N measured twice
