"""Real training processes: many at once lose nothing; a killed one is marked crashed."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Api
from gradwatch_server.serve import BackgroundServer

HERE = Path(__file__).resolve().parent


def _worker(url, name, steps, *extra):
    env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, str(HERE / "worker_train.py"), url, name, str(steps), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_concurrent_training_processes_each_keep_every_point(server, api):
    procs = [_worker(server.url, f"job-{i}", 300) for i in range(6)]
    errors = []
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        errors.append(err)
    runs = {r["name"]: r for r in api.get("/api/runs")}
    assert sorted(runs) == [f"job-{i}" for i in range(6)]
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
        for _ in range(100):
            if api.get("/api/runs/1")["status"] == "crashed":
                break
            time.sleep(0.1)
        run = api.get("/api/runs/1")
        assert run["status"] == "crashed" and run["last_step"] == 49
        assert api.get("/api/runs/1/series?key=loss")["steps"] == list(range(50))  # nothing logged is lost
    finally:
        srv.stop()
