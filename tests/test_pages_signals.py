"""The run page's layer-signal heatmaps (frontend/signals.js) in Chromium, fed by a real watched training run."""

from __future__ import annotations

import torch
from torch import nn

import gradwatch


def test_update_ratio_and_output_rms_heatmaps_beside_the_gradient_one(server, page):
    torch.manual_seed(0)
    run = gradwatch.init(project="browser", name="signals", server=server.url)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    run.watch(model, opt, batch_size=32)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    for _ in range(30):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    run.finish()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + f"/runs/{run.id}")
    for key in ("update_ratio", "act_rms"):
        page.wait_for_function(
            f"() => document.querySelector('#heatmap-{key} .heatmap') !== null"
            f" || (document.getElementById('heatmap-{key}')?.data || []).length > 0",
            timeout=20000,
        )
    rows = page.evaluate("() => document.getElementById('heatmap-act_rms').data[0].y")
    assert rows == ["0", "1", "2"]  # forward order
    ratios = page.evaluate("() => document.getElementById('heatmap-update_ratio').data[0].y")
    assert ratios == ["0.weight", "0.bias", "2.weight", "2.bias"]
    # the panels follow the gradient heatmap's card, and the per-layer keys get no chart of their own
    order = page.evaluate("() => [...document.querySelectorAll('.card.wide')].map((c) => c.dataset.signal || '')")
    assert order.index("update_ratio") + 1 == order.index("act_rms")
    assert page.locator("[data-key^='update_ratio/'], [data-key^='act_rms/']").count() == 0
    assert page.locator(".card.metric[data-key='perf/step_time']").count() == 1
    assert not errors, errors
