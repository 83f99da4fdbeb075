"""watch() on the CUDA path, with the one thing this machine lacks (a GPU) faked at torch.cuda."""

from __future__ import annotations

import types

import pytest
import torch

import gradwatch
from training import mlp, regression_data

GIB = 2**30


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda answers like an 80 GiB device whose reserved memory grows 4 GiB per step."""
    counters = {"step": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="Fake GPU", total_memory=80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: (2 + counters["step"]) * GIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: (4 + 4 * counters["step"]) * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: (3 + counters["step"]) * GIB)
    return counters


def test_cuda_memory_counters_are_recorded_and_pressure_alerts(server, api, fake_gpu):
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = gradwatch.init(project="gpu", name="fake", server=server.url)
    run.watch(model, opt)
    run._watcher.device = torch.device("cuda")  # the model is on CPU; its watcher reads the (faked) CUDA counters
    x, y = regression_data()
    for step in range(25):
        fake_gpu["step"] = step
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    run.finish()
    meta = api.get("/api/runs/1")["meta"]
    assert meta["device"] == "cuda:0 Fake GPU" and meta["cuda_total_memory"] == 80 * GIB
    keys = api.get("/api/runs/1/keys")
    assert {"memory/cuda_allocated", "memory/cuda_reserved", "memory/cuda_peak"} <= set(keys)
    assert "memory/rss" not in keys
    reserved = api.get("/api/runs/1/series?key=memory/cuda_reserved")["values"]
    assert reserved == [float((4 + 4 * s) * GIB) for s in range(25)]
    # 95% of 80 GiB is 76 GiB: reserved reaches 76 GiB at step 18; one alert for the episode.
    alerts = [a for a in api.get("/api/runs/1/alerts") if a["kind"] == "memory_pressure"]
    assert [a["step"] for a in alerts] == [18] and alerts[0]["severity"] in ("warning", "critical")
    state = api.get("/api/runs/1/series?key=memory/optimizer_state")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    n = len(list(model.parameters()))
    # Adam keeps two moments per parameter plus a 4-byte step counter per tensor; nothing before step 1.
    assert state["steps"][:2] == [0, 1] and state["values"][:2] == [0.0, 2 * params + 4 * n]
