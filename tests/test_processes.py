"""Real training processes: many at once lose nothing; a killed one is marked crashed."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Api
from waiting import wait_until

from gradwatch_server.cli.sync import sync
from gradwatch_server.serve import BackgroundServer

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(url, name, steps, *extra):
    env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, str(HERE / "worker_train.py"), url, name, str(steps), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_concurrent_training_processes_each_keep_every_point(server, api):
    procs = [_worker(server.url, f"job-{i}", 300) for i in range(4)]  # 4 on 2 cores: concurrent enough
    errors = []
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        errors.append(err)
    runs = {r["name"]: r for r in api.get("/api/runs")}
    assert sorted(runs) == [f"job-{i}" for i in range(4)]
    for run in runs.values():
        assert run["status"] == "finished" and run["last_step"] == 299
        series = api.get(f"/api/runs/{run['id']}/series?key=step_seen")
        assert series["steps"] == list(range(300)), errors  # the workers' stderr says if they reconnected
        assert series["values"] == [float(i) for i in range(300)]
        assert api.get(f"/api/runs/{run['id']}/heatmap?max_steps=1000")["steps"] == list(range(300))


@pytest.mark.slow
def test_killed_training_process_is_marked_crashed(settings):
    srv = BackgroundServer(dataclasses.replace(settings, crash_timeout=1.0)).start()
    try:
        api = Api(srv.url)
        proc = _worker(srv.url, "doomed", 50, "hang")
        assert proc.stdout.readline().strip() == "logged"
        assert api.get("/api/runs/1")["status"] == "running"
        proc.kill()  # SIGKILL: no atexit, no finish(), like the OOM killer
        proc.wait(10)
        run = _wait_status(api, "crashed")
        assert run["status"] == "crashed" and run["last_step"] == 49
        assert api.get("/api/runs/1/series?key=loss")["steps"] == list(range(50))  # nothing logged is lost
    finally:
        srv.stop()


def _wait_status(api, status, run_id=1, seconds=20.0):
    """The run once it has ``status`` (the API's answer then)."""
    return wait_until(
        lambda: (run := api.get(f"/api/runs/{run_id}"))["status"] == status and run,
        timeout=seconds,
        message=lambda: f"run {run_id} is {api.get(f'/api/runs/{run_id}')['status']}, never {status}",
    )


def test_sigterm_delivers_everything_then_dies_of_sigterm(server, api):
    proc = _worker(server.url, "preempted", 400, "wait")
    assert proc.stdout.readline().strip() == "logged"  # logged, nothing flushed on purpose
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - start < 6, err
    assert proc.returncode == -signal.SIGTERM, err  # the default outcome, as without gradwatch
    assert api.get("/api/runs/1/series?key=step_seen")["steps"] == list(range(400))
    assert _wait_status(api, "failed")["status"] == "failed"


def test_sigterm_without_a_server_spools_everything_and_sync_delivers_it(settings, tmp_path):
    port = free_port()
    spool_root = tmp_path / "spool"
    proc = _worker(f"http://127.0.0.1:{port}", "offline-term", 300, "wait")
    assert proc.stdout.readline().strip() == "logged"
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - start < 5, err
    assert proc.returncode == -signal.SIGTERM
    assert "gradwatch sync" in err and str(spool_root) in err
    srv = BackgroundServer(dataclasses.replace(settings, port=port)).start()
    try:
        assert sync(None, srv.url) == 0
        api = Api(srv.url)
        assert api.get("/api/runs/1/series?key=step_seen")["steps"] == list(range(300))
        assert not list(spool_root.iterdir())  # delivered spools are removed
    finally:
        srv.stop()


def test_ctrl_c_keeps_everything_and_the_interrupt_propagates(server, api):
    proc = _worker(server.url, "interrupted", 300, "wait")
    assert proc.stdout.readline().strip() == "logged"
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - start < 6, err
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err  # Python's own outcome of Ctrl-C
    assert api.get("/api/runs/1/series?key=step_seen")["steps"] == list(range(300))


def test_a_run_that_never_reached_a_server_spools_within_about_a_second(tmp_path):
    proc = _worker(f"http://127.0.0.1:{free_port()}", "never", 100)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.count("cannot reach the server") == 1  # said once, early
    assert "gradwatch sync" in err


def test_forked_child_never_sends_finishes_or_spills_the_parents_run(server, api, tmp_path):
    proc = _worker(server.url, "forking", 50, "fork")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "child exit 0" in out
    run = api.get("/api/runs/1")
    assert run["status"] == "finished" and run["last_step"] == 49  # nothing from the child
    assert api.get("/api/runs/1/series?key=loss")["steps"] == list(range(50))
    assert not (tmp_path / "spool").exists() or not list((tmp_path / "spool").rglob("0*.json"))
