"""The same end-to-end path on a real PostgreSQL server (a throwaway cluster started here)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import Api
from training import train

import gradwatch
from gradwatch_server.serve import BackgroundServer

pytestmark = pytest.mark.slow


def test_training_run_on_postgres(settings, postgres_url):
    srv = BackgroundServer(dataclasses.replace(settings, db=postgres_url)).start()
    try:
        run = gradwatch.init(project="pg", name="on-postgres", server=srv.url, config={"db": "pg"})
        train(run, steps=30)
        run.log({"loss": float("nan")}, step=30)  # explicit: without step= it would join optimizer step 29
        run.log({"loss": torch.tensor(float("-inf"))}, step=31)
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
