"""The runs table on a sweep in real Chromium: config columns by default, the filter language, summary columns,
sorting (with its arrow), state in the URL, group rows under their headers (expandable, in numeric order), the
project scoping the counts, banner and pickers, the table within a 1440 px window, 10,000 runs windowed, and
the grouped compare's parallel coordinates (metric summary, log axes, seeds)."""

from __future__ import annotations

import time
import urllib.parse

import pytest
import sweep_data
from conftest import Api, wait_runs

import gradwatch
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings

pytestmark = pytest.mark.browser


def _small_sweep(url: str) -> None:
    for lr in (1e-4, 1e-3, 1e-2):
        for opt in ("adam", "sgd"):
            config = {"lr": lr, "optimizer": opt, "epochs": 3}  # epochs is the same everywhere: no column
            run = gradwatch.init(project="sweep", name=f"{opt}-{lr:g}", server=url, config=config)
            for step in range(30):
                v = 1.0 / (step + 1) + lr * (5 if opt == "sgd" else 1)
                run.log({"loss": 2 * v, "val/loss": v}, step=step)
            run.finish(timeout=30)


def names(page) -> list[str]:
    return page.eval_on_selector_all("#runs tbody tr[data-run] td:nth-child(2) a", "els => els.map(e => e.textContent)")


def arrow(page, th: str) -> str:
    """The sort arrow a header shows (its ::after content), "" for none."""
    return page.evaluate(
        f"() => getComputedStyle(document.querySelector(\"#runs {th}\"), '::after').content.replace(/[\"\\s\\u00a0]/g, '')"
        ".replace('none', '')"
    )


# The columns of a row, by header: which header each of the row's cells sits under (colspans counted).
UNDER_HEADERS = """(tr) => {
  const heads = [...document.querySelectorAll('#runs thead th')].filter(th => getComputedStyle(th).display !== 'none');
  const cells = [...tr.children].filter(td => getComputedStyle(td).display !== 'none');
  const out = {}; let i = 0;
  for (const td of cells) { const th = heads[i]; out[td.dataset.col || i] = th ? (th.dataset.col || th.dataset.sort || '') : null;
    i += td.colSpan || 1; }
  return { cells: i, heads: heads.length, under: out,
    lefts: cells.map((td, k) => Math.abs(td.getBoundingClientRect().left - heads[k].getBoundingClientRect().left) < 1) };
}"""


def test_table_columns_filter_sort_and_url(server, page):
    _small_sweep(server.url)
    page.goto(server.url + "/")
    page.wait_for_selector("tr[data-run='6']")
    heads = page.eval_on_selector_all("#runs th.extra", "els => els.map(e => e.dataset.col)")
    assert heads == ["config.lr", "config.optimizer"]  # the keys that differ; epochs does not
    assert page.locator("tr[data-run='1'] td[data-col='config.lr']").inner_text() == "1e-4"  # the one format

    page.fill("#f-where", 'config.optimizer == "adam" and config.lr <= 1e-3')
    page.press("#f-where", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#runs tbody tr[data-run]').length === 2")
    assert sorted(names(page)) == ["adam-0.0001", "adam-0.001"]
    assert "where=config.optimizer" in urllib.parse.unquote_plus(page.url)

    page.fill("#f-where", "config.lr <")
    page.press("#f-where", "Enter")
    page.wait_for_selector("#where-error:not([hidden])")
    assert "at column 12" in page.locator("#where-error").inner_text()
    page.fill("#f-where", "")
    page.press("#f-where", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#runs tbody tr[data-run]').length === 6")
    assert page.locator("#where-error").is_hidden()

    page.select_option("#add-column", "summary.val/loss.min")
    cell = "tr[data-run='1'] td[data-col='summary.val/loss.min']"
    page.wait_for_function(f"() => document.querySelector(\"{cell}\")?.textContent !== ''")
    page.click("#runs th[data-col='summary.val/loss.min']")  # descending first
    assert arrow(page, "th[data-col='summary.val/loss.min']") == "▼"
    page.click("#runs th[data-col='summary.val/loss.min']")  # then ascending: the best run on top
    assert names(page)[0] == "adam-0.0001" and names(page)[-1] == "sgd-0.01"
    assert arrow(page, "th[data-col='summary.val/loss.min']") == "▲" and arrow(page, "th[data-sort='name']") == ""
    shared = page.url
    assert "sort=summary.val" in urllib.parse.unquote(shared) and "cols=" in shared

    page.goto(shared)  # the link brings back the same table
    page.wait_for_selector(cell)
    assert names(page)[0] == "adam-0.0001"
    heads = page.eval_on_selector_all("#runs th.extra", "els => els.map(e => e.dataset.col)")
    assert heads == ["config.lr", "config.optimizer", "summary.val/loss.min"]
    page.click("#runs th[data-col='config.optimizer'] .col-remove")
    assert page.locator("#runs th[data-col='config.optimizer']").count() == 0
    assert not page.js_errors


def test_table_groups_line_up_expand_order_numerically_then_compare(server, page):
    _small_sweep(server.url)
    page.goto(server.url + "/?cols=config.lr,config.optimizer,summary.val/loss.min")
    page.wait_for_selector("tr[data-run='6']")
    page.select_option("#group-by", "optimizer")
    page.wait_for_selector("#runs tr.group-row")
    groups = page.eval_on_selector_all("#runs tr.group-row", "els => els.map(e => e.dataset.group)")
    assert groups == ["adam", "sgd"] and page.locator("#runs tr[data-run]").count() == 0
    adam = page.locator("#runs tr.group-row[data-group='adam']")
    assert "3 runs" in adam.inner_text()
    assert adam.locator("td[data-col='config.lr']").inner_text() == "1e-4 – 0.01"  # the range, in the one format
    assert adam.locator("td[data-col='config.optimizer']").inner_text() == "adam"
    cell = adam.locator("td[data-col='summary.val/loss.min']").inner_text()
    mins = [1 / 30 + lr for lr in (1e-4, 1e-3, 1e-2)]
    mean = sum(mins) / 3
    assert cell.startswith(f"{mean:.5g}"[:6]) and " ± " in cell, cell
    # Every cell of a group row sits under its own header: as many cells as headers, left edges aligned.
    layout = adam.evaluate(UNDER_HEADERS)
    assert layout["cells"] == layout["heads"] and all(layout["lefts"]), layout
    for col in ("config.lr", "config.optimizer", "summary.val/loss.min"):
        assert layout["under"][col] == col
    page.click("#runs th[data-col='summary.val/loss.min']")  # descending: sgd (worse) first
    assert page.eval_on_selector_all("#runs tr.group-row", "els => els.map(e => e.dataset.group)") == ["sgd", "adam"]
    assert "group=optimizer" in page.url

    # A group row expands to its runs (right under it, same columns) and collapses again.
    adam.click()
    page.wait_for_selector("#runs tr.in-group[data-run]")
    rows = page.eval_on_selector_all(
        "#runs tbody tr", "els => els.map(e => e.dataset.group || (e.dataset.run && 'run:' + e.dataset.run))"
    )
    assert rows[:2] == ["sgd", "adam"] and sorted(rows[2:]) == ["run:1", "run:3", "run:5"], rows
    run_row = page.locator("#runs tr[data-run='1']").evaluate(UNDER_HEADERS)
    assert run_row["cells"] == run_row["heads"] and all(run_row["lefts"])
    assert page.locator("#runs tr.group-row[data-group='adam'] .group-toggle").get_attribute("aria-expanded") == "true"
    page.locator("#runs tr.group-row[data-group='adam']").click()
    page.wait_for_function("() => !document.querySelector('#runs tr[data-run]')")

    # Numeric group values in numeric order (as strings 0.001 < 0.01 < 1e-4 would come first).
    page.select_option("#group-by", "lr")
    page.wait_for_selector("#runs tr.group-row[data-group='1e-4']")
    page.click("#runs th[data-sort='created_at']")  # a run field the groups do not aggregate: by value, ascending
    lrs = page.eval_on_selector_all("#runs tr.group-row", "els => els.map(e => e.dataset.group)")
    assert lrs == ["1e-4", "0.001", "0.01"], lrs
    assert page.locator("#runs tr.group-row[data-group='1e-4'] b").inner_text() == "lr = 1e-4"

    page.select_option("#group-by", "optimizer")
    page.wait_for_selector("#runs tr.group-row[data-group='adam']")
    page.click("#compare-groups")
    page.wait_for_function("() => document.getElementById('group-chart')?.dataset.groups === '2'", timeout=20000)
    names = page.evaluate("() => document.getElementById('group-chart').data.filter(t => t.name).map(t => t.name)")
    assert names == ["optimizer = adam (n=3)", "optimizer = sgd (n=3)"]
    assert not page.js_errors


def _other_project(url: str) -> None:
    """A project beside the sweep: other config keys, a run that diverges (an open critical incident)."""
    from test_incidents import spirals_run

    spirals_run(gradwatch.init(project="other", name="other-diverges", server=url, config={"arch": "mlp"}), 3.0)


def test_the_project_scopes_counts_banner_and_pickers(server, page, api):
    _small_sweep(server.url)
    _other_project(server.url)
    wait_runs(api, 7)
    page.goto(server.url + "/")
    page.wait_for_selector("#attention .banner-line[data-run='7']")  # the diverging run needs a look
    assert page.locator("#count").inner_text() == "7 of 7 runs"
    page.goto(server.url + "/?project=sweep&where=" + urllib.parse.quote("config.lr < 1e-2"))
    page.wait_for_function("() => document.getElementById('count').textContent === '4 of 6 runs in sweep'")
    assert page.locator("#attention .banner-line").count() == 0  # the other project's run is not in view
    # The pickers offer what the project's runs have: their config keys, their metrics, no system/* keys.
    page.wait_for_function("() => document.querySelectorAll('#group-by option').length > 1")
    group_by = page.eval_on_selector_all("#group-by option", "els => els.map(e => e.value).filter(Boolean)")
    assert group_by == ["epochs", "lr", "optimizer"]
    columns = page.eval_on_selector_all("#add-column option", "els => els.map(e => e.value).filter(Boolean)")
    assert "config.arch" not in columns and "summary.val/loss.min" in columns
    assert not [c for c in columns if c.startswith("summary.system/")], columns
    assert page.locator("#inbox-link").get_attribute("href") == "/inbox?project=sweep"
    page.select_option("#f-project", "other")
    page.wait_for_function("() => document.getElementById('count').textContent.endsWith('runs in other')")
    page.wait_for_function("() => [...document.querySelectorAll('#group-by option')].some(o => o.value === 'arch')")
    assert page.eval_on_selector_all("#group-by option", "els => els.map(e => e.value).filter(Boolean)") == ["arch"]
    assert not page.js_errors


def test_the_table_fits_a_1440_window_with_its_menu_reachable(server, browser):
    _small_sweep(server.url)
    _other_project(server.url)  # its keys add config columns: the widest default table
    for width, height in ((1440, 900), (1280, 720)):
        ctx = browser.new_context(viewport={"width": width, "height": height})
        try:
            page = ctx.new_page()
            page.goto(server.url + "/?cols=config.arch,config.epochs,config.lr,config.optimizer,summary.val/loss.min")
            page.wait_for_selector("tr[data-run='7'] .spark svg", timeout=20000)
            box = page.locator("#runs").bounding_box()
            assert box["x"] + box["width"] <= width, (width, box)
            assert page.evaluate("() => document.documentElement.scrollWidth") <= width
            page.locator("tr[data-run='1'] .row-menu summary").click()
            for name in ("Rename", "Tags", "Note", "Delete"):
                button = page.locator("tr[data-run='1']").get_by_role("button", name=name)
                b = button.bounding_box()
                assert button.is_visible() and b["x"] >= 0 and b["x"] + b["width"] <= width, (name, b)
        finally:
            ctx.close()


@pytest.fixture
def big_server(tmp_path):
    url = f"sqlite:///{tmp_path / 'big.db'}"
    sweep_data.make(url, 10_000)
    srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=url)).start()
    yield srv
    srv.stop()


def test_ten_thousand_runs_are_windowed_and_sort_on_a_summary(big_server, page):
    Api(big_server.url).get("/api/runs?limit=1")  # server warm
    t = time.perf_counter()
    page.goto(
        big_server.url + "/?cols=config.lr,config.optimizer,summary.val/loss.min&sort=summary.val/loss.min&desc=0"
    )
    page.wait_for_selector("#runs tbody tr[data-run]")
    first_render = time.perf_counter() - t
    assert page.locator("#count").inner_text() == "10000 of 10000 runs"
    rendered = page.locator("#runs tbody tr[data-run]").count()
    assert 10 < rendered < 200, rendered
    best = page.eval_on_selector_all(
        "#runs tbody tr[data-run] td[data-col='summary.val/loss.min']", "els => els.map(e => Number(e.textContent))"
    )
    assert best == sorted(best)
    page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
    page.wait_for_function(
        "() => { const rows = document.querySelectorAll('#runs tbody tr[data-run]');"
        " return rows.length && rows[rows.length - 1] === document.querySelector('#runs tbody').lastElementChild; }"
    )
    assert page.locator("#runs tbody tr[data-run]").count() < 200
    # scrolling stays cheap: each frame rebuilds only the rows in view
    frame_ms = page.evaluate(
        """async () => { const out = []; for (let i = 0; i < 20; i++) {
             const t = performance.now(); window.scrollBy(0, 700);
             await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
             out.push(performance.now() - t); } return out.sort((a, b) => a - b)[10]; }"""
    )
    assert frame_ms < 500, frame_ms  # all 10,000 rows in the DOM take seconds per frame; windowed, tens of ms
    assert first_render < 15, first_render
    assert not page.js_errors


@pytest.fixture
def points_server(tmp_path):
    url = f"sqlite:///{tmp_path / 'pts.db'}"
    sweep_data.make(url, 120, steps=100)
    srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=url)).start()
    yield srv
    srv.stop()


def test_grouped_compare_bands_counts_parcoords_and_metric_x(points_server, page):
    page.goto(points_server.url + "/compare?project=sweep&group=lr&key=val/loss&band=sem")
    page.wait_for_function("() => document.getElementById('group-chart')?.dataset.groups === '5'", timeout=20000)
    data = page.evaluate(
        "() => document.getElementById('group-chart').data.map(t => ({name: t.name, fill: t.fill || '', n: t.y.length,"
        " color: t.line && t.line.color}))"
    )
    lines = [t for t in data if t["name"]]
    assert [t["name"] for t in lines] == [f"lr = {lr} (n=24)" for lr in ("1e-4", "3e-4", "0.001", "0.003", "0.01")]
    assert sum(1 for t in data if t["fill"] == "tonexty") == 5  # one band per group
    assert len({t["color"] for t in lines}) == 5
    # a numeric group key on "auto" colours: a sequential scale (rgb interpolation), not categorical hues
    assert all(t["color"].startswith("rgb(") for t in lines)

    page.select_option("#g-group", "optimizer")
    page.wait_for_function("() => document.getElementById('group-chart').dataset.groups === '3'", timeout=20000)
    names = page.evaluate("() => document.getElementById('group-chart').data.filter(t => t.name).map(t => t.name)")
    assert names == ["optimizer = adam (n=40)", "optimizer = adamw (n=40)", "optimizer = sgd (n=40)"]
    assert "group=optimizer" in page.url

    page.select_option("#x-mode", "tokens")  # any metric as the x axis
    page.wait_for_function(
        "() => { const d = document.getElementById('group-chart').data; return d && d[d.length - 1].x[5] > 1000; }",
        timeout=20000,
    )
    assert page.locator("#sweep-count").inner_text() == "120 of 120"
    page.wait_for_function("() => document.getElementById('parcoords').data?.[0]?.type === 'parcoords'")
    dims = page.evaluate("() => document.getElementById('parcoords').data[0].dimensions")
    # epochs is the same everywhere, seed is left out (the toggle brings it), lr is log-spaced: a log axis
    # whose ticks are the values in the one format
    assert [d["label"] for d in dims] == ["batch_size", "lr (log)", "optimizer", "val/loss min"]
    assert dims[1]["ticktext"] == ["1e-4", "3e-4", "0.001", "0.003", "0.01"]
    assert dims[1]["tickvals"][0] == pytest.approx(-4) and dims[1]["tickvals"][-1] == pytest.approx(-2)
    # brushing an axis (as a drag does: a constraint range on a dimension) filters the runs table
    page.evaluate("() => Plotly.restyle('parcoords', {'dimensions[2].constraintrange': [[-0.1, 0.1]]})")
    page.wait_for_function("() => document.getElementById('sweep-count').textContent.startsWith('40 of 120')")

    # The metric axis: max (or last, or at the reference loss's best step) instead of min, the runs table too.
    page.select_option("#g-field", "max")
    page.wait_for_function(
        "() => document.getElementById('parcoords').data[0].dimensions.at(-1).label === 'val/loss max'", timeout=20000
    )
    got = page.evaluate(
        "() => { const d = document.getElementById('parcoords').data[0].dimensions; return d[d.length - 1].values; }"
    )
    want = {
        r["id"]: r["summary"]["val/loss"]["max"]
        for r in Api(points_server.url).get("/api/runs?columns=summary.val/loss")
    }
    runs = [int(x) for x in page.eval_on_selector_all("#sweep-runs tr[data-run]", "els => els.map(e => e.dataset.run)")]
    assert sorted(got) == pytest.approx(sorted(want.values())) and len(runs) == 120
    assert "field=max" in page.url and page.locator("#sweep-runs th").last.inner_text() == "val/loss max"
    page.select_option("#g-field", "best")
    page.wait_for_function(
        "() => document.getElementById('parcoords').data[0].dimensions.at(-1).label === 'val/loss at best val/loss'",
        timeout=20000,
    )
    page.check("#g-seeds")
    page.wait_for_function(
        "() => document.getElementById('parcoords').data[0].dimensions.some(d => d.label === 'seed')", timeout=20000
    )
    assert "seeds=1" in page.url
    assert not page.js_errors


def test_parcoords_log_axes_hold_a_zero_and_skip_constant_keys(server, page):
    page.goto(server.url + "/")
    dims = page.evaluate(
        """async () => { const { dimensions } = await import('/static/pages/compare/groups.js');
        const runs = [0, 1e-4, 1e-3, 1e-2].map((wd, i) => ({ config: { wd, lr: 10 ** -(i + 1), seed: i, depth: 4,
          width: 64 * (i + 1) }, summary: { loss: { min: 1 / (i + 1) } } }));
        return dimensions(runs, 'summary.loss.min'); }"""
    )
    by = {d["label"]: d for d in dims}
    assert list(by) == ["lr (log)", "wd (log)", "width", "loss min"]  # depth is constant, seed left out
    wd = by["wd (log)"]
    assert wd["ticktext"] == ["0", "1e-4", "0.001", "0.01"]
    assert wd["values"][0] < wd["values"][1] == pytest.approx(-4)  # 0 sits below the smallest, not on it
    assert len(set(wd["values"])) == 4
    assert by["width"]["ticktext"] == ["64", "128", "192", "256"]  # a linear axis, in the one format too
    assert not page.js_errors


def test_ids_with_group_and_a_bad_filter(points_server, page):
    page.goto(points_server.url + "/compare?ids=1,2,3,4,5,6&group=optimizer&key=loss&band=minmax&agg=median")
    page.wait_for_function("() => document.getElementById('group-chart')?.dataset.groups === '3'", timeout=20000)
    # the count is written once the runs list answers, which may come after the chart on a loaded machine
    page.wait_for_function("() => document.getElementById('sweep-count').textContent !== ''", timeout=20000)
    assert page.locator("#sweep-count").inner_text() == "6 of 6"
    page.goto(points_server.url + "/compare?project=sweep&where=config.lr%20%3C&group=lr&key=loss")
    page.wait_for_selector("#missing [data-kind='load-failed']", timeout=20000)
    assert "where at column 12" in page.locator("#missing").inner_text()


def test_ticked_runs_switch_to_another_metric_as_x(server, page):
    for i in range(2):
        run = gradwatch.init(project="x", name=f"r{i}", server=server.url, config={"bs": 32 * (i + 1)})
        for step in range(20):
            run.log({"loss": 1.0 / (step + 1), "tokens": step * 1000.0 * (i + 1)}, step=step)
        run.finish(timeout=30)
    page.goto(server.url + "/compare?ids=1,2&keys=loss")
    page.wait_for_selector("#x-mode option[value='tokens']", state="attached")
    page.select_option("#x-mode", "tokens")
    page.wait_for_function("() => document.getElementById('group-chart')?.dataset.groups === '2'", timeout=20000)
    assert "x=tokens" in page.url and "ids=1%2C2" in page.url
    xs = page.evaluate("() => document.getElementById('group-chart').data[0].x.filter(v => v !== null)")
    assert max(xs) > 30_000  # tokens, not steps: run 2 reaches 38,000
    assert page.locator("#x-mode").input_value() == "tokens"
    assert not page.js_errors


def _a_done_run_and_a_fresh_one(url: str):
    """Run 1 logged ``loss`` and finished; run 2 (returned, open) has logged nothing yet."""
    done = gradwatch.init(project="c", name="done", server=url)
    for step in range(10):
        done.log({"loss": 1.0 / (step + 1)}, step=step)
    done.finish(timeout=30)
    fresh = gradwatch.init(project="c", name="fresh", server=url)
    wait_runs(Api(url), 2)
    return fresh


def _wait_for_both_runs_charted(page) -> None:
    page.wait_for_function(
        "() => { const e = document.getElementById('chart-0'); return e && e.data && e.data.length >= 2; }",
        timeout=20000,
    )


def test_compare_of_a_run_that_has_not_logged_yet_gets_its_charts_when_data_comes(server, page):
    fresh = _a_done_run_and_a_fresh_one(server.url)
    page.goto(server.url + "/compare?ids=1,2")
    page.wait_for_selector(".empty-compare")
    for step in range(10):
        fresh.log({"loss": 2.0 / (step + 1)}, step=step)
    _wait_for_both_runs_charted(page)
    assert page.locator(".panel-key").first.input_value() == "loss" and "keys=loss" in page.url
    fresh.finish(timeout=30)
    assert not page.js_errors


# The page's sockets held back until released: data logged meanwhile sends them no live message.
_HELD_SOCKETS = """
const Real = window.WebSocket;
const held = new Promise((release) => (window.releaseSockets = release));
window.WebSocket = class {
  constructor(url) {
    held.then(() => {
      this.ws = new Real(url);
      for (const name of ["onopen", "onmessage", "onclose"]) this.ws[name] = (ev) => this[name]?.(ev);
    });
  }
  send(data) { this.ws.send(data); }
  close() { this.ws?.close(); }
};
"""


def test_compare_gets_charts_for_data_that_came_before_its_sockets_opened(server, page):
    fresh = _a_done_run_and_a_fresh_one(server.url)
    page.add_init_script(_HELD_SOCKETS)
    page.goto(server.url + "/compare?ids=1,2")
    page.wait_for_selector(".empty-compare")
    for step in range(10):
        fresh.log({"loss": 2.0 / (step + 1)}, step=step)
    assert fresh.flush(timeout=30)  # stored before the page subscribes: no live message will tell it
    page.evaluate("() => window.releaseSockets()")
    _wait_for_both_runs_charted(page)
    fresh.finish(timeout=30)
    assert not page.js_errors


def test_a_group_picked_while_the_last_pick_loads_stays_drawn(points_server, page):
    """Two picks in a row: the first one's lines, held back until the second is drawn, do not replace them."""
    page.goto(points_server.url + "/compare?project=sweep&group=lr&key=val/loss&band=sem")
    page.wait_for_function("() => document.getElementById('group-chart')?.dataset.groups === '5'", timeout=20000)
    held, released = [], []

    def hold(route):
        route.continue_() if released else held.append(route)

    page.route(lambda url: "/api/compare/series?" in url and "group=batch_size" in url, hold)
    page.select_option("#g-group", "batch_size")
    for _ in range(400):  # until its series request is held
        if held:
            break
        page.wait_for_timeout(50)
    assert held
    page.select_option("#g-group", "optimizer")
    page.wait_for_function("() => document.getElementById('group-chart').dataset.groups === '3'", timeout=20000)
    released.append(True)
    for route in held:
        route.continue_()
    page.wait_for_load_state("networkidle")
    page.evaluate("() => new Promise(r => setTimeout(r, 300))")  # batch_size's lines, had they been drawn
    names = page.evaluate("() => document.getElementById('group-chart').data.filter(t => t.name).map(t => t.name)")
    assert names == ["optimizer = adam (n=40)", "optimizer = adamw (n=40)", "optimizer = sgd (n=40)"]
    assert "group=optimizer" in page.url
    assert not page.js_errors


def test_a_filter_entered_while_the_last_one_loads_keeps_its_rows(server, page):
    """Two filters in a row: the first one's answer, held back until the second's rows are shown, does not
    replace them (the table would show runs the filter box does not ask for)."""
    _small_sweep(server.url)
    page.goto(server.url + "/")
    page.wait_for_selector("tr[data-run='6']")
    held, released = [], []

    def hold(route):
        route.continue_() if released else held.append(route)

    page.route(lambda url: "/api/runs?" in url and "sgd" in urllib.parse.unquote_plus(url), hold)
    page.fill("#f-where", 'config.optimizer == "sgd"')
    page.press("#f-where", "Enter")
    for _ in range(400):  # until its request is held
        if held:
            break
        page.wait_for_timeout(50)
    assert held
    page.fill("#f-where", 'config.optimizer == "adam" and config.lr <= 1e-3')
    page.press("#f-where", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#runs tbody tr[data-run]').length === 2")
    released.append(True)
    for route in held:
        route.continue_()
    page.wait_for_load_state("networkidle")
    page.evaluate("() => new Promise(r => setTimeout(r, 300))")  # the sgd rows, had they been drawn
    assert sorted(names(page)) == ["adam-0.0001", "adam-0.001"]
    assert not page.js_errors
