"""``gradwatch demo`` end to end: real training runs, its own database, a run that visibly diverges."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys

import pytest

from gradwatch_server.cli import demo

DIVERGENCE = {"loss_divergence", "loss_spike", "exploding_gradients", "nan_loss"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_demo_streams_real_training_into_its_own_database(tmp_path):
    port = free_port()
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}  # where the user's default database lives
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradwatch_server.cli",
            "demo",
            "--port",
            str(port),
            "--steps",
            "120",
            "--delay",
            "0",
            "--exit",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    db = tmp_path / "data" / "gradwatch" / "demo.db"
    assert f"http://127.0.0.1:{port}" in proc.stdout and str(db) in proc.stdout  # says where
    assert not (tmp_path / "data" / "gradwatch" / "gradwatch.db").exists()  # the user's database is untouched
    con = sqlite3.connect(db)
    statuses = dict(con.execute("select name, status from runs"))
    assert statuses == {name: "finished" for name, *_ in demo.RUNS}
    kinds = {}
    for name, kind in con.execute("select r.name, a.kind from runs r join alerts a on a.run_id = r.id"):
        kinds.setdefault(name, set()).add(kind)
    assert kinds.get("lr ramp (diverges)", set()) & DIVERGENCE  # the diverging run is flagged for it
    assert not kinds.get("baseline adam lr=3e-3", set()) & DIVERGENCE
    keys = {k for (k,) in con.execute("select key from metric_keys")}
    assert {"loss", "val/loss", "val/accuracy", "train/accuracy", "train/samples_per_s", "lr"} <= keys
    meta = json.loads(con.execute("select config from runs where name = 'sgd constant lr=0.05'").fetchone()[0])
    assert meta["schedule"] == "constant"


def test_the_ramp_run_blows_up_by_orders_of_magnitude():
    """The diverging run's learning rate: healthy first, then ~1000x over a few hundred steps."""
    assert demo.lr_factor("ramp", 0, 6000) == 1.0 and demo.lr_factor("ramp", 200, 6000) == 1.0
    assert demo.lr_factor("ramp", 550, 6000) == pytest.approx(1000)
    assert demo.lr_factor("ramp", 100, 120) > 100  # a short test demo still diverges
    assert demo.lr_factor("constant", 5000, 6000) == 1.0
