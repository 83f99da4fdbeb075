"""Run states people can trust: stalled while connected and silent, crashed when gone, and a watcher
that outlives a database error."""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import Api, wait_runs
from waiting import wait_until

import gradwatch
from gradwatch_server.serve import BackgroundServer


def _wait_status(api: Api, run_id: int, status: str, timeout: float = 30) -> None:
    wait_until(
        lambda: api.get(f"/api/runs/{run_id}")["status"] == status,
        timeout=timeout,
        interval=0.1,
        message=f"run {run_id} never became {status}",
    )


def test_a_silent_but_connected_run_is_stalled_then_running_again(settings):
    srv = BackgroundServer(dataclasses.replace(settings, crash_timeout=1.0)).start()
    try:
        api = Api(srv.url)
        run = gradwatch.init(project="p", name="hangs", server=srv.url)
        for step in range(50):
            run.log({"loss": 1.0 / (step + 1)})
            time.sleep(0.01)  # a steady ~100 steps/s, then nothing: a hung collective
        wait_runs(api)
        run_id = api.get("/api/runs")[0]["id"]
        _wait_status(api, run_id, "stalled")
        alerts = api.get(f"/api/runs/{run_id}/alerts")
        assert [a["kind"] for a in alerts] == ["stalled"] and "py-spy" in alerts[0]["message"]
        run.log({"loss": 0.01})  # it comes back
        _wait_status(api, run_id, "running")
        run.finish()
        _wait_status(api, run_id, "finished")
    finally:
        srv.stop()


def test_the_crash_watcher_survives_a_database_error(settings, tmp_path):
    srv = BackgroundServer(dataclasses.replace(settings, crash_timeout=1.0)).start()
    try:
        api = Api(srv.url)
        path = settings.db.split("///", 1)[1]
        con = sqlite3.connect(path)
        con.execute("ALTER TABLE runs RENAME TO runs_away")  # every check of the watcher now fails
        con.commit()
        time.sleep(1.5)
        con.execute("ALTER TABLE runs_away RENAME TO runs")
        con.commit()
        con.close()
        # A training process that dies hard: its connection goes, nothing finishes the run.
        code = (
            "import gradwatch, os, signal, time; run = gradwatch.init(project='p', name='vanishes', "
            f"server='{srv.url}'); run.log({{'loss': 1.0}}); time.sleep(1.5); "
            "os.kill(os.getpid(), signal.SIGKILL)"
        )
        proc = subprocess.run([sys.executable, "-c", code], env={**os.environ}, timeout=60)
        assert proc.returncode == -signal.SIGKILL
        wait_runs(api)
        run_id = api.get("/api/runs")[0]["id"]
        _wait_status(api, run_id, "crashed")
    finally:
        srv.stop()
