"""bench_storage.py --quick keeps working: realistic streams stored, read back bit-exact, smaller than 0.2's and the peers'."""

from __future__ import annotations

import re

from conftest import run_benchmark


def test_quick_mode_measures_bytes_per_value_now_and_as_0_2_stored_them():
    stdout = run_benchmark("bench_storage.py", "--quick", timeout=300)
    assert "read back bit-exact: True" in stdout
    rows = [line for line in stdout.splitlines() if re.match(r"\| [\d,]+ steps x", line)]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        old, now, ratio, board, track = float(cells[2]), float(cells[3]), float(cells[5]), cells[6], cells[7]
        assert now < old / 2 and ratio >= 2  # compressed blocks: at least half the bytes of raw ones
        assert board == "-" or float(board) > now  # TensorBoard's event file, when installed, is bigger
        assert track == "-" or float(track) > now  # trackio's SQLite files, when its venv is made, too
