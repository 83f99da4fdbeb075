"""bench_sparse_levels.py --quick keeps working: a sparse key's file is smaller with the levels this release keeps."""

from __future__ import annotations

import re

from conftest import run_benchmark


def test_quick_mode_compares_the_files_and_reads_of_each_choice_of_levels():
    stdout = run_benchmark("bench_sparse_levels.py", "--quick", timeout=300)
    rows = {m[1]: int(m[2].replace(",", "")) for m in re.finditer(r"^\| ([^|]+?) \| ([\d,]+) \|", stdout, re.M)}
    assert list(rows) == ["every level (before 0011)", "MIN_POINTS 4 (now)", "MIN_POINTS 8"]
    before, now, fewer = rows.values()
    assert fewer < now < before  # each level a sparse key drops is bytes saved
