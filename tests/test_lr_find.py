"""gradwatch.lr_find: a real sweep on a real model, restored afterwards, streamed, shown as loss vs LR."""

from __future__ import annotations

import math

import pytest
import torch

import gradwatch
from gradwatch.lr_range import suggest


def regression(seed=0):
    """A tiny linear regression task and a model with momentum state to restore."""
    torch.manual_seed(seed)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1) + 0.01 * torch.randn(256, 1)
    loader = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 256, 32)]
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.functional.mse_loss
    for xb, yb in loader[:2]:  # some optimizer state (momentum buffers) that must come back untouched
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    return model, opt, loader, loss_fn


def sweep(server, **kwargs):
    model, opt, loader, loss_fn = regression()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = opt.state_dict()
    momentum = {k: v["momentum_buffer"].clone() for k, v in state["state"].items()}
    model.eval()
    found = gradwatch.lr_find(
        model, opt, loader, loss_fn, start_lr=1e-5, end_lr=10.0, num_steps=150, server=server.url, **kwargs
    )
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    after = opt.state_dict()
    assert all(torch.equal(after["state"][k]["momentum_buffer"], m) for k, m in momentum.items())
    assert [g["lr"] for g in opt.param_groups] == [0.01] and not model.training
    return found


def test_lr_find_suggests_restores_and_streams(server, api):
    current = gradwatch.run
    found = sweep(server)
    assert found.lr is not None and 1e-4 < found.lr < 3.0, found
    assert "steepest descent" in found.reason and "blew up" in found.reason
    assert len(found.lrs) < 150  # stopped at the blow-up, not at num_steps
    assert found.lrs == sorted(found.lrs) and math.isclose(found.lrs[0], 1e-5)
    run = api.get("/api/runs")[0]
    assert run["status"] == "finished" and "lr_find" in run["tags"] and found.run_url.endswith(f"/runs/{run['id']}")
    keys = api.get(f"/api/runs/{run['id']}/keys")
    assert {"lr", "loss", "lr_find/smoothed_loss", "lr_find/suggested_lr", "lr_find/diverged_lr"} <= set(keys)
    lr = api.get(f"/api/runs/{run['id']}/series?key=lr")
    assert lr["steps"] == list(range(len(found.lrs))) and lr["values"] == pytest.approx(found.lrs)
    assert api.get(f"/api/runs/{run['id']}/series?key=lr_find/suggested_lr")["values"] == [found.lr]
    alert = [a for a in api.get(f"/api/runs/{run['id']}/alerts") if a["kind"] == "lr_suggestion"][0]
    assert alert["value"] == found.lr and found.reason in alert["message"] and alert["severity"] == "info"
    assert gradwatch.run is current  # the sweep is its own run, not the script's current one


def test_suggest_picks_steepest_fall_before_the_minimum():
    lrs = [10 ** (-6 + i * 0.1) for i in range(60)]
    # Flat, then falling fastest around lr=1e-3 (i=30), lowest near 1e-1, then rising.
    smoothed = [
        2.0 - 1.5 / (1 + math.exp(-(math.log10(x) + 3) * 3)) + (0.5 * (math.log10(x) + 1) ** 2 if x > 0.1 else 0)
        for x in lrs
    ]
    lr, reason = suggest(lrs, smoothed, diverged_at=3.0)
    assert math.isclose(math.log10(lr), -3, abs_tol=0.11), lr
    assert "lr=3.00e+00" in reason
    assert suggest(lrs[:4], smoothed[:4], diverged_at=1e-5)[0] is None
    flat = suggest(lrs, [1.0] * 60, diverged_at=None)
    assert flat[0] is None and "did not fall" in flat[1]


def test_lr_find_rejects_bad_ranges(server):
    model, opt, loader, loss_fn = regression()
    with pytest.raises(ValueError):
        gradwatch.lr_find(model, opt, loader, loss_fn, start_lr=1.0, end_lr=0.1, server=server.url)


@pytest.mark.browser
def test_run_page_shows_loss_against_lr_with_the_suggestion(server, api, page):
    found = sweep(server)
    run_id = api.get("/api/runs")[0]["id"]
    page.goto(f"{server.url}/runs/{run_id}")
    page.wait_for_function(
        "() => { const d = document.getElementById('lr-find-chart'); return d && d.data && d.data.length === 3; }",
        timeout=15000,
    )
    chart = page.evaluate("""() => { const d = document.getElementById('lr-find-chart');
        return {type: d.layout.xaxis.type, names: d.data.map((t) => t.name), x: d.data[1].x, mark: d.data[2].x}; }""")
    assert chart["type"] == "log"
    assert chart["x"] == pytest.approx(found.lrs)  # loss plotted against the LR of its step
    assert chart["mark"] == pytest.approx([found.lr, found.lr]) and chart["names"][2].startswith("suggested")
    assert found.reason in page.locator("#lr-find-reason").inner_text()
    assert "Suggested learning rate" in page.locator("#lr-find-lr").inner_text()
    assert not page.js_errors


def test_docs_example_runs(server, api, monkeypatch, capsys):
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parent.parent / "docs" / "integrations" / "lr_find.md"
    monkeypatch.setenv("GRADWATCH_SERVER", server.url)
    code = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert len(code) == 1
    scope = {"__name__": "docs_example"}
    exec(compile(code[0], str(doc), "exec"), scope)
    found = scope["found"]
    assert found.lr is not None and [g["lr"] for g in scope["optimizer"].param_groups] == [found.lr]
    assert found.reason in capsys.readouterr().out
    run = api.get("/api/runs")[0]
    assert (run["project"], run["status"]) == ("lr_find", "finished")
