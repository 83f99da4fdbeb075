"""benchmarks/side_by_side.py: a git revision's code really runs in the old column, and figures pair up."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from conftest import run_benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import side_by_side  # noqa: E402


def test_each_number_becomes_old_to_new_medians_and_agreeing_ones_print_once():
    lines = ["| 20 runs | **0.48** ms | 1,024 B |", "| 20 runs | **0.52** ms | 1,024 B |"]
    old = side_by_side.figures([[lines[0]], [lines[1]]])
    new = side_by_side.figures([["| 20 runs | **0.39** ms | 1,024 B |"]])
    (key,) = new
    assert side_by_side.merged_line(key[0], old[key], new[key]) == "| 20 runs | **0.50 -> 0.39** ms | 1,024 B |"
    assert side_by_side.NUM.findall("Python 3.11.7 on x86_64, p50 3 / 7, 1e-05") == ["3", "7", "1e-05"]


def test_the_baseline_column_imports_gradwatch_from_the_extracted_revision():
    stdout = run_benchmark("side_by_side.py", "--baseline", "HEAD", "bench_load.py", "--quick", timeout=300)
    old = re.search(r"^old: HEAD \(gradwatch from (\S+) (\S+)\)", stdout, re.M)
    assert old and "/tree/client_hook/" in old[1] and "/tree/server/" in old[2], stdout
    assert str(Path(__file__).resolve().parent.parent / "client_hook") in stdout  # the new column: this tree
    row = next(line for line in stdout.splitlines() if line.startswith("| 4 (0 real)"))
    assert "exactly once" in stdout and row.rstrip().endswith("| 0 |"), row  # both trees stored every step once


def test_new_scripts_runs_one_driver_from_the_given_folder_in_the_old_trees_folder(tmp_path):
    old_tree, driver = tmp_path / "old", tmp_path / "driver"
    for folder in (old_tree, driver):
        (folder / "benchmarks").mkdir(parents=True)
    (driver / "benchmarks" / "probe.py").write_text("import os, sys\nprint(__file__, os.getcwd(), sys.argv[1:])\n")
    lines, _load = side_by_side.run_once(old_tree, {}, ["probe.py", "--x"], scripts=driver)
    assert lines == [f"{driver / 'benchmarks' / 'probe.py'} {old_tree} ['--x']"]
    missing, _load = side_by_side.run_once(old_tree, {}, ["probe.py"])  # without: the old tree's own (none)
    assert "exited" in missing[0]
