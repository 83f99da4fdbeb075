"""A new client and a server that announces an older protocol (no ``run_events``: setting ``wire_features``):
run.summary, config updates and define_metric are held back with one warning, never a ``data_refused`` alert,
and go out folded once a server that takes them answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from gradwatch import Api, protocol
from gradwatch.delivery.run_events import OLD_SERVER
from gradwatch.values import Encoder
from gradwatch_server.serve import BackgroundServer

OLDER = "vector_f64,columns"  # what a release before media and run events announced

SCRIPT = """
import gradwatch as wandb
wandb.init(project="old-server", name="new-client", config={"lr": 0.1})
wandb.config.update({"batch": 32})
wandb.define_metric("val/*", summary="min")
for step in range(20):
    wandb.log({"loss": 1.0 / (step + 1)}, step=step)
    if step % 5 == 4:
        wandb.log({"val/loss": 2.0 / (step + 1)}, step=step)
wandb.summary["best"] = 0.5
wandb.finish()
"""


@pytest.fixture
def old_server(settings):
    settings.wire_features = OLDER
    srv = BackgroundServer(settings.validate()).start()
    yield srv
    srv.stop()


def test_the_setting_makes_the_server_speak_and_refuse_as_an_older_one(old_server):
    from websockets.sync.client import connect

    with connect(old_server.url.replace("http", "ws") + protocol.INGEST_PATH) as ws:
        ws.send(protocol.dumps(protocol.hello({"uid": "raw-old", "project": "old-server", "name": "raw"})))
        welcome = json.loads(ws.recv())
        assert welcome["features"] == OLDER.split(",")
        event = {"type": "summary", "set": {"x": 1}, "remove": []}
        ws.send(protocol.dumps(protocol.batch(1, [{"step": 0, "t": 1.0, "scalars": {"a": 1.0}}], events=[event])))
        ack = json.loads(ws.recv())
    assert ack["seq"] == 1 and "summary" in ack["refused"]  # what a client that sent them anyway would get


def test_a_new_client_holds_run_events_for_an_older_server_without_a_refusal(old_server, tmp_path):
    env = {**os.environ, "GRADWATCH_SERVER": old_server.url, "GRADWATCH_SPOOL_DIR": str(tmp_path / "spool")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count(OLD_SERVER) == 1, done.stderr[-3000:]
    api = Api(old_server.url)
    (run,) = api.runs(project="old-server")
    alerts = httpx.get(f"{old_server.url}/api/runs/{run.id}/alerts", timeout=30).json()
    assert not [a for a in alerts if a["kind"] == "data_refused"], alerts
    assert run.status == "finished" and run.config == {"lr": 0.1}  # what the older server takes: the hello's
    assert len(api.run(run.id).history()["loss"].dropna()) == 20  # every point arrived


def test_held_events_are_folded_and_go_out_to_a_server_that_takes_them():
    told = []
    enc = Encoder()
    enc.held.say = told.append
    old, new = set(OLDER.split(",")), set(protocol.SERVER_FEATURES)
    events = [
        {"type": "config", "config": {"a": 1}},
        {"type": "summary", "set": {"x": 1, "y": 2}, "remove": []},
        {"type": "config", "config": {"a": 2, "b": 3}},
        {"type": "summary", "set": {"x": 5}, "remove": ["y"]},
        {"type": "meta", "meta": {"metrics": {"val/*": {"summary": "min"}}}},
        {"type": "alert", "kind": "script_alert", "severity": "info", "key": "k", "message": "m", "step": 0, "t": 1.0},
    ]
    items = [("event", e) for e in events]
    (sent,) = enc.encode(items, 1, old)
    batch = json.loads(sent[1])
    assert [e["type"] for e in batch["events"]] == ["alert"]  # the older server takes alerts
    assert told == [OLD_SERVER]
    enc.encode([("event", {"type": "summary", "set": {"z": 0}, "remove": []})], 2, old)
    assert told == [OLD_SERVER]  # one warning
    assert enc.held.ready(new) and not enc.held.ready(old)
    (sent,) = enc.encode([], 3, new)  # nothing queued: the held events make a batch of their own
    got = {e["type"]: e for e in json.loads(sent[1])["events"]}
    assert got["config"]["config"] == {"a": 2, "b": 3}
    assert got["meta"]["meta"] == {"metrics": {"val/*": {"summary": "min"}}}
    assert got["summary"]["set"] == {"x": 5, "z": 0} and got["summary"]["remove"] == ["y"]
    assert not enc.held


def test_before_any_welcome_they_wait_and_a_closing_run_spools_them():
    enc = Encoder()
    (sent,) = enc.encode([("event", {"type": "config", "config": {"a": 1}})], 1, set())
    assert "events" not in json.loads(sent[1]) or not json.loads(sent[1])["events"]
    enc.held.flush_unknown = True  # Sender.close: no welcome ever (offline), the spool keeps them
    (sent,) = enc.encode([], 2, set())
    assert json.loads(sent[1])["events"] == [{"type": "config", "config": {"a": 1}}]
