"""A project's rules through a real server: validated, stored with who changed what, applied to a running run
from its next batch (its own init(alerts=...) still wins), and replayed on history before saving."""

from __future__ import annotations

import math
import time

import numpy as np

import gradwatch
from gradwatch_server.ingest.apply import load_state
from gradwatch_server.ingest.hello import open_run
from gradwatch_server.rules import policy
from gradwatch_server.storage import database


def _wait(fn, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        out = fn()
        if out:
            return out
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_rules_are_validated_stored_and_logged(server, api):
    got = api.get("/api/projects/p/rules")
    assert got["disabled"] == [] and got["custom"] == [] and got["updated_at"] is None
    assert got["defaults"]["loss_spike.factor"] == 10.0 and "loss_spike" in got["kinds"]
    for bad in (
        {"thresholds": {"loss_spike.factr": 3}},
        {"thresholds": {"loss_spike.factor": -1}},
        {"disabled": ["no_such_rule"]},
        {"severity": {"loss_spike": "loud"}},
        {"custom": [{"name": "x", "key": "acc", "type": "median"}]},
        {"custom": [{"name": "x", "key": "acc", "type": "n_of_m", "value": 1, "n": 5, "m": 3}]},
        {"custom": [{"name": "x", "key": "acc", "type": "threshold"}]},
        {"surprise": 1},
    ):
        status, body = api.request("PUT", "/api/projects/p/rules", bad)
        assert status == 400, (bad, body)
    doc = {
        "by": "ana",
        "disabled": ["loss_spike"],
        "thresholds": {"exploding_gradients.factor": 50},
        "severity": {"loss_divergence": "warning"},
        "custom": [{"name": "acc low", "key": "acc", "type": "threshold", "op": "<", "value": 0.5}],
    }
    status, body = api.request("PUT", "/api/projects/p/rules", doc)
    assert status == 200, body
    assert body["updated_by"] == "ana" and body["disabled"] == ["loss_spike"]
    lines = body["history"][0]["changes"]
    assert "loss_spike: off" in lines and "thresholds.exploding_gradients.factor: default -> 50.0" in lines
    assert body["history"][0]["by"] == "ana" and body["custom"][0]["window"] == 50


def test_a_running_run_applies_new_rules_from_its_next_batch(server, api):
    run = gradwatch.init(project="live", name="r", server=server.url)
    for step in range(20):
        run.log({"loss": 1.0 / (step + 1), "acc": 0.3}, step=step)
    run.flush() if hasattr(run, "flush") else time.sleep(1.0)
    _wait(lambda: api.get("/api/runs/1")["last_step"] == 19)
    assert api.get("/api/runs/1/alerts") == []  # no rule on acc yet
    rule = {"name": "acc low", "key": "acc", "type": "n_of_m", "op": "<", "value": 0.5, "n": 3, "m": 5}
    assert api.request("PUT", "/api/projects/live/rules", {"custom": [rule], "by": "bo"})[0] == 200
    for step in range(20, 30):
        run.log({"loss": 0.05, "acc": 0.3}, step=step)
    run.finish()
    alerts = _wait(lambda: [a for a in api.get("/api/runs/1/alerts") if a["kind"] == "custom_rule"])
    assert alerts[0]["layer"] == "acc low" and alerts[0]["key"] == "acc" and alerts[0]["step"] == 22
    assert "acc low" in alerts[0]["message"]


def test_the_runs_own_thresholds_win_over_the_projects(tmp_path):
    engine = database.make_engine(f"sqlite:///{tmp_path / 'rules.db'}")
    with engine.begin() as conn:
        info = {"uid": "u1", "project": "p", "name": "n", "alerts": {"loss_spike.factor": 50}}
        run_id = open_run(conn, info, {})["run_id"]
        doc = policy.validate(
            {"thresholds": {"loss_spike.factor": 5, "loss_divergence.factor": 4}, "disabled": ["nan_loss"]}
        )
        policy.save(conn, "p", doc, "ana")
        monitor = load_state(conn, run_id).monitor
    assert monitor.th["loss_spike.factor"] == 50  # init(alerts=...) wins
    assert monitor.th["loss_divergence.factor"] == 4  # the project's where the run said nothing
    assert monitor.observe_batch(np.arange(3), {"loss": (np.arange(3), np.array([1.0, math.nan, 1.0]))}, {}) == []


def test_backtest_shows_where_proposed_rules_fire_next_to_current(server, api):
    run = gradwatch.init(project="bt", name="diverges", server=server.url)
    for step in range(200):
        run.log({"loss": 1.0 if step < 150 else 500.0, "acc": 0.9 if step < 100 else 0.2}, step=step)
    run.finish()
    healthy = gradwatch.init(project="bt", name="fine", server=server.url)
    for step in range(200):
        healthy.log({"loss": 1.0 / (1 + step), "acc": 0.9}, step=step)
    healthy.finish()
    proposed = {
        "disabled": ["loss_divergence"],
        "custom": [{"name": "acc drop", "key": "acc", "type": "relative", "op": "<", "factor": 0.5}],
    }
    status, out = api.request("POST", "/api/projects/bt/rules/backtest", proposed)
    assert status == 200, out
    by = {r["name"]: r for r in out["runs"]}
    cur = [(a["kind"], a["step"]) for a in by["diverges"]["current"]]
    new = [(a["kind"], a["step"], a["layer"]) for a in by["diverges"]["proposed"]]
    assert ("loss_divergence", 150) in cur and not any(k == "loss_divergence" for k, _, _ in new)
    assert ("custom_rule", 100, "acc drop") in new
    assert by["fine"]["current"] == [] and by["fine"]["proposed"] == []
    assert out["seconds"] < 2 and not math.isnan(out["points"])
    assert api.get("/api/projects/bt/rules")["updated_at"] is None  # a replay saves nothing
