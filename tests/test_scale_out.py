"""Several server processes over one PostgreSQL: a client moved between them, a page on the other one."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from conftest import Api
from server_process import ServerProcess
from test_ingest_ws import Link, _columns_batch
from waiting import wait_until
from websockets.sync.client import connect

pytestmark = pytest.mark.slow


@pytest.fixture
def two_servers(postgres_url):
    a, b = (ServerProcess(postgres_url, "--crash-timeout", "3") for _ in range(2))
    yield a, b
    a.stop()
    b.stop()


def _feed(server: ServerProcess, path: str):
    """A page's live feed on ``server``, subscribed."""
    ws = connect("ws" + server.url[4:] + path)
    assert json.loads(ws.recv(timeout=10))["type"] == "subscribed"
    return ws


def _loss(api: Api, run_id: int) -> list:
    return api.get(f"/api/runs/{run_id}/series?key=loss")["steps"]


def test_a_client_moved_between_processes_stores_everything_once(two_servers):
    a, b = two_servers
    uid = f"moved-{time.monotonic_ns()}"
    first = Link(a.url, uid=uid, secret="s")
    run_id = first.welcome["run_id"]
    for seq in (1, 2, 3):
        assert first.send(_columns_batch(seq, [(seq, float(seq), {"loss": 1.0 / seq}, {})]))["type"] == "ack"
    second = Link(b.url, uid=uid, secret="s")  # reconnects to the other process
    assert second.welcome == {**second.welcome, "run_id": run_id, "acked_seq": 3}
    for seq in (4, 5, 6):
        assert second.send(_columns_batch(seq, [(seq, float(seq), {"loss": 1.0 / seq}, {})]))["type"] == "ack"
    # Back on the first process, whose cache still says 3: it must notice, not store 4-6 again.
    assert first.send(_columns_batch(5, [(5, 5.0, {"loss": 0.2}, {})])) == {"type": "ack", "seq": 5}
    assert first.send(_columns_batch(7, [(7, 7.0, {"loss": 1 / 7}, {})])) == {"type": "ack", "seq": 7}
    # The same batch to both at once: both ack, exactly one stores it.
    batch = _columns_batch(8, [(8, 8.0, {"loss": 0.125}, {})])
    replies = []
    threads = [threading.Thread(target=lambda link=link: replies.append(link.send(batch))) for link in (first, second)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(r["type"] for r in replies) == ["ack", "ack"]
    for server in (a, b):
        assert _loss(Api(server.url), run_id) == [1, 2, 3, 4, 5, 6, 7, 8]
    first.close()
    second.close()


def test_a_page_on_one_process_sees_what_another_ingests(two_servers):
    a, b = two_servers
    link = Link(a.url, uid=f"live-{time.monotonic_ns()}", secret="s")
    run_id = link.welcome["run_id"]
    page = _feed(b, f"/ws/runs/{run_id}")
    small = [(s, float(s), {"loss": 0.5}, {}) for s in range(3)]
    big = [(s, float(s), {"loss": 0.25, **{f"k{i}": 1.0 for i in range(20)}}, {}) for s in range(3, 200)]
    assert link.send(_columns_batch(1, small))["type"] == "ack"
    assert link.send(_columns_batch(2, big))["type"] == "ack"  # over a NOTIFY's size: sent by reference
    seen: dict = {}
    deadline = time.monotonic() + 20
    while len(seen.get("loss", [])) < 200 and time.monotonic() < deadline:
        msg = json.loads(page.recv(timeout=20))
        if msg["type"] == "points":
            for key, s in msg["series"].items():
                seen.setdefault(key, []).extend(s["steps"])
    assert seen["loss"] == list(range(200)) and seen["k7"] == list(range(3, 200))
    page.close()
    link.close()


def test_a_run_whose_client_vanished_is_marked_crashed_by_one_process(two_servers):
    a, b = two_servers
    link = Link(b.url, uid=f"crash-{time.monotonic_ns()}", secret="s")
    run_id = link.welcome["run_id"]
    assert link.send(_columns_batch(1, [(0, 1.0, {"loss": 1.0}, {})]))["type"] == "ack"
    time.sleep(4)  # past crash_timeout while connected: the holding process's heartbeat keeps it alive
    assert Api(a.url).get(f"/api/runs/{run_id}")["status"] == "stalled"  # connected, silent: not crashed
    link.close()
    wait_until(
        lambda: Api(a.url).get(f"/api/runs/{run_id}")["status"] == "crashed",
        timeout=20,
        interval=0.2,
        message="never marked crashed",
    )


def test_serve_workers_runs_several_processes(postgres_url):
    srv = ServerProcess(postgres_url, "--crash-timeout", "3", "--workers", "2")
    try:
        link = Link(srv.url, uid=f"workers-{time.monotonic_ns()}", secret="s")
        assert link.send(_columns_batch(1, [(0, 1.0, {"loss": 1.0}, {})]))["type"] == "ack"
        assert _loss(Api(srv.url), link.welcome["run_id"]) == [0]
        link.close()
        children = subprocess.run(["pgrep", "-P", str(srv.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) >= 2
    finally:
        srv.stop()


def test_workers_refuse_sqlite(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradwatch_server.cli",
            "serve",
            "--port",
            "0",
            "--workers",
            "2",
            "--db",
            f"sqlite:///{tmp_path / 'x.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "PostgreSQL" in out.stderr


def test_a_run_summary_too_big_for_a_notify_still_reaches_the_other_process(two_servers):
    a, b = two_servers
    feed = _feed(b, "/ws/runs")
    config = {f"param_{i}": "x" * 100 for i in range(200)}  # ~20 KB: over NOTIFY's 8,000-byte payload
    link = Link(a.url, uid=f"big-{time.monotonic_ns()}", secret="s", run={"config": config})
    deadline = time.monotonic() + 20
    while True:
        msg = json.loads(feed.recv(timeout=20))
        if msg["type"] == "run" and msg["run"]["id"] == link.welcome["run_id"]:
            break
        assert time.monotonic() < deadline
    assert msg["run"]["name"] == "n"
    feed.close()
    link.close()
