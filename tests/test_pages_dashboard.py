"""Dashboard pages in real Chromium: edits, comparison, zoom detail, live heatmap, CSV, dark mode."""

from __future__ import annotations

import math
import os
import threading
import urllib.request
from pathlib import Path

import pytest
from conftest import wait_runs
from training import train_slowly

import gradwatch

pytestmark = pytest.mark.browser
SHOTS = Path(os.environ.get("GRADWATCH_SCREENSHOTS", Path(__file__).resolve().parent.parent / "build" / "screenshots"))


def _logged_run(url, name, steps, config=None, tags=None, values=None):
    run = gradwatch.init(project="dash", name=name, config=config or {}, tags=tags, server=url)
    for step in range(steps):
        run.log({"loss": values(step) if values else 1.0 / (step + 1), "acc": step / steps}, step=step)
    run.finish(timeout=60)
    return run


def test_runs_list_rename_tag_note_filter_and_delete(server, page, api):
    _logged_run(server.url, "first", 5)
    _logged_run(server.url, "second", 5)
    answers = iter(["renamed run", "vision, baseline", "lr was too high"])
    page.on("dialog", lambda d: d.accept(next(answers, "")) if d.type == "prompt" else d.accept())
    page.goto(server.url + "/")
    row = page.locator("tr[data-run='1']")
    row.locator(".row-menu summary").click()  # the edits are in the row's menu
    row.get_by_role("button", name="Rename").click()
    page.wait_for_function("() => document.querySelector(\"tr[data-run='1'] a\").textContent === 'renamed run'")
    row.locator(".row-menu summary").click()  # the edits are in the row's menu
    row.get_by_role("button", name="Tags").click()
    page.wait_for_selector("tr[data-run='1'] .chip")
    row.locator(".row-menu summary").click()  # the edits are in the row's menu
    row.get_by_role("button", name="Note").click()
    page.wait_for_function("() => document.querySelector(\"tr[data-run='1']\").textContent.includes('lr was too high')")
    run = api.get("/api/runs/1")
    assert (run["name"], run["tags"], run["notes"]) == ("renamed run", ["vision", "baseline"], "lr was too high")
    page.fill("#f-tag", "vision")
    assert page.locator("tbody tr").count() == 1 and page.locator("#count").inner_text() == "1 of 2 runs"
    page.fill("#f-tag", "")
    # A page open on the run being deleted says so.
    other = page.context.new_page()
    other.goto(server.url + "/runs/2")
    other.wait_for_selector("#run-name:has-text('second')")
    page.locator("tr[data-run='2'] .row-menu summary").click()
    page.locator("tr[data-run='2']").get_by_role("button", name="Delete").click()
    other.wait_for_selector(".alert[data-kind='deleted']", timeout=10000)
    other.close()
    page.wait_for_function("() => !document.querySelector(\"tr[data-run='2']\")")
    assert api.request("GET", "/api/runs/2")[0] == 404
    assert api.request("GET", "/api/runs/2/series?key=loss")[0] == 404
    page.reload()
    page.wait_for_selector("tr[data-run='1']")
    assert page.locator("tbody tr").count() == 1
    assert not page.js_errors


def test_compare_overlays_runs_diffs_configs_shares_and_appends_live(server, page, api):
    _logged_run(server.url, "lr-1e-3", 50, config={"lr": 1e-3, "batch": 32})
    stop = threading.Event()
    live = threading.Thread(
        target=train_slowly, args=(server.url, 600, stop, "lr-1e-2", None, {"lr": 1e-2, "batch": 32}, "dash")
    )
    live.start()
    try:
        wait_runs(api, 2)
        page.goto(server.url + "/")
        page.wait_for_selector("tr[data-run='2']")
        page.locator("tr[data-run='1'] input[type=checkbox]").check()
        page.locator("tr[data-run='2'] input[type=checkbox]").check()
        page.click("#compare")
        page.wait_for_url("**/compare?ids=*")
        page.wait_for_function(
            "() => { const e = document.getElementById('chart-0'); return e && e.data && e.data.length >= 3; }"
        )
        lines = page.evaluate(
            "() => document.getElementById('chart-0').data.filter(t => t.mode === 'lines')"
            ".map(t => [t.name, t.line.color])"
        )
        colors = page.evaluate(
            "async () => { const m = await import('/static/lib/plot.js'); return [m.colorFor(1), m.colorFor(2)]; }"
        )
        assert {tuple(x) for x in lines} == {("lr-1e-3 #1", colors[0]), ("lr-1e-2 #2", colors[1])}
        differs = page.locator("#diff tr.differs td:first-child").all_inner_texts()
        assert "lr" in differs and "batch" not in differs
        # The live run keeps growing on the comparison chart.
        grow = "() => document.getElementById('chart-0').data.find(t => t.name === 'lr-1e-2 #2').x.length"
        before = page.evaluate(grow)
        page.wait_for_function(f"() => ({grow})() > {before + 20}", timeout=20000)
        # A second chart keeps each run's colour; the layout survives in the shared URL.
        page.click("#add-chart")
        page.locator("#chart-1").wait_for()
        page.locator(".panel-key").nth(1).select_option("acc")
        page.wait_for_function(
            "() => { const d = document.getElementById('chart-1').data;"
            " return d && d.some(t => t.name === 'lr-1e-3 #1'); }"
        )
        acc = page.evaluate(
            "() => document.getElementById('chart-1').data.filter(t => t.mode === 'lines')"
            ".map(t => [t.name, t.line.color])"
        )
        assert ["lr-1e-3 #1", colors[0]] in acc
        page.check("#log")
        page.wait_for_function("() => location.search.includes('keys=loss%2Cacc') && location.search.includes('log=1')")
        page.goto(page.url)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.panel-key')].map(s => s.value).join() === 'loss,acc'"
        )
        assert page.locator("#log").is_checked()
        # The older single-metric link form still opens.
        page.goto(server.url + "/compare?ids=1,2&key=acc")
        page.wait_for_function(
            "() => document.querySelector('.panel-key') && document.querySelector('.panel-key').value === 'acc'"
        )
    finally:
        stop.set()
        live.join()
    assert not page.js_errors


def test_spike_survives_overview_and_zoom_fetches_full_detail(server, page):
    def value(step):
        return {12_345: 1e6, 15_000: math.nan}.get(step, 1.0 + (step % 10) * 0.01)

    _logged_run(server.url, "long", 20_000, values=value)
    page.goto(server.url + "/runs/1")
    page.wait_for_function("() => { const d = document.getElementById('chart-loss').data; return d && d[0].x.length; }")
    xs, ys = page.evaluate("() => { const t = document.getElementById('chart-loss').data[0]; return [t.x, t.y]; }")
    assert len(xs) <= 4100 and ys[xs.index(12_345)] == 1e6  # the one spike is in the overview
    markers = page.evaluate("() => { const d = document.getElementById('chart-loss').data; return d[d.length - 1].x; }")
    assert 15_000 in markers  # and the NaN is a visible marker
    # Axis choices: log y per chart, relative time on x.
    page.check("#loss-log")
    page.wait_for_function("() => document.getElementById('chart-loss').layout.yaxis.type === 'log'")
    page.uncheck("#loss-log")
    page.select_option("#x-mode", "relative")
    page.wait_for_function(
        "() => { const x = document.getElementById('chart-loss').data[0].x;"
        " return x[0] >= 0 && x[x.length - 1] < 3600; }"
    )
    page.select_option("#x-mode", "step")
    page.wait_for_function("() => document.getElementById('chart-loss').data[0].x.includes(12345)")
    page.evaluate("() => Plotly.relayout('chart-loss', {'xaxis.range': [12000, 12600]})")
    page.wait_for_function("() => document.getElementById('chart-loss').data[0].x.length === 601", timeout=10000)
    xs = page.evaluate("() => document.getElementById('chart-loss').data[0].x")
    assert xs == list(range(12_000, 12_601))
    assert not page.js_errors


def test_heatmap_appends_live_pushes_without_refetching(server, page, api):
    heat_requests = []
    # the gradient heatmap's own requests (the update-ratio and RMS panels beside it re-fetch every 3 s by design)
    page.on("request", lambda r: heat_requests.append(r.url) if "/heatmap?key=grad&" in r.url else None)
    stop = threading.Event()
    t = threading.Thread(target=train_slowly, args=(server.url, 800, stop, "heat", None, None, "dash"))
    t.start()
    try:
        wait_runs(api, 1)
        page.goto(server.url + "/runs/1")
        cols = "() => { const d = document.getElementById('heatmap').data; return d ? d[0].x.length : 0; }"
        page.wait_for_function(f"() => ({cols})() > 5", timeout=20000)
        fetched, before = len(heat_requests), page.evaluate(cols)
        page.wait_for_function(f"() => ({cols})() > {before + 30}", timeout=20000)
        assert len(heat_requests) == fetched  # the new columns came over the websocket
        assert page.evaluate("() => document.getElementById('heatmap').data[0].y")[0] == "0.weight"
    finally:
        stop.set()
        t.join()
    assert not page.js_errors


def test_csv_link_downloads_every_point(server, page):
    _logged_run(server.url, "csv", 300)
    page.goto(server.url + "/runs/1")
    page.wait_for_function("() => document.querySelector('a.csv[data-key=loss]').href.includes('series.csv')")
    href = page.locator("a.csv[data-key=loss]").get_attribute("href")
    with urllib.request.urlopen(server.url + href) as resp:
        lines = resp.read().decode().strip().splitlines()
    assert lines[0] == "step,wall_time,value" and len(lines) == 301
    first = lines[1].split(",")
    assert first[0] == "0" and first[2] == "1.0" and float(first[1]) > 1e9


@pytest.mark.parametrize("scheme,width,height", [("dark", 1280, 800), ("light", 2400, 1300)])
def test_run_page_screenshots_follow_colour_scheme(server, browser, scheme, width, height):
    _logged_run(server.url, "shot", 400, values=lambda s: math.nan if s == 300 else 2.0 / (1 + s * 0.05))
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(server.url + "/runs/1")
        page.click("#incident-bar:not([hidden]) > #incident-line")  # the bar opens to its cards
        page.wait_for_selector(".alert[data-kind='nan_loss']")
        page.wait_for_function("() => document.getElementById('chart-loss').data")
        bg = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
        r, g, b = (int(x) for x in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3])
        luminance = (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255
        assert (luminance < 0.25) if scheme == "dark" else (luminance > 0.75), bg
        # Nothing may overflow the page sideways at either width.
        assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"run-{scheme}-{width}.png"), full_page=True)
        page.goto(server.url + "/")
        page.wait_for_selector("tr[data-run='1']")
        page.screenshot(path=str(SHOTS / f"runs-{scheme}-{width}.png"))
        assert not errors
    finally:
        context.close()


def test_long_live_session_stays_bounded_and_keeps_the_spike(server, page, api):
    run = gradwatch.init(project="dash", name="fast", server=server.url, flush_interval=0.05)
    run.log({"loss": 1.0}, step=0)
    wait_runs(api, 1)
    page.goto(server.url + "/runs/1")
    page.wait_for_function("() => { const d = document.getElementById('chart-loss').data; return d && d[0].x.length; }")
    for step in range(1, 20_000):
        run.log({"loss": {15_000: 1e6, 17_000: math.nan}.get(step, 1.0 + (step % 7) * 0.01)}, step=step)
    run.finish(timeout=60)
    page.wait_for_function("() => document.getElementById('run-status').textContent === 'finished'", timeout=30000)
    page.wait_for_function(
        "() => { const x = document.getElementById('chart-loss').data[0].x; return x[x.length - 1] === 19999; }",
        timeout=30000,
    )
    xs, ys = page.evaluate("() => { const t = document.getElementById('chart-loss').data[0]; return [t.x, t.y]; }")
    assert len(xs) <= 8000  # folded back with the envelope, not 20 000 points in the browser
    assert ys[xs.index(15_000)] == 1e6
    markers = page.evaluate("() => { const d = document.getElementById('chart-loss').data; return d[d.length - 1].x; }")
    assert 17_000 in markers
    # The fold itself, on a known series: the spike, the dip, the NaN and both ends survive.
    kept = page.evaluate("""async () => {
        const GW = await import('/static/lib/series.js');
        const n = 50000, s = { steps: [], values: [], walls: [] };
        for (let i = 0; i < n; i++) { s.steps.push(i); s.values.push(i === 123 ? 1e9 : i === 40000 ? -5 : i === 777 ? NaN : 1); s.walls.push(i); }
        const c = GW.compact(s, 400);
        return { n: c.steps.length, spike: c.values[c.steps.indexOf(123)], dip: c.values[c.steps.indexOf(40000)],
                 nan: Number.isNaN(c.values[c.steps.indexOf(777)]), first: c.steps[0], last: c.steps[c.steps.length - 1] };
    }""")
    assert (
        kept == {"n": kept["n"], "spike": 1e9, "dip": -5, "nan": True, "first": 0, "last": 49_999} and kept["n"] <= 420
    )
    assert not page.js_errors


def test_compare_page_catches_up_after_a_server_restart(settings, browser, tmp_path):
    """Points logged while the page's websockets were down are refetched when they reconnect."""
    import dataclasses

    from test_reliability import free_port

    from gradwatch_server.serve import BackgroundServer

    cfg = dataclasses.replace(settings, port=free_port())
    srv = BackgroundServer(cfg).start()
    run = gradwatch.init(project="dash", name="restarts", server=srv.url, flush_interval=0.05)
    for step in range(20):
        run.log({"loss": 1.0}, step=step)
    assert run.recorder.flush(10)
    page = browser.new_page()
    try:
        page.goto(srv.url + "/compare?ids=1&keys=loss")
        page.wait_for_function(
            "() => { const e = document.getElementById('chart-0'); return e && e.data && e.data[0].x.length === 20; }"
        )
        srv.stop()
        for step in range(20, 60):
            run.log({"loss": 2.0}, step=step)
        srv = BackgroundServer(cfg).start()
        assert run.recorder.flush(20)
        page.wait_for_function("() => document.getElementById('chart-0').data[0].x.length === 60", timeout=30000)
    finally:
        run.finish(timeout=10)
        page.close()
        srv.stop()


def test_show_step_on_an_alert_zooms_every_chart_to_it(server, page):
    def value(step):
        return math.nan if step == 3_000 else 1.0 + (step % 10) * 0.01

    _logged_run(server.url, "to-diagnose", 6_000, values=value)
    page.goto(server.url + "/runs/1")
    page.click("#incident-bar:not([hidden]) > #incident-line")  # the bar opens to its cards
    page.wait_for_selector(".alert[data-kind='nan_loss'] button.zoom-to")
    page.click(".alert[data-kind='nan_loss'] button.zoom-to")
    page.wait_for_function(
        "() => { const x = document.getElementById('chart-loss').data[0].x;"
        " return x.length === 101 && x[0] === 2950; }",
        timeout=10000,
    )
    # Every chart fetches its own range: wait for the other charts too, then check them.
    page.wait_for_function(
        "() => { const x = document.getElementById('metric-acc').data[0].x; return x.length === 101; }", timeout=10000
    )
    acc = page.evaluate("() => document.getElementById('metric-acc').data[0].x")
    assert acc[0] >= 2950 and acc[-1] <= 3050 and len(acc) == 101  # the other charts followed
    markers = page.evaluate("() => { const d = document.getElementById('chart-loss').data; return d[d.length - 1].x; }")
    assert markers == [3000]
    assert not page.js_errors


def test_compare_grid_of_shared_metrics_summary_markers_and_missing_ids(server, browser):
    _logged_run(server.url, "steady", 40, values=lambda s: 1.0 / (s + 1))
    run = gradwatch.init(project="dash", name="blows up", server=server.url)
    for step in range(40):
        run.log({"loss": math.nan if step == 30 else 0.5 * 2.0**step, "acc": 0.1, "val/only-here": 1.0}, step=step)
    run.finish(timeout=30)
    context = browser.new_context(viewport={"width": 2200, "height": 1200})
    page = context.new_page()
    try:
        page.goto(server.url + "/compare?ids=1,2,99")
        page.wait_for_function("() => document.querySelectorAll('#summary tr[data-run]').length === 2")
        assert "Run 99 does not exist" in page.locator("#missing").inner_text()
        keys = page.evaluate("() => [...document.querySelectorAll('.panel-key')].map(s => s.value)")
        assert keys == ["loss", "acc"]  # every shared metric, loss first; val/only-here is not shared
        page.wait_for_function("() => (document.getElementById('chart-0').layout || {}).shapes?.length > 0")
        colors = page.evaluate(
            "async () => { const m = await import('/static/lib/plot.js'); return [m.colorFor(1), m.colorFor(2)]; }"
        )
        shapes = page.evaluate("() => document.getElementById('chart-0').layout.shapes.map(s => [s.x0, s.line.color])")
        assert [30, colors[1]] in shapes  # the NaN alert, in the diverging run's colour
        # 12 decades for one run, under 2 for the other: a log axis would squeeze the steady one flat, so
        # the axis stays linear, fitted to the run in range (the one blowing up leaves it where it does).
        yaxis = page.evaluate("() => document.getElementById('chart-0').layout.yaxis")
        assert yaxis["type"] == "linear" and yaxis["range"][1] < 2
        row = page.locator("#summary tr[data-run='1']")
        assert row.locator(".best-loss").inner_text() == "0.025" and row.locator(".last-loss").inner_text() == "0.025"
        assert page.locator("#summary tr[data-run='2'] .alert-total").inner_text() != "0"
        assert page.evaluate("() => document.querySelector('main').getBoundingClientRect().width") > 2100  # full width
        page.goto(server.url + "/compare?ids=98")
        page.wait_for_selector("#missing:has-text('Run 98 does not exist')")
        assert "Nothing to compare" in page.locator("#panels").inner_text()
    finally:
        context.close()


def test_runs_list_neutral_colours_disabled_compare_and_loss_sparklines(server, page):
    _logged_run(server.url, "one", 30)
    _logged_run(server.url, "two", 30, values=lambda s: 10.0 - s * 0.1)
    page.goto(server.url + "/")
    page.wait_for_selector("tr[data-run='2'] svg.spark polyline")
    assert page.locator("tr[data-run='2'] .latest-loss").inner_text() == "7.1"
    assert page.locator("tr[data-run='1'] .latest-loss").inner_text() == "0.033333"
    button = page.locator("#compare")
    assert button.is_disabled()
    style = "() => { const s = getComputedStyle(document.getElementById('compare')); return [s.cursor, s.backgroundColor]; }"
    cursor, background = page.evaluate(style)
    assert cursor == "not-allowed" and background != "rgb(47, 111, 237)"  # not the enabled blue
    page.locator("tr[data-run='1'] input[type=checkbox]").check()
    assert button.is_enabled() and page.evaluate(style)[0] == "pointer"
    hues = page.evaluate("""async () => (await import('/static/lib/plot.js')).PALETTE.map(c => {
        const [r, g, b] = [1, 3, 5].map(i => parseInt(c.slice(i, i + 2), 16) / 255), max = Math.max(r, g, b), min = Math.min(r, g, b);
        if (max - min < 0.15) return -1;  // a grey
        const h = max === r ? ((g - b) / (max - min)) % 6 : max === g ? (b - r) / (max - min) + 2 : (r - g) / (max - min) + 4;
        return (h * 60 + 360) % 360; })""")
    assert all(h == -1 or 170 <= h <= 320 for h in hues), hues  # no red, orange, yellow or green
    assert not page.js_errors


def test_a_real_recurring_nan_shows_as_one_card_with_its_count(server, page, api):
    """A loss that goes NaN, recovers for a long stretch, and goes NaN again: the server folds the second
    episode into the first alert (count 2, last step moved on) and the page shows one card for it."""

    def value(step):
        return math.nan if step in (100, 400) else 1.0 + (step % 10) * 0.01

    _logged_run(server.url, "nan-twice", 500, values=value)
    alerts = [a for a in api.get("/api/runs/1/alerts") if a["kind"] == "nan_loss"]
    assert len(alerts) == 1 and alerts[0]["count"] == 2 and alerts[0]["step"] == 100 and alerts[0]["last_step"] == 400
    page.goto(server.url + "/runs/1")
    page.click("#incident-bar:not([hidden]) > #incident-line")  # the bar opens to its cards
    card = page.locator(".alert[data-kind='nan_loss']")
    card.wait_for()
    assert card.count() == 1 and card.get_attribute("data-count") == "2"
    assert "2×" in card.inner_text() and "100" in card.inner_text()
