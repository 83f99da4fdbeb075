"""`gradwatch sync`: every pending run with no path, idempotent, delivered spools removed."""

from __future__ import annotations

import dataclasses
import socket

from conftest import Api
from waiting import wait_until

import gradwatch
from gradwatch.delivery import pending as delivery
from gradwatch.delivery import spool
from gradwatch_server.cli.sync import sync
from gradwatch_server.serve import BackgroundServer


def _offline_run(port: int, name: str, steps: int) -> None:
    run = gradwatch.init(project="sync", name=name, server=f"http://127.0.0.1:{port}")
    for i in range(steps):
        run.log({"loss": float(i)})
    run.finish(timeout=1)


def test_sync_without_a_path_delivers_every_pending_run_once(settings, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _offline_run(port, "a", 40)
    _offline_run(port, "b", 60)
    root = tmp_path / "spool"
    assert len(spool.pending_runs(root)) == 2
    srv = BackgroundServer(dataclasses.replace(settings, port=port)).start()
    try:
        assert sync(None, srv.url) == 0
        api = Api(srv.url)
        runs = {r["name"]: r for r in api.get("/api/runs")}
        assert sorted(runs) == ["a", "b"]
        assert api.get(f"/api/runs/{runs['b']['id']}/series?key=loss")["steps"] == list(range(60))
        assert not list(root.iterdir())  # delivered spools are removed
        assert sync(None, srv.url) == 0  # again: nothing left, nothing stored twice
        assert "nothing to send" in capsys.readouterr().out
        assert len(api.get("/api/runs")) == 2
    finally:
        srv.stop()


def test_sync_of_a_missing_path_says_it_does_not_exist(tmp_path, capsys):
    assert sync(str(tmp_path / "does-not-exist"), "http://127.0.0.1:1") == 2
    assert "does not exist" in capsys.readouterr().err


def test_sync_skips_a_spool_a_live_run_holds(server, tmp_path):
    run = gradwatch.init(
        project="sync", name="live", server="http://127.0.0.1:1", max_memory_bytes=100, flush_interval=0.01
    )
    for i in range(500):
        run.log({"loss": float(i)})
        if i % 100 == 99:
            run.recorder.sender.drain()  # several batches: all but the newest go to disk (100-byte budget)
    where = run.recorder.sender.outbox.spool_dir
    assert (where / "run.json").is_file()
    ok, _, why = delivery.deliver(where, server.url)
    assert not ok and "in use" in why
    run.finish(timeout=1)
    assert delivery.deliver(where, server.url)[0]
    assert not where.exists()


def test_a_new_run_delivers_older_spools_in_the_background(server, api, tmp_path):
    """A run that never reached a server leaves a spool; the next run that reaches one sends it."""

    import gradwatch

    old = gradwatch.init(project="p", name="offline", server="http://127.0.0.1:9")
    for step in range(20):
        old.log({"loss": 1.0 / (step + 1)})
    old.finish(timeout=2)
    root = gradwatch.delivery.spool.default_root()
    assert [p.name for p in gradwatch.delivery.spool.pending_runs(root)] == [old.uid]
    # As if that run had been meant for this server while it was down (runs meant for another server
    # are left alone: see the next test).
    info = gradwatch.delivery.spool.read_run_info(root / old.uid)
    gradwatch.delivery.spool.write_run_info(root / old.uid, {**info, "server": server.url})
    new = gradwatch.init(project="p", name="online", server=server.url)
    new.log({"loss": 0.5})
    wait_until(lambda: not gradwatch.delivery.spool.pending_runs(root), timeout=30, interval=0.1)
    new.finish()
    names = {r["name"]: r["id"] for r in api.get("/api/runs")}
    assert len(api.get(f"/api/runs/{names['offline']}/series?key=loss")["steps"]) == 20
    assert not gradwatch.delivery.spool.pending_runs(root)


def test_sync_shows_progress_in_batches_when_it_takes_a_while(capsys):
    from gradwatch.delivery.progress import Progress

    meter = Progress(40, "batches")
    meter.show(1.0, 40)  # under ~2 s: quiet
    meter.show(2.5, 10)
    err = capsys.readouterr().err
    assert "sending 40 batches to the server… 75 %" in err and err.count("sending") == 1


def test_a_run_meant_for_another_server_is_not_delivered_in_the_background(server, api):
    import os
    import time

    import gradwatch

    old = gradwatch.init(project="p", name="elsewhere", server="http://127.0.0.1:9")
    old.log({"loss": 1.0})
    old.finish(timeout=2)
    root = gradwatch.delivery.spool.default_root()
    [spooled] = gradwatch.delivery.spool.pending_runs(root)
    assert (
        oct((spooled / "run.json").stat().st_mode & 0o777) == "0o600" and oct(spooled.stat().st_mode & 0o777) == "0o700"
    )
    new = gradwatch.init(project="p", name="here", server=server.url)
    new.log({"loss": 0.5})
    new.finish()
    time.sleep(1.0)
    assert [r["name"] for r in api.get("/api/runs")] == ["here"]
    assert gradwatch.delivery.spool.pending_runs(root) == [spooled]  # kept for its own server or `gradwatch sync`
    assert os.path.exists(spooled / "run.json")
