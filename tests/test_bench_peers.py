"""bench_peers.py --quick keeps working with gradwatch alone (CI never installs the peers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ["trackio", "tensorboard", "mlflow", "wandb", "aim"]


def test_quick_mode_measures_gradwatch_and_reports_absent_peers(tmp_path):
    env = {**os.environ, "GRADWATCH_PEERS_VENV": str(tmp_path / "no-venvs"), "GRADWATCH_SPOOL_DIR": str(tmp_path)}
    out = tmp_path / "table.md"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_peers.py", "--quick", "--peers", "all", "--no-install", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    assert report.strip() == done.stdout.strip()  # --out writes what it prints
    assert "command: " in report and "cores" in report and "- gradwatch: " in report
    assert not (tmp_path / "no-venvs").exists()  # --no-install: nothing was created
    header = next(line for line in report.splitlines() if line.startswith("| |"))
    assert [c.strip() for c in header.strip("|").split("|")][1:] == ["gradwatch", *PEERS]
    rows = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    assert len(rows) == 7  # six rows plus gradwatch's downsampled chart read
    for row in rows[:6]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert re.fullmatch(r"[+-]?[\d,.]+( \[.*\])?", cells[1]), row  # gradwatch measured: a number
        assert cells[2:] == ["not installed"] * len(PEERS), row
    points_s = float(rows[2].split("|")[2].replace(",", "").split()[0])
    assert points_s > 100  # 2,500 points must not take more than 25 s to be readable over HTTP
