"""bench_series.py keeps working on a small run: every chart read timed, its spike, NaN and inf kept in view."""

from __future__ import annotations

import re

from conftest import run_benchmark


def test_small_noisy_run_times_every_read_and_keeps_the_spike_nan_and_inf_in_view():
    stdout = run_benchmark("bench_series.py", "--steps", "3000", "--vector-steps", "3000", "--noisy", timeout=300)
    assert "spike, NaN and inf all in the whole-run view: True" in stdout
    assert "300-layer noisy norms" in stdout
    rows = [line for line in stdout.splitlines() if re.match(r"\| (loss|one layer|heatmap)", line)]
    assert len(rows) == 6
    for row in rows:
        ours = float(row.strip("|").split("|")[1])
        assert ours > 0  # a real read was timed (the raw scan of a tiny range may round to 0.0 ms)
