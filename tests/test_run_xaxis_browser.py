"""The run page in real Chromium with another logged key (tokens) as its x axis, aligned by step on the server."""

from __future__ import annotations

import pytest

import gradwatch

pytestmark = pytest.mark.browser


def test_run_page_plots_against_tokens(server, page):
    run = gradwatch.init(project="x", name="tok", server=server.url)
    for step in range(30):  # loss falls linearly in tokens: on a tokens axis, y = 1000 - x / 100 exactly
        run.log({"loss": 1000.0 - step, "tokens": 100.0 * step, "val/acc": step / 30}, step=step)
    run.finish(timeout=30)
    page.goto(server.url + "/runs/1")
    page.wait_for_function("() => document.getElementById('chart-loss').data?.[0]?.x.length === 30")
    page.wait_for_selector("#x-mode option[value='tokens']", state="attached")
    page.select_option("#x-mode", "tokens")
    page.wait_for_function(
        "() => { const l = document.getElementById('chart-loss').layout; return l.xaxis.title.text === 'tokens'; }",
        timeout=20000,
    )
    xs, ys = page.evaluate("() => { const t = document.getElementById('chart-loss').data[0]; return [t.x, t.y]; }")
    assert min(xs) < 5 and 2895 < max(xs) <= 2900  # tokens 0..2900, not steps 0..29
    assert all(abs(y - (1000 - x / 100)) < 0.05 for x, y in zip(xs, ys, strict=True))
    acc = page.evaluate("() => document.getElementById('metric-val/acc').data[0].x")
    assert max(acc) > 2800  # the metric charts follow the same axis
    page.select_option("#x-mode", "step")  # and back to steps: the raw points again
    page.wait_for_function(
        "() => document.getElementById('chart-loss').data[0].x.join() === [...Array(30).keys()].join()"
    )
    assert not page.js_errors
