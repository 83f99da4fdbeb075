"""The same end-to-end path on a real PostgreSQL server (a throwaway cluster started here)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

import gradwatch
from conftest import Api
from gradwatch_server.serve import BackgroundServer
from training import train

pytestmark = pytest.mark.slow


def _as_user(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: use an unprivileged account for the throwaway cluster.
    return ["runuser", "-u", "nobody", "--"] + cmd if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def postgres_url():
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.fail("PostgreSQL server binaries (initdb, pg_ctl) are required for this test")
    # Not under pytest's tmp dir: that one is private to root, and the cluster runs as nobody.
    base = Path(tempfile.mkdtemp(prefix="gradwatch-pg-"))
    if os.geteuid() == 0:
        shutil.chown(base, "nobody")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = base / "data"
    subprocess.run(_as_user([initdb, "-D", str(data), "-U", "gw", "--auth=trust", "-E", "UTF8"]), check=True,
                   capture_output=True)
    subprocess.run(_as_user([pg_ctl, "-D", str(data), "-l", str(base / "log"), "-w", "-o",
                             f"-p {port} -k {base} -c listen_addresses=127.0.0.1", "start"]), check=True,
                   capture_output=True)
    try:
        yield f"postgresql://gw@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_user([pg_ctl, "-D", str(data), "-m", "fast", "stop"]), capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_training_run_on_postgres(settings, postgres_url):
    srv = BackgroundServer(dataclasses.replace(settings, db=postgres_url)).start()
    try:
        run = gradwatch.init(project="pg", name="on-postgres", server=srv.url, config={"db": "pg"})
        train(run, steps=30)
        run.log({"loss": float("nan")})
        run.log({"loss": torch.tensor(float("-inf"))})
        run.finish()
        api = Api(srv.url)
        run_id = [r for r in api.get("/api/runs") if r["name"] == "on-postgres"][0]["id"]
        loss = api.get(f"/api/runs/{run_id}/series?key=loss")
        assert loss["steps"] == list(range(32)) and loss["values"][-2:] == ["NaN", "-Infinity"]
        assert "grad/0.weight" in api.get(f"/api/runs/{run_id}/keys")
        assert [a["kind"] for a in api.get(f"/api/runs/{run_id}/alerts")] == ["nan_loss"]
        heat = api.get(f"/api/runs/{run_id}/heatmap")
        assert heat["layers"][0] == "0.weight" and len(heat["steps"]) == 30
        assert api.request("DELETE", f"/api/runs/{run_id}")[0] == 200
        assert api.request("GET", f"/api/runs/{run_id}")[0] == 404
    finally:
        srv.stop()
