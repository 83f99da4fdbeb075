"""Incidents through a real server and real PyTorch runs: one incident per problem, its root and cause, its
consequences in step order, alerts that follow their episodes, and acknowledge / snooze / resolve."""

from __future__ import annotations

import pytest
import torch
from conftest import wait_runs
from test_health_corpus import _gen, _set_lr
from torch import nn
from training import SeqClassifier, loop, mlp, regression_data

import gradwatch

F = nn.functional


def spirals_run(run, lr: float, steps: int = 60):
    """The README demo's model and data (Adam, cosine schedule) on a real gradwatch run."""
    from gradwatch_server.cli import demo

    torch.manual_seed(0)
    model, (x, y), g = demo.make_model(), demo.make_data(), _gen(1)
    o = torch.optim.Adam(model.parameters(), lr=lr)
    batch = lambda s: (lambda i: (x[i], y[i]))(torch.randint(0, len(x), (128,), generator=g))  # noqa: E731
    return loop(
        run, model, o, batch, steps, F.cross_entropy, sched=torch.optim.lr_scheduler.CosineAnnealingLR(o, steps)
    )


def lr_jump_run(run, at: int = 40, lr: float = 50.0, steps: int = 60):
    """An MLP learning fine at lr 0.01 until the LR jumps at step ``at``."""
    torch.manual_seed(7)
    model, (x, y), g = mlp(), regression_data(seed=7), _gen(7)
    o = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = lambda s: (lambda i: (x[i], y[i]))(torch.randint(0, len(x), (32,), generator=g))  # noqa: E731
    before = _set_lr(at, lr)
    return loop(run, model, o, batch, steps, F.mse_loss, before=lambda s: before(s, model, o))


@pytest.fixture(autouse=True)
def _pace_rule_off(api):
    """No test here is about a loop's pace, which a busy machine changes (an extra throughput_drop incident)."""
    status, body = api.request("PUT", "/api/projects/inc/rules", {"disabled": ["throughput_drop"]})
    assert status == 200, body


def incidents_of(api, run_id=1):
    return api.get(f"/api/runs/{run_id}/incidents")


def test_a_divergence_is_one_incident_with_its_consequences_in_order(server, api):
    spirals_run(gradwatch.init(project="inc", name="lr3", server=server.url), 3.0)
    found = incidents_of(api)
    assert len(found) == 1, [(i["kind"], i["story"]) for i in found]
    inc = found[0]
    assert {"id", "root", "alerts", "first_step", "last_step", "status"} <= set(inc)
    assert inc["status"] == "open" and inc["first_step"] == 1 and inc["root"]["step"] == 1
    steps = [a["step"] for a in inc["alerts"]]
    assert steps == sorted(steps) and len(inc["alerts"]) == len(api.get("/api/runs/1/alerts"))
    assert inc["story"].startswith(("diverged at 1", "gradients exploded at 1")), inc["story"]
    # The dead ReLUs after the blow-up are saturation, not a cut graph.
    zero = next(a for a in inc["alerts"] if a["kind"] == "zero_gradients")
    assert "saturated after diverging" in zero["message"] and ".detach()" not in zero["message"]
    assert all(a["incident_id"] == inc["id"] for a in api.get("/api/runs/1/alerts"))  # old endpoint still works


def test_the_root_names_the_learning_rate_against_where_the_loss_was_falling(server, api):
    lr_jump_run(gradwatch.init(project="inc", name="jump", server=server.url))
    inc = incidents_of(api)[0]
    assert inc["root"]["step"] == 41 and inc["first_step"] == 41
    assert "learning rate 50 at onset" in inc["cause"] and "5000×" in inc["cause"], inc["cause"]
    assert "where the loss was still falling" in inc["cause"]


def test_an_alert_follows_its_episode(server, api):
    # pytorch/examples' word_language_model failure: a tanh RNN at lr 100 without clipping stays diverged.
    torch.manual_seed(0)
    tokens = torch.randint(0, 30, (256, 10), generator=_gen(0))
    labels = (tokens[:, 0] >= 15).long()
    g, model = _gen(1), SeqClassifier(cell=nn.RNN)
    run = gradwatch.init(project="inc", name="rnn", server=server.url)
    batch = lambda s: (lambda i: (tokens[i], labels[i]))(torch.randint(0, 256, (32,), generator=g))  # noqa: E731
    loop(run, model, torch.optim.SGD(model.parameters(), lr=100.0), batch, 40, F.cross_entropy)
    alerts = {a["kind"]: a for a in api.get("/api/runs/1/alerts")}
    div = alerts["loss_divergence"]
    assert div["step"] == 1 and div["count"] > 1 and div["last_step"] > 20, div
    loss = api.get("/api/runs/1/series?key=loss")
    diverged = [v for s, v in zip(loss["steps"], loss["values"]) if s >= 1 and isinstance(v, float)]
    assert float(div["value"]) == max(diverged)  # the worst value of the episode, not the first
    inc = incidents_of(api)[0]
    assert inc["last_step"] >= div["last_step"]


def test_acknowledge_snooze_resolve_and_the_inbox(server, api):
    spirals_run(gradwatch.init(project="inc", name="a", server=server.url), 3.0)
    lr_jump_run(gradwatch.init(project="inc", name="b", server=server.url))
    wait_runs(api, 2)
    first, second = incidents_of(api, 1)[0], incidents_of(api, 2)[0]
    status, body = api.request("POST", f"/api/incidents/{first['id']}/status", {"status": "acknowledged", "by": "ana"})
    assert status == 200 and body["status"] == "acknowledged"
    assert body["status_by"] == "anonymous"  # the token's name (no token here), never the "by" the caller sent
    inbox = api.get("/api/incidents")
    assert [i["id"] for i in inbox] == [second["id"], first["id"]]  # open first
    assert inbox[0]["run_name"] == "b" and inbox[0]["project"] == "inc"
    status, body = api.request("POST", f"/api/incidents/{second['id']}/status", {"status": "snoozed", "minutes": 30})
    assert status == 200 and body["status"] == "snoozed" and body["snoozed_until"] > 0
    assert api.get("/api/incidents?status=snoozed")[0]["id"] == second["id"]
    status, body = api.request("POST", "/api/runs/1/incidents/status", {"status": "resolved"})
    assert status == 200 and body["changed"] == 1
    assert incidents_of(api, 1)[0]["status"] == "resolved"
    assert api.request("POST", f"/api/incidents/{first['id']}/status", {"status": "gone"})[0] == 400
    assert api.request("POST", f"/api/incidents/{first['id']}/status", {"status": "snoozed", "minutes": -1})[0] == 400
    assert api.request("POST", "/api/incidents/999/status", {"status": "resolved"})[0] == 404
    assert api.request("GET", "/api/runs/999/incidents")[0] == 404
    runs = {r["id"]: r for r in api.get("/api/runs")}
    assert runs[1]["open_incidents"] == 0 and runs[2]["open_incidents"] == 0  # acknowledged/resolved, snoozed
    assert runs[2]["last_alert"]["step"] == 41  # the banner headlines the root cause, not the last consequence


class _Unfinished:
    """The run, with ``finish`` left to the with-block (which records the exception)."""

    def __init__(self, run):
        self.run = run
        self.watch, self.log = run.watch, run.log

    def finish(self):
        pass


def test_a_crash_right_after_a_divergence_is_diagnosed_as_part_of_it(server, api):
    with pytest.raises(ValueError):
        with gradwatch.init(project="inc", name="crash", server=server.url) as run:
            lr_jump_run(_Unfinished(run), steps=45)  # diverges at 41
            raise ValueError("loss is not finite, stopping")
    detail = api.get("/api/runs/1")
    diagnosis = detail["error"]["diagnosis"]
    inc = incidents_of(api)[0]
    assert diagnosis["title"] == "Crashed after diverging" and diagnosis["incident_id"] == inc["id"]
    assert "diverged at step 41" in diagnosis["advice"] and "learning rate 50" in diagnosis["advice"]


def test_an_lr_ramp_that_went_too_far_is_named_as_the_cause(server, api):
    # The demo's failure: the LR grows every step; the loss falls while it is small, then blows up.
    torch.manual_seed(3)
    model, (x, y), g = mlp(), regression_data(seed=3), _gen(3)
    o = torch.optim.SGD(model.parameters(), lr=0.005)
    sched = torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.08**s)
    batch = lambda s: (lambda i: (x[i], y[i]))(torch.randint(0, len(x), (32,), generator=g))  # noqa: E731
    run = gradwatch.init(project="inc", name="ramp", server=server.url)
    loop(run, model, o, batch, 120, F.mse_loss, sched=sched)
    inc = incidents_of(api)[0]
    assert inc["cause"], [(i["kind"], i["first_step"], i["story"]) for i in incidents_of(api)]
    ratio = float(inc["cause"].split("×")[0].rsplit(", ", 1)[1])
    assert ratio >= 3 and "where the loss was still falling" in inc["cause"], inc["cause"]
