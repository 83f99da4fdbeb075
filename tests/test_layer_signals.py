"""Per-layer update ratios, module output RMS and NaN provenance (gradwatch.capture.layer_signals) on real CPU training."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from training import Recorder

from gradwatch.capture.layer_signals import ACT_VECTOR, SAMPLE, UPDATE_VECTOR
from gradwatch.watcher import Watcher


def recs(rec: Recorder, key: str) -> dict:
    """{step: vector} of one vector key."""
    return {r[1]: r[3][key] for r in rec.records() if r[0] == "rec" and key in r[3]}


def layout(rec: Recorder, key: str) -> list:
    return [item[2] for item in rec.items if item[0] == "layout" and item[1] == key][-1]


def step(model, opt, x, y, rec):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    rec.log({"loss": loss.detach()})
    return loss


def test_update_ratio_is_the_exact_ratio_for_small_tensors_and_close_for_big_ones():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1), nn.Linear(1, 300 * SAMPLE // 100))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    rec = Recorder()
    Watcher(rec, model, opt, signals_every=1)  # every step (the default samples every 10th)
    x, y = torch.randn(32, 8), torch.randn(32, 300 * SAMPLE // 100)
    before = [p.detach().clone() for p in model.parameters()]
    step(model, opt, x, y, rec)
    exact = [float((p.detach() - b).norm() / b.norm().clamp_min(1e-12)) for p, b in zip(model.parameters(), before)]
    got = recs(rec, UPDATE_VECTOR)[0]
    assert layout(rec, UPDATE_VECTOR) == [n for n, _ in model.named_parameters()]
    for name, e, g in zip(layout(rec, UPDATE_VECTOR), exact, got):
        big = dict(model.named_parameters())[name].numel() > SAMPLE
        assert g == pytest.approx(e, rel=0.1 if big else 1e-4), name  # sampled: an estimate within 10 %


def test_the_default_samples_every_tenth_step():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder().watch(model, opt)  # watch() without signals_every: its cost is in docs/alerts.md
    for _ in range(25):
        step(model, opt, torch.randn(16, 4), torch.zeros(16, 2), rec)
    sampled = [r[1] for r in rec.records() if r[0] == "rec" and UPDATE_VECTOR in r[3]]
    assert sampled == [0, 10, 20]


def test_act_rms_is_each_leaf_modules_output_rms_in_forward_order():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder()
    Watcher(rec, model, opt, signals_every=1)  # every step (the default samples every 10th)
    x = torch.randn(16, 4)
    with torch.no_grad():
        h0 = model[0](x)
        expected = [h0.pow(2).mean().sqrt(), h0.tanh().pow(2).mean().sqrt(), model[2](h0.tanh()).pow(2).mean().sqrt()]
    step(model, opt, x, torch.zeros(16, 2), rec)
    assert layout(rec, ACT_VECTOR) == ["0", "1", "2"]
    assert recs(rec, ACT_VECTOR)[0] == pytest.approx([float(e) for e in expected], rel=1e-5)
    # eval passes under no_grad are not training steps: they change nothing
    with torch.no_grad():
        model(torch.full((4, 4), 100.0))
    step(model, opt, x, torch.zeros(16, 2), rec)
    assert max(recs(rec, ACT_VECTOR)[1]) < 10


def test_signals_every_k_samples_only_every_kth_step_and_remove_detaches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder()

    watcher = Watcher(rec, model, opt, signals_every=4)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(10):
        step(model, opt, x, y, rec)
    assert sorted(recs(rec, UPDATE_VECTOR)) == [0, 4, 8] == sorted(recs(rec, ACT_VECTOR))
    watcher.remove()
    n = len(rec.items)
    for _ in range(4):
        step(model, opt, x, y, rec)
    assert all(item[0] == "rec" and "loss" in item[2] for item in rec.items[n:])


def test_signals_off():
    model = nn.Sequential(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder()

    Watcher(rec, model, opt, signals=False)
    step(model, opt, torch.randn(8, 4), torch.randn(8, 1), rec)
    assert not recs(rec, UPDATE_VECTOR) and not recs(rec, ACT_VECTOR)


class Norm(nn.Module):
    """Divides by the row norm with no epsilon: an all-zero row is 0/0."""

    def __init__(self, d):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.gain * x / x.norm(dim=-1, keepdim=True)


def nan_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8, bias=False), Norm(8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))


def zero_batch_run(on_nan=None, bad_step=6, steps=10):
    model = nan_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    rec = Recorder()

    Watcher(rec, model, opt, on_nan=on_nan, signals_every=1)  # the exact birth step needs every step
    g = torch.Generator().manual_seed(1)
    for s in range(steps):
        x = torch.randn(16, 4, generator=g)
        if s == bad_step:
            x = torch.zeros(16, 4)  # one all-zero batch: the bias-free Linear gives 0, and Norm divides 0 by 0
        step(model, opt, x, torch.zeros(16, 1), rec)
    return model, rec


def test_nan_provenance_names_the_module_where_the_nan_was_born():
    model, rec = zero_batch_run()
    events = [item[1] for item in rec.items if item[0] == "event" and item[1].get("kind") == "nan_provenance"]
    assert len(events) == 1, events  # once: the steps after it are consequences
    e = events[0]
    assert (e["step"], e["layer"]) == (6, "1")  # the Norm, not the Linear after it nor the loss
    assert "the weights were finite" in e["message"] and "optimizer state was finite" in e["message"]
    assert e["severity"] == "critical"
    assert not all(torch.isfinite(p).all() for p in model.parameters())  # without skip the weights are poisoned


def test_on_nan_skip_keeps_the_weights_finite():
    model, rec = zero_batch_run(on_nan="skip", steps=8)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    losses = [r[2]["loss"] for r in rec.records() if r[0] == "rec" and "loss" in r[2]]
    assert not math.isfinite(losses[6]) and math.isfinite(losses[7])  # the bad batch only


# -- end to end, through a real server ------------------------------------------------------------------
def test_signals_provenance_and_warning_through_the_server(server, api):
    import gradwatch

    run = gradwatch.init(project="signals", name="zero-batch", server=server.url)
    model = nan_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    run.watch(model, opt, signals_every=1)
    g = torch.Generator().manual_seed(1)
    for s in range(10):
        x = torch.zeros(16, 4) if s == 6 else torch.randn(16, 4, generator=g)
        step(model, opt, x, torch.zeros(16, 1), run)
    run.finish()
    rid = run.id
    alerts = {a["kind"]: a for a in api.get(f"/api/runs/{rid}/alerts")}
    prov = alerts["nan_provenance"]
    assert (prov["step"], prov["layer"]) == (6, "1") and "weights were finite" in prov["message"]
    keys = api.get(f"/api/runs/{rid}/keys")
    assert "update_ratio/0.weight" in keys and "act_rms/1" in keys and "signals/update_ratio_max" in keys
    heat = api.get(f"/api/runs/{rid}/heatmap?key=act_rms")
    assert heat["layers"] == ["0", "1", "2", "3", "4"]
