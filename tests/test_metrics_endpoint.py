"""Prometheus /metrics for the server itself, against a real server with real clients."""

from __future__ import annotations

import re
import sys
import urllib.request
from pathlib import Path

from conftest import wait_runs
from waiting import wait_until
from websockets.sync.client import connect

import gradwatch


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(gradwatch_\w+) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def wait_for(fn, timeout=15.0):
    return wait_until(fn, timeout=timeout, interval=0.05)


def test_metrics_count_points_clients_and_pages(server, api):
    before = scrape(server.url)
    assert before["gradwatch_points_ingested_total"] == 0 and before["gradwatch_connected_clients"] == 0
    run = gradwatch.init(project="prom", name="a", server=server.url)
    for step in range(50):
        run.log({"loss": 1.0 / (step + 1), "acc": 0.5}, step=step)
    wait_runs(api, 1)
    run_id = api.get("/api/runs")[0]["id"]
    wait_for(lambda: scrape(server.url)["gradwatch_points_ingested_total"] >= 100)
    live = scrape(server.url)
    assert live["gradwatch_connected_clients"] == 1
    assert live["gradwatch_batches_ingested_total"] >= 1
    assert live["gradwatch_points_per_second"] > 0
    assert live["gradwatch_writer_queue_depth"] >= 0
    with connect(server.url.replace("http", "ws") + f"/ws/runs/{run_id}"):
        wait_for(lambda: scrape(server.url)["gradwatch_live_subscribers"] == 1)
    wait_for(lambda: scrape(server.url)["gradwatch_live_subscribers"] == 0)
    run.finish()
    done = scrape(server.url)  # every ack waited for a group fsync of the WAL; one fsync covers many commits
    assert 1 <= done["gradwatch_wal_fsyncs_total"] <= done["gradwatch_writer_commits_total"]
    wait_for(lambda: scrape(server.url)["gradwatch_connected_clients"] == 0)
    assert scrape(server.url)["gradwatch_points_ingested_total"] == 100  # exactly the points logged


def test_metrics_without_prometheus_client_is_a_clear_501(server, api, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what an uninstalled package looks like to import
    status, body = api.request("GET", "/metrics")
    assert status == 501 and "pip install prometheus-client" in body["error"]


def test_new_routes_are_documented():
    from gradwatch_server.web.routes import metrics, ranks

    doc = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    for module in (metrics, ranks):
        for route in module.router.routes:
            assert f"`{route.path}`" in doc, route.path
