"""The pages in real Chromium: live charts grow, alerts show, user data stays text."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import Api, wait_runs
from training import train_slowly

import gradwatch

pytestmark = pytest.mark.browser

POINTS_JS = """() => { const d = document.getElementById('chart-loss').data;
  return d ? d[0].x.length : 0; }"""


def test_run_page_chart_grows_while_logging(server, page):
    stop = threading.Event()
    # the run goes on until the test has seen its chart grow (a loaded machine draws late)
    t = threading.Thread(target=train_slowly, args=(server.url, 100_000, stop))
    t.start()
    try:
        wait_runs(Api(server.url))
        page.goto(server.url + "/runs/1")
        page.wait_for_function(
            "() => { const d = document.getElementById('chart-loss').data; return d && d[0] && d[0].x.length > 0; }",
            timeout=15000,
        )
        first = page.evaluate(POINTS_JS)
        page.wait_for_function(
            f"() => document.getElementById('chart-loss').data[0].x.length > {first + 20}", timeout=15000
        )
        assert page.evaluate(POINTS_JS) > first + 20
        assert page.locator("#run-status").inner_text() == "running"
    finally:
        stop.set()
        t.join()
    page.wait_for_function("() => document.getElementById('run-status').textContent === 'finished'", timeout=15000)
    heat_layers = page.evaluate("() => document.getElementById('heatmap').data[0].y")
    assert heat_layers == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert not page.js_errors


def test_nan_alert_appears_live_with_marker(server, page):
    page.goto(server.url + "/")
    stop = threading.Event()
    t = threading.Thread(target=train_slowly, args=(server.url, 60, stop, "nan-run", 30))
    t.start()
    page.wait_for_selector("tr[data-run='1'] a", timeout=15000)
    # The runs list raises its own banner and badge live, without a reload.
    page.wait_for_selector("#attention .alert[data-kind='nan_loss'][data-run='1']", timeout=20000)
    assert "nan-run" in page.locator("#attention .alert").first.inner_text()
    assert page.locator("tr[data-run='1'] .badge").inner_text() == "1"
    page.goto(server.url + "/runs/1")
    page.click("#incident-bar:not([hidden]) > #incident-line", timeout=20000)  # the bar opens to its cards
    page.wait_for_selector(".alert[data-kind='nan_loss']", timeout=20000)
    t.join()
    text = page.locator(".alert[data-kind='nan_loss']").inner_text()
    assert "step 30" in text and "NaN" in text
    # The NaN point is drawn as a visible marker trace, not a silent gap.
    page.wait_for_function(
        """() => { const d = document.getElementById('chart-loss').data;
        return d && d[d.length - 1].x.includes(30); }""",
        timeout=10000,
    )
    assert not page.js_errors


def test_runs_list_renders_user_data_as_text(server, page, api):
    evil = "<img src=x onerror=window.pwned=1>"
    run = gradwatch.init(
        project="<b>proj</b>", name=evil, config={"<script>": "<i>x</i>"}, server=server.url, tags=["<u>t</u>"]
    )
    run.log({"loss": 1.0})
    run.finish()
    page.goto(server.url + "/")
    page.wait_for_selector("tr[data-run='1']")
    assert page.locator("tr[data-run='1'] a").inner_text() == evil
    assert page.evaluate("() => window.pwned") is None
    page.goto(server.url + "/runs/1")
    page.wait_for_selector("#config dt")
    assert page.locator("#config dt").first.inner_text() == "<script>"
    assert page.evaluate("() => window.pwned") is None
    assert not page.js_errors


def _log_live(url, steps, stop, keys=("loss", "acc"), every=0.02, name="live"):
    """A run logging plain numbers at ~50 steps/s until ``stop`` (no model: fast and light)."""
    run = gradwatch.init(project="browser", name=name, server=url, flush_interval=0.05)
    for step in range(steps):
        if stop.is_set():
            break
        run.log({k: 1.0 / (step + 1) + i for i, k in enumerate(keys)}, step=step)
        time.sleep(every)
    run.finish()


DRAWS = "(id) => Number(document.getElementById(id).dataset.draws || 0)"
LAST_X = "(id) => { const x = document.getElementById(id).data[0].x; return x[x.length - 1]; }"


def test_charts_out_of_view_skip_live_redraws_and_catch_up(server, page):
    page.set_viewport_size({"width": 1400, "height": 460})  # keeps the metric charts below the fold
    stop = threading.Event()
    t = threading.Thread(target=_log_live, args=(server.url, 2000, stop))
    t.start()
    try:
        wait_runs(Api(server.url))
        page.goto(server.url + "/runs/1")
        page.wait_for_function(
            "() => { const e = document.getElementById('metric-acc'); return e && e.data && e.data[0].x.length; }",
            timeout=15000,
        )
        assert page.evaluate("() => window.scrollY") == 0  # the metric chart is below the fold
        page.wait_for_function(f"() => ({DRAWS})('chart-loss') > 3", timeout=15000)
        loss, acc = page.evaluate(DRAWS, "chart-loss"), page.evaluate(DRAWS, "metric-acc")
        page.wait_for_function(f"() => ({DRAWS})('chart-loss') > {loss + 6}", timeout=15000)
        assert page.evaluate(DRAWS, "metric-acc") <= acc + 1  # at most one catch-up, not a redraw per update
        # Never more than ~5 s behind, even never scrolled to (full-page screenshots, printing): the
        # "Any metric" chart once stayed at step 275 of 399 that way.
        behind = page.evaluate(LAST_X, "metric-acc")
        page.wait_for_function(f"() => ({LAST_X})('metric-acc') > {behind}", timeout=8000)
        assert page.evaluate("() => window.scrollY") == 0
        page.locator("#metric-acc").scroll_into_view_if_needed()
        now = page.evaluate(LAST_X, "metric-acc")
        page.wait_for_function(f"() => ({LAST_X})('metric-acc') > {now + 10}", timeout=5000)  # live again in view
    finally:
        stop.set()
        t.join()
    assert not page.js_errors


def test_background_tab_gets_a_browser_notification_for_an_alert(server, browser):
    context = browser.new_context()
    # Headless Chromium has no notification centre: record what the page asks it to show, and
    # pretend the tab is in the background (the only time the page notifies).
    context.add_init_script("""
        window.__notes = [];
        window.Notification = class { constructor(title, o) { window.__notes.push([title, o.body]); } };
        window.Notification.permission = "granted";
        window.Notification.requestPermission = () => Promise.resolve("granted");
        Object.defineProperty(document, "hidden", { get: () => true });""")
    page = context.new_page()
    # Any alert notifies: a busy machine's pace alert (throughput_drop) before the NaN would be the first note.
    status, body = Api(server.url).request("PUT", "/api/projects/browser/rules", {"disabled": ["throughput_drop"]})
    assert status == 200, body
    try:
        stop, listening = threading.Event(), threading.Event()
        # The NaN waits until the page is open with its chart drawn (it notifies live alerts only).
        t = threading.Thread(
            target=train_slowly, args=(server.url, 260, stop, "bg-run", 200), kwargs={"nan_after": listening}
        )
        t.start()
        wait_runs(Api(server.url))
        page.goto(server.url + "/runs/1")
        page.wait_for_function(
            "() => { const d = document.getElementById('chart-loss').data; return d && d[0].x.length; }"
        )
        assert page.evaluate("() => window.__notes.length") == 0
        listening.set()
        page.wait_for_function("() => window.__notes.length > 0", timeout=20000)
        t.join()
        title, body = page.evaluate("() => window.__notes[0]")
        assert title == "gradwatch: nan_loss in bg-run" and "step 200" in body
    finally:
        listening.set()  # a failed wait must not leave the run waiting
        context.close()


def _console_errors(page):
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def test_run_page_shows_memory_lr_and_every_metric_on_load(server, page, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # not a git checkout: the page must not say "git null"
    from training import train

    run = gradwatch.init(project="browser", name="metrics", server=server.url)
    train(run, steps=30, lr=0.05)  # plain SGD: a constant learning rate
    for i in range(5):
        run.log({"val/acc": 0.5 + i / 10, "train/samples_per_s": 1000.0 + i, "acc": i / 5})
    run.finish(timeout=30)
    errors = _console_errors(page)
    page.goto(server.url + "/runs/1")
    page.wait_for_function("() => document.getElementById('memory-breakdown').textContent.includes('parameters')")
    lo, hi = page.evaluate("() => document.getElementById('chart-lr').layout.yaxis.range")
    assert 0 < lo < 0.05 < hi < 0.1  # centred on the value, not -0.999..1.001
    sections = page.evaluate("() => [...document.querySelectorAll('.metric-section')].map(s => s.dataset.prefix)")
    hooks = ("perf", "signals", "system")  # watch()'s own sections: step time, signal summaries, the machine
    assert [s for s in sections if s not in hooks] == ["", "train", "val"]
    page.wait_for_function(
        "() => ['acc', 'val/acc', 'train/samples_per_s'].every(k => (document.getElementById('metric-' + k).data || [])"
        ".some(t => t.x.length === 5))"
    )
    assert page.locator("#metric-loss").count() == 0  # loss has its own chart at the top
    assert "git" not in page.locator("#meta dt").all_inner_texts() and "null" not in page.locator("#meta").inner_text()
    assert page.evaluate("() => fetch('/favicon.ico').then(r => r.status)") == 200
    assert not errors and not page.js_errors


def test_diverging_loss_gets_log_y_with_readable_ticks(server, page):
    run = gradwatch.init(project="browser", name="diverges", server=server.url)
    for step in range(200):
        run.log({"loss": 0.5 * 1.1**step}, step=step)  # 0.5 -> ~1e8
    run.finish(timeout=30)
    page.goto(server.url + "/runs/1")
    page.wait_for_function("() => (document.getElementById('chart-loss').layout || {}).yaxis")
    assert page.evaluate("() => document.getElementById('chart-loss').layout.yaxis.type") == "log"
    assert page.locator("#loss-log").is_checked() and "decades" in page.locator("#loss-log-note").inner_text()
    labels = page.locator("#chart-loss .ytick text").all_text_contents()
    assert 3 <= len(labels) <= 8, labels  # a label per decade or two, not "2 3 4 ... 9" in every decade
    page.uncheck("#loss-log")
    page.wait_for_function("() => document.getElementById('chart-loss').layout.yaxis.type === 'linear'")
    assert page.locator("#loss-log-note").inner_text() == ""


def test_names_given_to_plotly_are_shown_as_text(server, page):
    evil = "<b>x</b><img src=x onerror=window.pwned=1>"
    for name in (evil, "plain"):
        run = gradwatch.init(project="browser", name=name, server=server.url)
        for step in range(5):
            run.log({"loss": 1.0, "<i>key</i>": 2.0 + step}, step=step)  # changing: a chart, not a value
        run.finish(timeout=30)
    page.goto(server.url + "/runs/1")
    page.wait_for_function("() => document.querySelector('[data-key=\"<i>key</i>\"] .legendtext')")
    assert page.locator("[data-key='<i>key</i>'] .legendtext").text_content() == "<i>key</i>"  # not italic "key"
    page.goto(server.url + "/compare?ids=1,2")
    page.wait_for_selector("#chart-0 .legendtext")
    assert evil + " #1" in page.locator("#chart-0 .legendtext").all_text_contents()
    assert page.evaluate("() => window.pwned") is None and not page.js_errors


def test_alerts_group_by_kind_and_updates_replace(server, page):
    _finished = gradwatch.init(project="browser", name="a", server=server.url)
    _finished.log({"loss": 1.0})
    _finished.finish(timeout=30)
    page.goto(server.url + "/runs/1")
    page.wait_for_selector("#run-name:has-text('a')")
    out = page.evaluate("""async () => {
        const A = await import('/static/lib/alerts.js');
        const alerts = [], div = document.createElement('div');
        A.upsert(alerts, { id: 1, kind: 'exploding_gradients', step: 10, message: 'first cause', severity: 'warning' });
        A.upsert(alerts, { id: 2, kind: 'nan_loss', step: 30, count: 3, last_step: 50, message: 'nan', severity: 'critical' });
        A.upsert(alerts, { id: 3, kind: 'exploding_gradients', step: 40, message: 'again', severity: 'warning' });
        const isNew = A.upsert(alerts, { id: 2, kind: 'nan_loss', step: 30, count: 5, last_step: 80, message: 'nan', severity: 'critical' });
        A.renderAlerts(div, alerts, () => {});
        return { isNew, n: alerts.length, cards: [...div.children].map(c => [c.dataset.kind, c.dataset.count, c.querySelector('.alert-steps').textContent, c.querySelector('.alert-first').textContent]) };
    }""")
    assert out["isNew"] is False and out["n"] == 3
    assert out["cards"] == [
        ["exploding_gradients", "2", "steps 10–40 · ", "first cause"],
        ["nan_loss", "5", "steps 30–80 · ", "nan"],
    ]


def test_heatmap_says_when_its_request_failed(server, page):
    from training import train

    run = gradwatch.init(project="browser", name="watched", server=server.url)
    train(run, steps=10)
    run.finish(timeout=30)
    page.route(
        "**/heatmap?*",
        lambda route: route.fulfill(status=500, content_type="application/json", body='{"error": "boom"}'),
    )
    page.goto(server.url + "/runs/1")
    page.wait_for_selector("#heatmap p.failed")
    assert "Could not load" in page.locator("#heatmap").inner_text() and "boom" in page.locator("#heatmap").inner_text()


def test_out_of_order_points_are_held_back_the_same_way_everywhere(server, page):
    page.goto(server.url + "/")
    out = page.evaluate("""async () => {
        const { appendPoints } = await import('/static/lib/series.js');
        const s = { steps: [1, 2], values: [1, 1], walls: [0, 0] };
        const a = appendPoints(s, { steps: [2, 3, 1, 4], values: [9, 3, 9, 'NaN'], wall_times: [0, 0, 0, 0] });
        return [a.from, a.late, s.steps, Number.isNaN(s.values[3])];
    }""")
    assert out == [2, 2, [1, 2, 3, 4], True]


def _hf_like_run(url):
    """A finished run shaped like a Hugging Face one: a spiking loss, one-point and constant metrics,
    the Trainer's bookkeeping, a nested config with a boolean whose name contains "token"."""
    run = gradwatch.init(
        project="pages",
        name="hf-like",
        server=url,
        config={
            "args": {"learning_rate": 5e-5, "include_num_input_tokens_seen": False, "lr_scheduler_kwargs": {"a": 1}},
            "model": {"n_layer": 2, "architectures": ["GPT2LMHeadModel"]},
        },
    )
    for step in range(40):
        run.log({"loss": 1e5 if step == 20 else 3.0, "flag": 1.0}, step=step)
    run.log({"eval_accuracy": 0.52}, step=39)
    run.log({"train_runtime": 12.5, "total_flos": 1e12, "train_samples_per_second": 80.0, "epoch": 1.0}, step=39)
    run.finish(timeout=10)


def test_run_page_on_a_real_shaped_run(server, page):
    _hf_like_run(server.url)
    page.goto(server.url + "/runs/1")
    page.wait_for_function("() => document.getElementById('chart-loss').data?.length >= 2", timeout=15000)
    # Smoothing (0.6 by default) never shows values the spike never had once it ended: a few steps
    # after it the smoothed line is back at the raw 3, not ~1e4.
    smoothed = page.evaluate("() => document.getElementById('chart-loss').data[1].y")
    assert smoothed[19] == 3.0 and 1e4 < smoothed[20] < 1e5  # the spike shows, softened
    assert all(v == 3.0 for v in smoothed[23:]), smoothed[20:30]  # TensorBoard's EMA would still be ~2,000 here
    # One point is a marker, not an empty chart.
    page.wait_for_selector("[data-key='eval_accuracy'] .js-plotly-plot")
    mode = page.evaluate("() => document.getElementById('metric-eval_accuracy').data[0].mode")
    assert mode == "markers"
    # A metric that never changed is a value, not a flat line.
    assert page.locator("[data-key='flag'] .scalar-value").inner_text() == "1"
    # The Trainer's bookkeeping waits in a collapsed section, after the others.
    book = page.locator("details.bookkeeping")
    assert not book.evaluate("d => d.open")
    for key in ("train_runtime", "total_flos", "train_samples_per_second", "epoch"):
        assert book.locator(f"[data-key='{key}']").count() == 1
    assert page.locator("#metrics > :last-child").evaluate("s => s.classList.contains('bookkeeping')")
    # The nested config is a tree; a boolean is shown as itself, not as ***.
    args = page.locator("#config details[data-key='args']")
    assert args.locator("> summary").inner_text() == "3 entries"
    args.locator("> summary").click()
    text = args.inner_text()
    assert "include_num_input_tokens_seen" in text and "false" in text and "***" not in text
    assert "GPT2LMHeadModel" in page.locator("#config details[data-key='model']").text_content()
    assert page.locator("#run-step").inner_text() == "step 39"
    assert not page.js_errors


def test_compare_config_of_three_nested_configs_stays_in_its_column(server, page):
    for i in range(3):
        run = gradwatch.init(
            project="pages",
            name=f"hf-{i}",
            server=server.url,
            config={"args": {"learning_rate": 10.0**-i, "output_dir": "/very/long/path/" * 8 + str(i)}},
        )
        run.log({"loss": 1.0})
        run.finish(timeout=10)
    page.goto(server.url + "/compare?ids=1,2,3")
    page.wait_for_selector("#diff tr.differs")
    keys = page.locator("#diff tr td:first-child").all_inner_texts()
    assert "args.learning_rate" in keys and "args.output_dir" in keys  # nested config diffed key by key
    fits = page.evaluate(
        "() => { const t = document.getElementById('diff'); return t.scrollWidth <= t.parentElement.clientWidth; }"
    )
    assert fits
    assert not page.js_errors
