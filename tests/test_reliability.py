"""Nothing logged is lost: server down at start, restarted mid-run, memory spilled to disk."""

from __future__ import annotations

import dataclasses
import socket
import time

from conftest import Api
from test_ingest_ws import without_gap

import gradwatch
from gradwatch_server.cli.sync import sync
from gradwatch_server.serve import BackgroundServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down_at_start_then_up(settings, tmp_path):
    port = free_port()
    run = gradwatch.init(project="rel", name="late-server", server=f"http://127.0.0.1:{port}", flush_interval=0.05)
    for i in range(200):
        run.log({"loss": 1.0 / (i + 1)})
    time.sleep(0.5)  # the sender retries against a closed port meanwhile
    srv = BackgroundServer(dataclasses.replace(settings, port=port)).start()
    try:
        run.finish(timeout=30)
        series = Api(srv.url).get("/api/runs/1/series?key=loss")
        assert series["steps"] == list(range(200))
    finally:
        srv.stop()


def test_server_restart_mid_run_loses_and_duplicates_nothing(settings):
    port = free_port()
    cfg = dataclasses.replace(settings, port=port)
    srv = BackgroundServer(cfg).start()
    run = gradwatch.init(project="rel", name="restart", server=srv.url, flush_interval=0.05)
    for i in range(100):
        run.log({"loss": float(i)})
    assert run.recorder.flush(10)
    srv.stop()
    for i in range(100, 250):
        run.log({"loss": float(i)})
    time.sleep(0.3)
    srv = BackgroundServer(cfg).start()
    try:
        run.finish(timeout=30)
        api = Api(srv.url)
        series = api.get("/api/runs/1/series?key=loss")
        assert series["steps"] == list(range(250))
        assert series["values"] == [float(i) for i in range(250)]
        assert len(api.get("/api/runs")) == 1
        assert api.get("/api/runs/1")["status"] == "finished"
    finally:
        srv.stop()


def test_spills_to_disk_under_memory_cap_and_delivers(settings, tmp_path):
    port = free_port()
    spool = tmp_path / "spill"
    run = gradwatch.init(
        project="rel",
        name="spill",
        server=f"http://127.0.0.1:{port}",
        flush_interval=0.02,
        spool_dir=str(spool),
        max_memory_bytes=4096,
    )
    for i in range(3000):
        run.log({"loss": float(i), "other": 2.0 * i})
        if i % 300 == 0:
            time.sleep(0.05)  # let several batches form
    time.sleep(0.3)
    assert run.recorder.sender.outbox.spilled_total > 0 and list(spool.glob("*.json"))
    srv = BackgroundServer(dataclasses.replace(settings, port=port)).start()
    try:
        run.finish(timeout=30)
        assert Api(srv.url).get("/api/runs/1/series?key=other")["values"] == [2.0 * i for i in range(3000)]
        assert not [p for p in spool.glob("0*.json")]  # acked batches are removed from disk
    finally:
        srv.stop()


def test_gradwatch_sync_delivers_what_a_dead_server_left(settings, tmp_path, capsys):
    port = free_port()
    spool = tmp_path / "left"
    run = gradwatch.init(project="rel", name="offline", server=f"http://127.0.0.1:{port}", spool_dir=str(spool))
    for i in range(50):
        run.log({"loss": float(i)})
    run.finish(timeout=1)
    assert "gradwatch sync" in capsys.readouterr().err
    srv = BackgroundServer(dataclasses.replace(settings, port=port)).start()
    try:
        assert sync(str(spool), srv.url) == 0
        api = Api(srv.url)
        assert api.get("/api/runs/1/series?key=loss")["steps"] == list(range(50))
        assert api.get("/api/runs/1")["status"] == "finished"
    finally:
        srv.stop()


def test_log_never_blocks_when_server_is_unreachable(tmp_path):
    """With nothing listening, 2000 log calls still return immediately (the sender absorbs it)."""
    run = gradwatch.init(project="rel", name="blackhole", server=f"http://127.0.0.1:{free_port()}")
    start = time.perf_counter()
    for i in range(2000):
        run.log({"loss": float(i)})
    elapsed = time.perf_counter() - start
    run.finish(timeout=0.5)
    assert elapsed < 2.0  # generous: this guards against blocking, the benchmark measures speed


def test_two_connections_of_one_run_cannot_store_a_batch_twice(server, api):
    """A reconnect can leave the old connection alive with the same unacked batch: one copy is stored."""
    from websockets.sync.client import connect

    from gradwatch import protocol

    url = server.url.replace("http", "ws") + protocol.INGEST_PATH
    hello = protocol.dumps(protocol.hello({"uid": "twice", "project": "rel", "name": "twice", "secret": "s-twice"}))
    with connect(url) as old, connect(url) as new:
        _two_connections(old, new, hello)
    assert api.get("/api/runs/1/series?key=loss")["steps"] == list(range(51))


def _two_connections(old, new, hello):
    from gradwatch import protocol

    for ws in (old, new):
        ws.send(hello)
        assert protocol.loads(ws.recv(timeout=10))["acked_seq"] == 0
    batch = protocol.dumps(protocol.batch(1, [{"step": s, "t": 1.0, "scalars": {"loss": float(s)}} for s in range(50)]))
    old.send(batch)
    new.send(batch)
    replies = [without_gap(protocol.loads(ws.recv(timeout=10))) for ws in (old, new)]
    assert replies == [{"type": "ack", "seq": 1}] * 2
    # The old connection, behind now, gets a nack pointing past what the new one committed.
    new.send(protocol.dumps(protocol.batch(2, [{"step": 50, "t": 1.0, "scalars": {"loss": 50.0}}])))
    assert without_gap(protocol.loads(new.recv(timeout=10))) == {"type": "ack", "seq": 2}
    old.send(protocol.dumps(protocol.batch(2, [{"step": 50, "t": 1.0, "scalars": {"loss": 50.0}}])))
    assert without_gap(protocol.loads(old.recv(timeout=10))) == {"type": "ack", "seq": 2}


def test_server_with_a_fresh_database_takes_the_rest_of_the_run(settings, tmp_path):
    """Batches acked by a server whose database is gone can't come back; everything after them must."""
    import torch
    from training import mlp

    port = free_port()
    first = BackgroundServer(dataclasses.replace(settings, port=port)).start()
    run = gradwatch.init(project="rel", name="db-replaced", server=first.url, flush_interval=0.05)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch(model, opt)

    def steps(n):
        for _ in range(n):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.log({"loss": loss})

    steps(50)
    assert run.recorder.flush(10)
    first.stop()
    steps(50)  # held by the client while no server answers
    fresh = dataclasses.replace(settings, port=port, db=f"sqlite:///{tmp_path / 'fresh.db'}")
    second = BackgroundServer(fresh).start()
    try:
        run.finish(timeout=30)
        api = Api(second.url)
        assert api.get("/api/runs/1/series?key=loss")["steps"] == list(range(50, 100))
        assert api.get("/api/runs/1/heatmap")["layers"][0] == "0.weight"  # the layout came with the hello
        gap = [a for a in api.get("/api/runs/1/alerts") if a["kind"] == "data_gap"]
        assert len(gap) == 1 and "acknowledged earlier" in gap[0]["message"]
        assert api.get("/api/runs/1")["status"] == "finished"
    finally:
        second.stop()
