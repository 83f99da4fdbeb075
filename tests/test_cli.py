"""The ``gradwatch`` command: serve from a subprocess, clear errors, demo end to end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0) -> bytes:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.read()
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def test_serve_uses_flags_and_env(tmp_path):
    port = free_port()
    env = {**os.environ, "GRADWATCH_DB": f"sqlite:///{tmp_path / 'env.db'}"}
    proc = subprocess.Popen([sys.executable, "-m", "gradwatch_server.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert json.loads(wait_http(f"http://127.0.0.1:{port}/healthz")) == {"status": "ok"}
        assert b"gradwatch" in wait_http(f"http://127.0.0.1:{port}/")
        assert len(wait_http(f"http://127.0.0.1:{port}/static/vendor/plotly.min.js")) > 1_000_000
        assert (tmp_path / "env.db").exists()
    finally:
        proc.terminate()
        proc.wait(10)


def test_bad_setting_is_a_one_line_error():
    out = subprocess.run([sys.executable, "-m", "gradwatch_server.cli", "serve", "--alerts", "not json"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "alerts must be a JSON object" in out.stderr


@pytest.mark.slow
def test_demo_streams_real_training(tmp_path):
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "gradwatch_server.cli", "demo", "--port", str(port), "--steps", "120",
                           "--delay", "0", "--exit", "--db", f"sqlite:///{tmp_path / 'demo.db'}"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert f"http://127.0.0.1:{port}" in proc.stdout
    import sqlite3

    con = sqlite3.connect(tmp_path / "demo.db")
    statuses = dict(con.execute("select name, status from runs"))
    assert statuses == {"baseline lr=3e-3": "finished", "too-high lr=3": "finished"}
    per_run = dict(con.execute("select r.name, count(a.id) from runs r left join alerts a on a.run_id = r.id "
                               "group by r.name"))
    assert per_run["too-high lr=3"] >= 1  # the diverging demo run is flagged
