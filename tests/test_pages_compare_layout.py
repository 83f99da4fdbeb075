"""Compare reads like the run page: its section order, the summary and config tables first, a colour
per run that no other shown run has, and alert counts that agree with the runs list."""

from __future__ import annotations

import math

import pytest

import gradwatch

pytestmark = pytest.mark.browser


def _run(url, name, lr, blow_up=False):
    run = gradwatch.init(project="cmp", name=name, config={"lr": lr, "seed": 0}, server=url)
    for step in range(60):
        loss = math.nan if blow_up and step in (30, 50) else 1.0 / (step + 1)
        metrics = {"loss": loss, "lr": lr, "grad/global_norm": 1.0, "perf/step_time": 0.01, "act_rms/0": 0.5}
        if step % 10 == 0:
            metrics["val/accuracy"] = step / 60
        run.log(metrics, step=step)
    run.finish(timeout=30)
    return run.id


def test_compare_charts_in_run_page_order_below_the_tables(server, page, api):
    ids = [_run(server.url, f"r{i}", 0.1 * (i + 1), blow_up=i == 1) for i in range(3)]
    page.goto(server.url + "/compare?ids=" + ",".join(map(str, ids)))
    page.wait_for_function("() => document.querySelectorAll('#summary tr[data-run]').length === 3")
    page.wait_for_function("() => document.querySelectorAll('.panel-key').length > 0")
    keys = page.evaluate("() => [...document.querySelectorAll('.panel-key')].map(s => s.value)")
    # training first (loss, gradient norm, learning rate), then the script's own, then the hook's own;
    # per-layer keys wait for the picker
    assert keys == ["loss", "grad/global_norm", "lr", "val/accuracy", "perf/step_time"]
    top = "(s) => document.querySelector(s).getBoundingClientRect().top"
    assert page.evaluate(top, "#summary") < page.evaluate(top, "#panels")
    assert page.evaluate(top, "#diff") < page.evaluate(top, "#panels")
    page.wait_for_function("() => (document.getElementById('chart-0').data || []).length >= 3")
    colours = page.evaluate(
        "() => document.getElementById('chart-0').data.filter(t => t.mode === 'lines').map(t => t.line.color)"
    )
    assert len(set(colours)) == 3
    listed = {r["id"]: r["alert_count"] for r in api.get("/api/runs")}
    shown = page.evaluate(
        "() => Object.fromEntries([...document.querySelectorAll('#summary tr[data-run]')]"
        ".map(tr => [tr.dataset.run, Number(tr.querySelector('.alert-total').textContent)]))"
    )
    assert {int(k): v for k, v in shown.items()} == listed and listed[ids[1]] >= 1  # as the runs list counts
    assert not page.js_errors


def test_ten_runs_shown_together_get_ten_colours(server, page):
    page.goto(server.url + "/compare")
    got = page.evaluate("""async () => { const m = await import('/static/lib/plot.js');
        const ids = [1, 11, 21, 3, 13, 5, 7, 9, 2, 4]; m.assignColors(ids); return ids.map(m.colorFor); }""")
    assert len(set(got)) == 10


def test_compare_writes_numbers_in_the_one_format(server, page):
    """lr = 1e-4 (not 1.000e-4 or 0.0001) and +inf (not Infinity) in the tables and the charts' hover."""
    ids = []
    for name, lr, last in (("small", 1e-4, 0.25), ("big", 1e-2, math.inf)):
        run = gradwatch.init(project="fmt", name=name, config={"lr": lr}, server=server.url)
        for step in range(20):
            run.log({"loss": last if step == 19 else 1.0 / (step + 1)}, step=step)
        run.finish(timeout=30)
        ids.append(run.id)
    page.goto(server.url + "/compare?ids=" + ",".join(map(str, ids)))
    page.wait_for_function("() => document.querySelectorAll('#summary tr[data-run]').length === 2")
    page.wait_for_function("() => document.querySelector('#diff tr.differs')")
    lr_row = page.evaluate(
        "() => [...document.querySelectorAll('#diff tr')].find(tr => tr.cells[0].textContent === 'lr')"
        ".innerText.split('\\t')"
    )
    assert lr_row[1:] == ["1e-4", "0.01"]
    last = page.wait_for_function(  # the losses come in a request of their own
        "() => { const t = [...document.querySelectorAll('#summary .last-loss')].map(td => td.textContent);"
        " return t.every(Boolean) && t; }"
    ).json_value()
    assert last == ["0.25", "+inf"]
    page.wait_for_function("() => (document.getElementById('chart-0').data || []).some(t => (t.text || []).length)")
    hover = page.evaluate("() => document.getElementById('chart-0').data.flatMap(t => t.text || [])")
    assert any("= +inf at step 19" in t for t in hover), hover
    body = page.inner_text("body")
    assert "1.000e-4" not in body and "Infinity" not in body
    assert not page.js_errors


def test_normalise_divides_each_run_by_its_first_value(server, page):
    ids = []
    for name, scale in (("unit", 1.0), ("thousand", 1000.0)):
        run = gradwatch.init(project="norm", name=name, server=server.url)
        for step in range(20):
            run.log({"loss": scale * 2.0 / (step + 1)}, step=step)
        run.finish(timeout=30)
        ids.append(run.id)
    page.goto(server.url + "/compare?keys=loss&norm=1&ids=" + ",".join(map(str, ids)))
    lines = "() => (document.getElementById('chart-0')?.data || []).filter(t => t.mode === 'lines').map(t => [t.y[0], t.y[19]])"
    got = page.wait_for_function(f"() => {{ const l = ({lines})(); return l.length === 2 && l; }}").json_value()
    assert got == [[1, pytest.approx(0.05)], [1, pytest.approx(0.05)]]  # both start at 1, whatever their scale
    assert page.is_checked("#normalise")
    page.uncheck("#normalise")
    page.wait_for_function(f"() => ({lines})().some(([first]) => first === 2000)")
    assert "norm=1" not in page.url
    assert not page.js_errors
