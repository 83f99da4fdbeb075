"""``gradwatch demo`` end to end: real training runs, its own database, a run that visibly diverges."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import Api, wait_runs
from test_cli import wait_http

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


def test_a_run_gone_non_finite_and_flagged_stops_with_a_message(server, api, capsys):
    """The demo's diverging run ends once it is flagged and non-finite: a line on the terminal, no
    traceback, instead of thousands more steps until torch overflows."""
    import torch

    model = demo.make_model()
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")  # non-finite from the first step
    demo.train_quietly("poisoned", server.url, "poisoned", "SGD", 0.05, "constant", 5000, 0.0, model)
    out = capsys.readouterr()
    assert "'poisoned' went non-finite at step" in out.out and "stopped" in out.out
    assert "Traceback" not in out.out + out.err
    assert api.get("/api/runs/1")["last_step"] < 4999
    assert "nan_loss" in {a["kind"] for a in api.get("/api/runs/1/alerts")}


def test_a_failing_demo_run_is_one_line_not_a_traceback(server, capsys):
    demo.train_quietly("broken", server.url, "broken", "NoSuchOptimizer", 0.05, "constant", 10, 0.0, object())
    out = capsys.readouterr()
    assert "'broken' stopped:" in out.out and "Traceback" not in out.out + out.err


@pytest.mark.slow
def test_ctrl_c_ends_the_demo_at_once(tmp_path):
    port = free_port()
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    args = [sys.executable, "-m", "gradwatch_server.cli", "demo", "--port", str(port), "--steps", "100000"]
    proc = subprocess.Popen(
        args + ["--delay", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        for line in proc.stdout:  # the server is up once it says where
            if "open http" in line:
                break
        wait_http(f"http://127.0.0.1:{port}/api/runs")
        wait_runs(Api(f"http://127.0.0.1:{port}"), 2)  # runs streaming (the second starts ~4 s in)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - started < 8  # at once, not after the runs' or the sockets' timeouts
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
