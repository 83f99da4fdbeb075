"""The loss_plateau rule (server/health/stuck.py): a loss that never falls gets a gentle warning, once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import wait_runs

import gradwatch
from gradwatch_server.health.monitor import Monitor

TH = {"loss_plateau.patience": 60}


def _noisy(start: float, end: float, n: int = 100) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.linspace(start, end, n) + rng.normal(0, 0.02, n)


def _one_by_one(values) -> list:
    m = Monitor(TH)
    return [a for i, v in enumerate(values) for a in m.observe(i, {"loss": float(v)}, {})]


def _in_batches(values, size: int = 7) -> list:
    m, out = Monitor(TH), []
    for lo in range(0, len(values), size):
        chunk = values[lo : lo + size]
        steps = np.arange(lo, lo + len(chunk))
        out += m.observe_batch(steps, {"loss": (np.arange(len(chunk)), np.asarray(chunk))}, {})
    return out


@pytest.mark.parametrize("path", [_one_by_one, _in_batches])
def test_a_flat_loss_is_flagged_once_at_patience_and_a_falling_one_never(path):
    flat = path(_noisy(0.69, 0.69))  # a binary classifier at chance for its whole life
    assert [(a.kind, a.step, a.severity) for a in flat] == [("loss_plateau", 59, "warning")]
    assert "has not fallen in 60 values" in flat[0].message
    assert path(_noisy(2.3, 1.9)) == []  # learning, slowly
    assert path(_noisy(0.5, 0.5)[:59]) == []  # not enough values for a verdict yet
    assert not [a for a in path(_noisy(1.0, 3.0)) if a.kind == "loss_plateau"]  # rising far: not a plateau


def _train(lr: float, steps: int = 80):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(256, 10)
    y = (x[:, 0] > 0).long()
    run = gradwatch.init(project="stuck", name=f"lr{lr}", alerts=TH)
    run.watch(model, opt)
    for i in range(steps):
        idx = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    run.finish(timeout=10)


def test_a_real_run_that_does_not_learn_is_warned_and_one_that_does_is_not(server, api, monkeypatch):
    monkeypatch.setenv("GRADWATCH_SERVER", server.url)
    _train(lr=1e-6)  # far too small to move: the loss sits where it started
    _train(lr=0.5)
    wait_runs(api, 2)
    runs = {r["name"]: r["id"] for r in api.get("/api/runs")}
    stuck = [a for a in api.get(f"/api/runs/{runs['lr1e-06']}/alerts") if a["kind"] == "loss_plateau"]
    assert len(stuck) == 1 and stuck[0]["step"] == 59 and stuck[0]["severity"] == "warning"
    assert not [a for a in api.get(f"/api/runs/{runs['lr0.5']}/alerts") if a["kind"] == "loss_plateau"]
