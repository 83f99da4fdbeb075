"""The group fsync (docs/storage.md, "Durability of an ack"): SQLite commits without syncing, the writer
fsyncs the WAL once for every commit of a few milliseconds, and an ack is sent only after that fsync;
pages get the points at the commit, before it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading

import pytest
from conftest import run_async
from sqlalchemy import text
from test_ingest_ws import Link, _columns_batch
from websockets.sync.client import connect

from gradwatch_server.ingest.writer import Writer
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings
from gradwatch_server.storage import database


def _insert(conn, n: int) -> int:
    conn.execute(text("INSERT INTO t (n) VALUES (:n)"), {"n": n})
    return n


class CountingSync:
    """The real WAL fsync, counted, and held while ``release`` is not set."""

    def __init__(self, url: str):
        self.wal, self.writer = database.wal_sync(url), None
        self.release, self.entered = threading.Event(), threading.Event()
        self.release.set()
        self.calls: list = []  # the writer's commit count at each fsync

    def __call__(self) -> None:
        self.entered.set()
        assert self.release.wait(30)
        self.calls.append(self.writer.commits if self.writer else 0)
        self.wal()


def _engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.db'}"
    engine = database.connect(url, "normal")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (n INTEGER)"))
    return url, engine


def test_a_commit_is_reported_on_disk_only_after_the_fsync_that_covers_it(tmp_path):
    url, engine = _engine(tmp_path)
    sync = CountingSync(url)
    writer = sync.writer = Writer(engine, sync=sync, sync_delay=0.0)

    async def scenario():
        await asyncio.wrap_future(writer.submit(_insert, 0))  # the start's sync is done by now or soon
        while writer.synced() is not None:
            await asyncio.wait_for(writer.synced(), 30)
        sync.release.clear()
        sync.entered.clear()
        assert await asyncio.wrap_future(writer.submit(_insert, 1, group=True)) == 1  # committed
        waiting = writer.synced()
        assert waiting is not None  # committed, not yet on disk
        assert await asyncio.to_thread(sync.entered.wait, 30)  # the fsync has begun; it is held
        assert not waiting.done()
        sync.release.set()
        await asyncio.wait_for(waiting, 30)
        assert sync.calls[-1] >= writer.commits  # that fsync came after every commit made so far
        assert writer.synced() is None

    try:
        run_async(scenario())
    finally:
        sync.release.set()
        writer.close()
        engine.dispose()
    with database.connect(url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM t")).scalar() == 2


def test_commits_within_the_delay_share_one_fsync(tmp_path):
    url, engine = _engine(tmp_path)
    sync = CountingSync(url)
    writer = sync.writer = Writer(engine, sync=sync, sync_delay=2.0)

    async def scenario():
        before = len(sync.calls)
        results = [await asyncio.wrap_future(writer.submit(_insert, n)) for n in range(10)]  # ten commits
        assert results == list(range(10))
        waiting = writer.synced()
        assert waiting is not None
        await asyncio.wait_for(waiting, 30)
        assert 1 <= len(sync.calls) - before < 10  # fewer fsyncs than commits (one, unless the start's fell in)

    try:
        run_async(scenario())
    finally:
        writer.close()
        engine.dispose()


def test_held_jobs_are_synced_before_their_futures_resolve_others_wait_for_the_delay(tmp_path):
    url, engine = _engine(tmp_path)
    sync = CountingSync(url)
    writer = sync.writer = Writer(engine, sync=sync, sync_delay=60.0)

    async def scenario():
        held = await asyncio.gather(*(writer.submit_here(_insert, n, group=True, hold=0.01) for n in range(3)))
        assert held == [0, 1, 2] and writer.synced() is None  # on disk already: the acks need not wait
        assert await writer.submit_here(_insert, 3) == 3
        assert writer.synced() is not None  # a job not held waits for the group fsync's delay, as before

    try:
        run_async(scenario())
    finally:
        writer.close()
        engine.dispose()


def test_a_failed_fsync_reports_the_error_and_a_later_one_syncs(tmp_path):
    url, engine = _engine(tmp_path)
    wal, failing = database.wal_sync(url), threading.Event()

    def flaky() -> None:
        if failing.is_set():
            raise OSError(5, "Input/output error")
        wal()

    writer = Writer(engine, sync=flaky, sync_delay=0.0)

    async def scenario():
        await asyncio.wrap_future(writer.submit(_insert, 0))
        while writer.synced() is not None:
            await asyncio.wait_for(writer.synced(), 30)
        failing.set()
        await asyncio.wrap_future(writer.submit(_insert, 1))
        with pytest.raises(OSError):  # committed, but not on disk: its ack must not be sent
            await asyncio.wait_for(writer.synced(), 30)
        failing.clear()
        retry = writer.synced()  # still not known on disk: the writer tries again
        assert retry is not None
        await asyncio.wait_for(retry, 30)
        assert writer.synced() is None

    try:
        run_async(scenario())
    finally:
        writer.close()
        engine.dispose()


def test_without_the_group_fsync_commits_are_on_disk_at_once(tmp_path):
    settings = Settings(db=f"sqlite:///{tmp_path / 'f.db'}", sqlite_group_fsync_ms=0.0)
    from gradwatch_server.services import Services

    services = Services(settings)
    try:
        assert services.wal_sync is None and services.writer.sync is None  # SQLite's own synchronous=FULL
        assert services.writer.synced() is None
    finally:
        services.close()
    with pytest.raises(ValueError, match="sqlite_group_fsync_ms"):
        Settings(sqlite_group_fsync_ms=-1.0).validate()


def test_the_page_gets_a_batch_at_its_commit_and_the_ack_comes_after_the_fsync(tmp_path):
    settings = Settings(host="127.0.0.1", port=0, db=f"sqlite:///{tmp_path / 'a.db'}")
    srv = BackgroundServer(dataclasses.replace(settings, sqlite_group_fsync_ms=1000.0)).start()
    try:
        writer = srv.services.writer
        link = Link(srv.url)
        run_id = link.welcome["run_id"]
        with connect("ws" + srv.url[len("http") :] + f"/ws/runs/{run_id}") as page:
            assert json.loads(page.recv(timeout=10))["type"] == "subscribed"
            link.ws.send(json.dumps(_columns_batch(1, [(0, 1.0, {"loss": 1.0}, {})])))
            push = json.loads(page.recv(timeout=10))
            while push["type"] != "points":
                push = json.loads(page.recv(timeout=10))
            committed = writer.commits  # the batch's commit is counted before its push is published
            with pytest.raises(TimeoutError):  # the ack waits for the fsync, up to a second after the commit
                link.ws.recv(timeout=0)
            ack = json.loads(link.ws.recv(timeout=10))
            assert ack["type"] == "ack" and ack["seq"] == 1
            assert writer.synced_commits >= committed  # sent only after an fsync that covered the batch
        link.close()
    finally:
        srv.stop()
