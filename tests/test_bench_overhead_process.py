"""bench_overhead_process.py --quick keeps working: whole training processes, bare against instrumented, a real server."""

from __future__ import annotations

import re

from conftest import run_benchmark


def test_quick_mode_times_bare_and_instrumented_processes_beside_a_server_on_the_same_cores():
    stdout = run_benchmark("bench_overhead_process.py", "--quick", timeout=600)
    rows = [line for line in stdout.splitlines() if re.match(r"\| (same cores|elsewhere)", line)]
    assert rows and all(r.startswith("| same cores") for r in rows)
    for row in rows:
        where, label, bare_ms, loop, wall = (c.strip() for c in row.strip("|").split("|"))
        ratio, lo, hi = (float(x) for x in re.findall(r"[\d.]+", loop))
        assert "watch()" in label and float(bare_ms) > 0
        assert lo <= ratio <= hi and 0.2 < ratio < 5  # a ratio of two real loops, not a placeholder
        assert 0.2 < float(wall) < 5
