"""The runs table on a sweep in real Chromium: config columns by default, the filter language, summary columns,
sorting, state in the URL, and 10,000 runs windowed."""

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


def test_table_columns_filter_sort_and_url(server, page):
    _small_sweep(server.url)
    page.goto(server.url + "/")
    page.wait_for_selector("tr[data-run='6']")
    heads = page.eval_on_selector_all("#runs th.extra", "els => els.map(e => e.dataset.col)")
    assert heads == ["config.lr", "config.optimizer"]  # the keys that differ; epochs does not
    assert page.locator("tr[data-run='1'] td[data-col='config.lr']").inner_text() == "1.000e-4"

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
    page.click("#runs th[data-col='summary.val/loss.min']")  # then ascending: the best run on top
    assert names(page)[0] == "adam-0.0001" and names(page)[-1] == "sgd-0.01"
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


def test_table_groups_with_aggregated_summaries_then_compares_the_groups(server, page):
    _small_sweep(server.url)
    page.goto(server.url + "/?cols=config.lr,summary.val/loss.min")
    page.wait_for_selector("tr[data-run='6']")
    page.select_option("#group-by", "optimizer")
    page.wait_for_selector("#runs tr.group-row")
    groups = page.eval_on_selector_all("#runs tr.group-row", "els => els.map(e => e.dataset.group)")
    assert sorted(groups) == ["adam", "sgd"] and page.locator("#runs tr[data-run]").count() == 0
    adam = page.locator("#runs tr.group-row[data-group='adam']")
    assert "3 runs" in adam.inner_text() and adam.locator("td[data-col='config.lr']").inner_text() == "mixed"
    cell = adam.locator("td[data-col='summary.val/loss.min']").inner_text()
    mins = [1 / 30 + lr for lr in (1e-4, 1e-3, 1e-2)]
    mean = sum(mins) / 3
    assert cell.startswith(f"{mean:.5g}"[:6]) and " ± " in cell, cell
    page.click("#runs th[data-col='summary.val/loss.min']")  # descending: sgd (worse) first
    assert page.eval_on_selector_all("#runs tr.group-row", "els => els.map(e => e.dataset.group)") == ["sgd", "adam"]
    assert "group=optimizer" in page.url
    page.click("#compare-groups")
    page.wait_for_function("() => document.getElementById('group-chart')?.dataset.groups === '2'", timeout=20000)
    names = page.evaluate("() => document.getElementById('group-chart').data.filter(t => t.name).map(t => t.name)")
    assert names == ["optimizer=adam (n=3)", "optimizer=sgd (n=3)"]
    assert not page.js_errors


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
    assert [t["name"] for t in lines] == [f"lr={lr:g} (n=24)" for lr in sweep_data.LRS]
    assert sum(1 for t in data if t["fill"] == "tonexty") == 5  # one band per group
    assert len({t["color"] for t in lines}) == 5
    # a numeric group key on "auto" colours: a sequential scale (rgb interpolation), not categorical hues
    assert all(t["color"].startswith("rgb(") for t in lines)

    page.select_option("#g-group", "optimizer")
    page.wait_for_function("() => document.getElementById('group-chart').dataset.groups === '3'", timeout=20000)
    names = page.evaluate("() => document.getElementById('group-chart').data.filter(t => t.name).map(t => t.name)")
    assert names == ["optimizer=adam (n=40)", "optimizer=adamw (n=40)", "optimizer=sgd (n=40)"]
    assert "group=optimizer" in page.url

    page.select_option("#x-mode", "tokens")  # any metric as the x axis
    page.wait_for_function(
        "() => { const d = document.getElementById('group-chart').data; return d && d[d.length - 1].x[5] > 1000; }",
        timeout=20000,
    )
    assert page.locator("#sweep-count").inner_text() == "120 of 120"
    page.wait_for_function("() => document.getElementById('parcoords').data?.[0]?.type === 'parcoords'")
    labels = page.evaluate("() => document.getElementById('parcoords').data[0].dimensions.map(d => d.label)")
    assert labels == ["batch_size", "log10 lr", "optimizer", "seed", "val/loss min"]
    # brushing an axis (as a drag does: a constraint range on a dimension) filters the runs table
    page.evaluate("() => Plotly.restyle('parcoords', {'dimensions[2].constraintrange': [[-0.1, 0.1]]})")
    page.wait_for_function("() => document.getElementById('sweep-count').textContent.startsWith('40 of 120')")
    assert not page.js_errors


def test_ids_with_group_and_a_bad_filter(points_server, page):
    page.goto(points_server.url + "/compare?ids=1,2,3,4,5,6&group=optimizer&key=loss&band=minmax&agg=median")
    page.wait_for_function("() => document.getElementById('group-chart')?.dataset.groups === '3'", timeout=20000)
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


def test_compare_of_a_run_that_has_not_logged_yet_gets_its_charts_when_data_comes(server, page):
    done = gradwatch.init(project="c", name="done", server=server.url)
    for step in range(10):
        done.log({"loss": 1.0 / (step + 1)}, step=step)
    done.finish(timeout=30)
    fresh = gradwatch.init(project="c", name="fresh", server=server.url)
    wait_runs(Api(server.url), 2)
    page.goto(server.url + "/compare?ids=1,2")
    page.wait_for_selector(".empty-compare")
    for step in range(10):
        fresh.log({"loss": 2.0 / (step + 1)}, step=step)
    page.wait_for_function(
        "() => { const e = document.getElementById('chart-0'); return e && e.data && e.data.length >= 2; }",
        timeout=20000,
    )
    assert page.locator(".panel-key").first.input_value() == "loss" and "keys=loss" in page.url
    fresh.finish(timeout=30)
    assert not page.js_errors
