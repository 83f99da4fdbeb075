"""End to end: a real training loop streams to a real server; the data comes back exactly."""

from __future__ import annotations

import math

import pytest
import torch
from training import mlp, regression_data, train

import gradwatch


def test_training_run_round_trips_through_http_api(server, api):
    run = gradwatch.init(project="e2e", name="baseline", config={"lr": 0.05, "nested": {"depth": 2}}, server=server.url)
    model = train(run, steps=40)
    # Explicit steps: without step=, a log() after watch(model, opt) belongs to the last optimizer step (39).
    run.log({"loss": float("nan")}, step=40)
    run.log({"loss": torch.tensor(float("inf"))}, step=41)
    run.log({"loss": -math.inf, "acc": torch.tensor(0.5, dtype=torch.float16)}, step=42)
    run.finish()

    runs = api.get("/api/runs")
    assert [r["name"] for r in runs] == ["baseline"]
    summary = runs[0]
    assert summary["status"] == "finished" and summary["last_step"] == 42
    detail = api.get(f"/api/runs/{summary['id']}")
    assert detail["config"] == {"lr": 0.05, "nested": {"depth": 2}}
    assert detail["meta"]["pid"] > 0 and detail["meta"]["torch"] == torch.__version__

    keys = api.get(f"/api/runs/{summary['id']}/keys")
    names = [n for n, p in model.named_parameters()]
    assert {"loss", "lr", "grad/global_norm", "memory/rss"} <= set(keys)
    assert all(f"grad/{n}" in keys for n in names)

    loss = api.get(f"/api/runs/{summary['id']}/series?key=loss")
    assert loss["steps"] == list(range(43))
    assert loss["values"][-3:] == ["NaN", "Infinity", "-Infinity"]
    assert all(isinstance(v, float) for v in loss["values"][:40])
    assert len(loss["wall_times"]) == 43

    lr = api.get(f"/api/runs/{summary['id']}/series?key=lr")
    assert set(lr["values"]) == {0.05} and len(lr["values"]) == 40


def test_gradient_norms_match_torch(server, api):
    """The per-layer and global norms stored equal what torch computes for the same grads."""
    torch.manual_seed(1)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = gradwatch.init(project="e2e", name="norms", server=server.url)
    run.watch(model, opt)
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    loss.backward()
    expected = {n: p.grad.norm().item() for n, p in model.named_parameters()}
    total = torch.sqrt(sum(p.grad.norm() ** 2 for p in model.parameters())).item()
    opt.step()
    run.log({"loss": loss})
    run.finish()
    run_id = api.get("/api/runs")[0]["id"]
    for name, value in expected.items():
        got = api.get(f"/api/runs/{run_id}/series?key=grad/{name}")["values"]
        assert math.isclose(got[0], value, rel_tol=1e-5), name
    got_total = api.get(f"/api/runs/{run_id}/series?key=grad/global_norm")["values"][0]
    assert math.isclose(got_total, total, rel_tol=1e-5)


def test_missing_gradients_are_null_not_nan(server, api):
    """A parameter whose .grad is None is stored as null (no value), distinct from NaN."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = gradwatch.init(project="e2e", name="missing", server=server.url)
    run.watch(model, opt)
    for _ in range(3):
        hidden = model[0](torch.randn(8, 4)).detach()  # cuts the graph: layer 0 gets no grad
        loss = model[2](torch.relu(hidden)).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    run.finish()
    run_id = api.get("/api/runs")[0]["id"]
    assert api.get(f"/api/runs/{run_id}/series?key=grad/0.weight")["values"] == [None, None, None]
    assert all(isinstance(v, float) for v in api.get(f"/api/runs/{run_id}/series?key=grad/2.weight")["values"])
    assert api.get(f"/api/runs/{run_id}/series?key=grad/missing_count")["values"] == [
        4.0,
        4.0,
        4.0,
    ]  # layers 0 and 4 (unused)


def test_watch_without_optimizer_records_after_each_backward(server, api):
    model = mlp()
    run = gradwatch.init(project="e2e", name="manual", server=server.url)
    run.watch(model)
    for _ in range(5):
        loss = model(torch.randn(4, 4)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        run.log({"loss": loss})
    run.finish()
    run_id = api.get("/api/runs")[0]["id"]
    assert api.get(f"/api/runs/{run_id}/series?key=grad/global_norm")["steps"] == [0, 1, 2, 3, 4]


def test_amp_scaled_gradients_are_recorded_unscaled(server, api):
    """Without an optimizer the hooks see scaled grads; the recorded norms must be the true ones."""
    model = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    run = gradwatch.init(project="e2e", name="amp-manual", server=server.url)
    run.watch(model, scaler=scaler)
    x, y = regression_data()
    expected = []
    for _ in range(4):
        model.zero_grad()
        scaler.scale(((model(x) - y) ** 2).mean()).backward()
        grads = [p.grad / 2.0**16 for p in model.parameters()]
        expected.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p -= 0.01 * g
        run.log({"loss": 0.0})
    run.finish()
    got = api.get("/api/runs/1/series?key=grad/global_norm")["values"]
    assert got == pytest.approx(expected, rel=1e-4)


def test_unknown_run_and_key_are_json_404(server, api):
    status, body = api.request("GET", "/api/runs/999")
    assert status == 404 and "not found" in body["error"]
    run = gradwatch.init(project="e2e", name="k", server=server.url)
    run.log({"loss": 1.0})
    run.finish()
    status, body = api.request("GET", "/api/runs/1/series?key=nope")
    assert status == 404 and "nope" in body["error"]
    for path in (
        "/api/runs/999/keys",
        "/api/runs/999/alerts",
        "/api/runs/999/series?key=loss",
        "/api/runs/999/heatmap",
    ):
        assert api.request("GET", path)[0] == 404, path


def test_bad_parameters_get_a_one_line_error_and_change_nothing(server, api):
    run = gradwatch.init(project="e2e", name="params", server=server.url)
    for i in range(20):
        run.log({"loss": 1.0 / (i + 1)})
    run.finish()
    cases = {
        "/api/runs/1/series?key=loss&max_points=2": (422, "max_points"),
        "/api/runs/1/series?key=loss&max_points=abc": (422, "max_points"),
        "/api/runs/1/series": (422, "key"),
        "/api/runs/abc": (422, "run_id"),
        "/api/runs/99999999999999999999999": (400, "out of range"),
        "/api/runs/1/series?key=loss&start=99999999999999999999999": (400, "out of range"),
        "/api/compare?ids=1,x": (400, "comma-separated"),
    }
    for path, (code, words) in cases.items():
        status, body = api.request("GET", path)
        assert status == code and words in body["error"], (path, status, body)
    status, body = api.request("PATCH", "/api/runs/1", {"tags": "not a list"})
    assert status in (400, 422) and body["error"]
    empty = api.get("/api/runs/1/series?key=loss&start=15&end=5")
    assert empty["steps"] == [] and empty["total_points"] == 0
    assert api.get("/api/runs/1/series?key=loss")["steps"] == list(range(20))
    assert api.get("/api/runs/1")["tags"] == []


def test_explicit_steps_and_module_level_api(server, api):
    gradwatch.init(project="e2e", name="module", server=server.url)
    gradwatch.log({"loss": 3.0}, step=10)
    gradwatch.log({"loss": 2.0})
    gradwatch.log({"loss": 1.0, "bad": "text", "vec": torch.ones(3)})  # bad values are skipped, not raised
    gradwatch.finish()
    series = api.get("/api/runs/1/series?key=loss")
    assert series["steps"] == [10, 11, 12] and series["values"] == [3.0, 2.0, 1.0]
    assert "bad" not in api.get("/api/runs/1/keys")
