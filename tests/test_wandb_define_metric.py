"""``define_metric`` end to end: a script's definitions (globs too) give the run its min / max / mean / last
summaries (API, runs language, export, runs table) and its charts their x axis (the run page, in Chromium)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradwatch import Api
from gradwatch_server import cli

SCRIPT = Path(__file__).resolve().parent / "define_metric_script.py"
sys.path.insert(0, str(SCRIPT.parent))
import define_metric_script as logged  # noqa: E402  (only its constants: the script runs in a subprocess)


def run_script(server, tmp_path) -> int:
    env = {**os.environ, "GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL_DIR": str(tmp_path / "spool")}
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = Api(server.url).runs(project="define-metric")
    return run.id


def test_define_metric_summaries_reach_the_api_the_runs_language_and_export(server, tmp_path, capsys):
    run_id = run_script(server, tmp_path)
    api = Api(server.url)
    summary = api.run(run_id).run_summary
    assert summary["val/loss"] == pytest.approx(min(logged.VAL_LOSS))  # the glob's "min"
    assert summary["val/acc"] == pytest.approx(max(logged.VAL_ACC))  # its own "max", not the glob's
    assert summary["train/loss"] == pytest.approx(sum(logged.TRAIN_LOSS) / len(logged.TRAIN_LOSS))
    assert summary["train/both"] == {"min": 0.0, "max": 4.0}
    assert summary["train/last"] == pytest.approx(100.0 - 11)
    assert "epoch" not in summary  # defined without a summary: nothing asked for
    assert [r.id for r in api.runs(where="summary.val/loss < 0.6")] == [run_id]  # min 0.5; the last is 0.7
    assert not api.runs(where="summary.val/loss > 0.6")
    assert [r.id for r in api.runs(where="summary.train/loss > 6 and summary.train/loss < 7")] == [run_id]
    listed = api.runs(project="define-metric")[0]
    assert listed.run_summary["val/acc"] == pytest.approx(0.8)

    out = tmp_path / "run.json"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["export", str(run_id), "--format", "json", "--server", server.url, "-o", str(out)])
    assert exit_.value.code == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["run"]["run_summary"]["val/loss"] == pytest.approx(0.5)


def test_the_run_names_each_keys_definition(server, tmp_path):
    run_id = run_script(server, tmp_path)
    defined = server_json(server, f"/api/runs/{run_id}")["defined_metrics"]
    assert defined["val/loss"] == {"step_metric": "epoch", "summary": "min"}
    assert defined["val/acc"]["summary"] == "max" and defined["val/acc"]["step_metric"] == "epoch"
    assert defined["train/loss"] == {"summary": "mean"}
    assert "lr" not in defined and defined["epoch"] == {}


def server_json(server, path: str):
    import httpx

    return httpx.get(server.url + path, timeout=30).json()


@pytest.mark.browser
def test_run_page_draws_a_defined_metric_against_its_step_metric(server, page, tmp_path):
    run_id = run_script(server, tmp_path)
    page.goto(f"{server.url}/runs/{run_id}")
    chart = "document.getElementById('metric-val/acc')"
    page.wait_for_function(f"() => {chart}?.data?.[0]?.x?.length === 3", timeout=30000)
    xs = page.evaluate(f"() => {chart}.data[0].x")
    ys = page.evaluate(f"() => {chart}.data[0].y")
    assert xs == [10, 11, 12] and ys == pytest.approx(logged.VAL_ACC)  # the epoch values, joined by step
    title = page.evaluate(f"() => {chart}.layout.xaxis.title.text")
    assert title == "epoch"
    steps = page.evaluate("() => document.getElementById('metric-train/both').data[0].x")
    assert steps == list(range(12))  # no step_metric: the step axis
    page.select_option("#x-mode", "wall")  # another page axis applies to every chart
    page.wait_for_function(f"() => {chart}.layout.xaxis.title.text !== 'epoch'", timeout=30000)
    summary = dict(
        zip(page.locator("#run-summary dt").all_inner_texts(), page.locator("#run-summary dd").all_inner_texts())
    )
    assert float(summary["val/acc"]) == pytest.approx(0.8)
    page.goto(f"{server.url}/?cols=summary.val/loss,summary.val/loss.last")  # the runs table's columns
    cell = page.locator("td[data-col='summary.val/loss']").first
    cell.wait_for(timeout=30000)
    assert float(cell.inner_text()) == pytest.approx(0.5)  # define_metric's min
    assert float(page.locator("td[data-col='summary.val/loss.last']").first.inner_text()) == pytest.approx(0.7)
    assert not page.js_errors
