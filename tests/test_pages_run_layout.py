"""The run page opens on the charts: a one-line incident bar, loss/gradient norm/LR in the first
viewport, then the script's metrics, gradient diagnostics and performance/system, each section folding
and remembered; alert kinds as words; a marker per key step; identical LR groups as one line."""

from __future__ import annotations

import re

import pytest
import torch

import gradwatch
from gradwatch_server.cli import demo

pytestmark = pytest.mark.browser

SECTIONS = ["training", "metrics", "gradients", "system"]


@pytest.fixture
def diverged(server, api):
    """The demo's diverging run (its LR ramps up ~1000x), short: an open critical incident."""
    demo.train(server.url, "ramp", "SGD", 0.05, "ramp", steps=360, delay=0.0, model=demo.make_model())
    assert any(i["status"] == "open" for i in api.get("/api/runs/1/incidents"))
    return server


def _boxes(page):
    return page.evaluate("""() => ['chart-loss', 'chart-gnorm', 'chart-lr'].map(id => {
        const r = document.getElementById(id).getBoundingClientRect(); return [r.top, r.bottom]; })""")


@pytest.mark.parametrize("size", [(1440, 900), (1280, 720)])
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_first_viewport_shows_loss_gradient_norm_and_lr_under_one_incident_line(diverged, browser, size, scheme):
    context = browser.new_context(viewport={"width": size[0], "height": size[1]}, color_scheme=scheme)
    page = context.new_page()
    errors: list = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(diverged.url + "/runs/1")
        page.wait_for_selector("#incident-bar:not([hidden]) .incident-title")
        page.wait_for_function(
            "() => ['chart-loss', 'chart-gnorm', 'chart-lr'].every(id => document.getElementById(id).data)"
        )
        for top, bottom in _boxes(page):
            assert 0 < top and bottom <= size[1], (top, bottom)  # whole, without scrolling
        line = page.locator("#incident-line")
        assert line.bounding_box()["height"] < 40  # one line, not a page of cards
        title = page.locator("#incident-line .incident-title")
        assert "_" not in title.inner_text() and title.get_attribute("title") in gradwatch.contract.ALERT_KINDS
        assert page.locator("#incident-line .severity").inner_text().lower() == "critical"
        words = " ".join(line.inner_text().split())  # the line's parts are flex items: innerText puts them on lines
        assert re.search(r"\w at step \d+ ", words) and "alert" in words  # what happened, where
        assert not page.locator("#alerts .incident").first.is_visible()  # the cards wait behind the line
        assert page.evaluate("() => document.documentElement.scrollWidth") <= size[0]
    finally:
        context.close()
    assert errors == []


def test_sections_come_in_order_and_fold_remembered(diverged, page):
    page.goto(diverged.url + "/runs/1")
    page.wait_for_selector("#metrics .metric-section")
    order = page.evaluate("() => [...document.querySelectorAll('details.run-section')].map(s => s.dataset.section)")
    assert order == SECTIONS
    mine = page.evaluate("() => [...document.querySelectorAll('#metrics .metric-section')].map(s => s.dataset.prefix)")
    assert mine and set(mine) <= {"", "train", "val"}  # the script's own keys, right after the training charts
    hook = page.evaluate(
        "() => [...document.querySelectorAll('#system-metrics .metric-section')].map(s => s.dataset.prefix)"
    )
    assert "perf" in hook and not set(hook) & {"train", "val"}
    assert page.locator("#metric-val\\/loss").count() == 0  # a loss is drawn once, on the Loss chart
    title = page.locator(".card.metric[data-key='perf/step_time'] h3").inner_text()
    assert title.startswith("Step time perf/step_time")  # the hook's keys as words, the key beside
    page.click("details[data-section='gradients'] > summary")
    assert page.evaluate("() => document.querySelector(\"details[data-section='gradients']\").open") is False
    page.reload()
    page.wait_for_selector("#metrics .metric-section")
    opened = page.evaluate("() => [...document.querySelectorAll('details.run-section')].map(s => s.open)")
    assert opened == [True, True, False, True]  # remembered across loads
    page.click("details[data-section='gradients'] > summary")
    page.wait_for_function("() => document.getElementById('heatmap').getBoundingClientRect().width > 300")
    assert not page.js_errors


def test_alert_markers_are_the_key_steps_and_named_on_hover(diverged, page, api):
    alerts = api.get("/api/runs/1/alerts")
    key_steps = {(a["incident_id"], a["kind"]) for a in alerts}
    page.goto(diverged.url + "/runs/1")
    page.wait_for_function("() => (document.getElementById('chart-loss').layout?.annotations || []).length > 0")
    marks = page.evaluate("() => document.getElementById('chart-loss').layout.annotations.map(a => a.hovertext)")
    assert 0 < len(marks) <= len(key_steps)  # one per incident and kind, not one per repeat
    assert all(" at step " in m and "_" not in m.split(" at step ")[0] for m in marks)


def _two_groups(server, lrs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": lrs[0]}, {"params": model[2].parameters(), "lr": lrs[1]}]
    )
    run = gradwatch.init(project="groups", name=f"lrs {lrs}", server=server.url)
    run.watch(model, opt)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    for _ in range(20):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    run.finish(timeout=30)
    return run.id


def test_identical_lr_groups_are_one_line(server, page):
    same, differ = _two_groups(server, (0.01, 0.01)), _two_groups(server, (0.01, 0.02))
    names = "() => document.getElementById('chart-lr').data.filter(t => t.mode !== 'markers').map(t => t.name)"
    page.goto(f"{server.url}/runs/{same}")
    page.wait_for_function("() => document.getElementById('chart-lr').data")
    # one line: the client records identical groups as one `lr` (a run from an older client: the page merges them)
    assert len(page.evaluate(names)) == 1
    page.goto(f"{server.url}/runs/{differ}")
    page.wait_for_function("() => document.getElementById('chart-lr').data")
    assert sorted(page.evaluate(names)) == ["lr/0", "lr/1"]


def test_the_gradient_norm_chart_says_which_line_is_before_and_after_clipping(server, page):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = gradwatch.init(project="clip", name="clipped", server=server.url)
    run.watch(model, opt)
    x, y = torch.randn(64, 4), 100 * torch.randn(64, 1)  # big targets: the norm is clipped at every step
    for _ in range(10):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        run.log({"loss": loss})
    run.finish(timeout=30)
    page.goto(f"{server.url}/runs/{run.id}")
    names = "() => document.getElementById('chart-gnorm').data.filter(t => t.mode !== 'markers').map(t => t.name)"
    page.wait_for_function("() => (document.getElementById('chart-gnorm').data || []).length >= 3")
    assert page.evaluate(names) == [
        "before clipping",
        "after clipping (reached the weights)",
        "clip threshold (max_norm)",
    ]
    assert not page.js_errors


def test_the_first_charts_are_drawn_with_their_data_before_plotly_runs(diverged, page):
    """Plotly (3.5 MB, seconds to start on a busy machine) is held back: the loss, gradient norm and LR
    are sketched from their data with the header and incident line; Plotly's charts replace the sketches."""
    held, released = [], []

    def hold(route):
        route.continue_() if released else held.append(route)

    page.route("**/static/vendor/plotly.min.js", hold)
    page.goto(diverged.url + "/runs/1")
    page.wait_for_function("() => document.querySelectorAll('.quick-chart path.line').length >= 3")
    assert page.evaluate("() => window.Plotly === undefined")
    sketched = page.evaluate(
        """() => ['chart-loss', 'chart-gnorm', 'chart-lr'].map(id =>
             document.querySelector('#' + id + ' .quick-chart path.line').getAttribute('d').split('L').length)"""
    )
    assert all(n > 100 for n in sketched), sketched  # the series' points, not an empty frame
    assert page.locator("#run-name").inner_text() and page.locator("#incident-line .severity").is_visible()
    assert page.is_checked("#loss-log")  # the diverged loss spans decades: a log axis, as Plotly's will be
    released.append(True)
    for route in held:
        route.continue_()
    page.wait_for_function(
        "() => ['chart-loss', 'chart-gnorm', 'chart-lr'].every(id => (document.getElementById(id).data || []).length)"
    )
    assert page.evaluate("() => document.querySelectorAll('.quick-chart').length") == 0
    assert not page.js_errors
