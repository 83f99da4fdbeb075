"""The writer thread's futures for an event loop (``Writer.submit_here``): a commit group's are resolved in one
wake-up of the loop, a failed job fails alone, a cancelled one is not run."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conftest import run_async
from sqlalchemy import text

from gradwatch_server.ingest.writer import Writer
from gradwatch_server.storage import database


def _insert(conn, n: int) -> int:
    if n < 0:
        raise ValueError("a bad job")
    conn.execute(text("INSERT INTO t (n) VALUES (:n)"), {"n": n})
    return n


def _writer(tmp_path) -> tuple[Writer, object]:
    engine = database.connect(f"sqlite:///{tmp_path / 'w.db'}", "normal")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (n INTEGER)"))
    return Writer(engine), engine


def _stored(engine) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(text("SELECT n FROM t")).scalars())


@pytest.mark.parametrize("bad", [False, True])
def test_a_groups_futures_of_one_loop_wake_it_once_and_a_bad_job_fails_alone(tmp_path, bad):
    writer, engine = _writer(tmp_path)
    held, wakes = threading.Event(), []

    async def scenario():
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, **k: (wakes.append(a[0]), real(*a, **k))[1]
        blocker = writer.submit(lambda conn: held.wait(30))  # the writer is busy: the batches queue up
        futures = [writer.submit_here(_insert, -1 if bad and n == 2 else n, group=True) for n in range(5)]
        held.set()
        await asyncio.wrap_future(blocker)
        done = await asyncio.gather(*futures, return_exceptions=True)
        return done, [w for w in wakes if getattr(w, "__name__", "") == "_settle_here"]

    try:
        done, settles = run_async(scenario())
    finally:
        held.set()
        writer.close()
    if bad:  # the group failed and ran again one by one: still one wake-up for all five
        assert isinstance(done[2], ValueError) and [d for i, d in enumerate(done) if i != 2] == [0, 1, 3, 4]
    else:
        assert done == [0, 1, 2, 3, 4]
    assert len(settles) == 1
    assert _stored(engine) == [n for n in range(5) if not (bad and n == 2)]
    engine.dispose()


def test_a_job_cancelled_before_it_ran_is_not_run(tmp_path):
    writer, engine = _writer(tmp_path)
    held = threading.Event()

    async def scenario():
        blocker = writer.submit(lambda conn: held.wait(30))
        dropped = writer.submit_here(_insert, 1, group=True)
        kept = writer.submit_here(_insert, 2, group=True)
        dropped.cancel()
        held.set()
        await asyncio.wrap_future(blocker)
        return await kept

    try:
        assert run_async(scenario()) == 2
    finally:
        held.set()
        writer.close()
    assert _stored(engine) == [2]
    engine.dispose()


def test_held_jobs_wait_their_hold_then_run_in_order_as_one_group_and_later_jobs_queue_behind_them(tmp_path):
    writer, engine = _writer(tmp_path)
    ran = []

    def job(conn, n: int) -> int:
        ran.append(n)
        return _insert(conn, n)

    async def scenario():
        commits = writer.commits
        futures = [writer.submit_here(job, n, group=True, hold=0.2) for n in range(3)]
        futures.append(writer.submit_here(job, 3))  # not held itself, nor grouped: it still runs after them
        await asyncio.sleep(0.05)
        early = list(ran)
        done = await asyncio.gather(*futures)
        return early, done, writer.commits - commits

    try:
        early, done, commits = run_async(scenario())
    finally:
        writer.close()
    assert early == []
    assert done == ran == [0, 1, 2, 3]
    assert commits == 2  # the three held batches in one transaction, then the job that came after them
    assert _stored(engine) == [0, 1, 2, 3]
    engine.dispose()


def test_jobs_still_held_when_the_writer_closes_are_run(tmp_path):
    writer, engine = _writer(tmp_path)

    async def scenario():
        writer.submit_here(_insert, 7, group=True, hold=60)
        writer.close()

    run_async(scenario())
    assert _stored(engine) == [7]
    engine.dispose()


def test_jobs_held_by_a_loop_that_closed_are_released_by_the_next_job(tmp_path):
    writer, engine = _writer(tmp_path)

    async def hold_and_leave():
        writer.submit_here(_insert, 1, group=True, hold=60)  # its loop ends before the hold does

    async def next_job():
        return await asyncio.wait_for(writer.submit_here(_insert, 2), 30)

    try:
        run_async(hold_and_leave())
        assert run_async(next_job()) == 2
    finally:
        writer.close()
    assert _stored(engine) == [1, 2]
    engine.dispose()


def test_held_jobs_go_as_soon_as_enough_are_held_and_the_next_hold_keeps_its_own_time(tmp_path):
    writer, engine = _writer(tmp_path)

    async def scenario():
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = [writer.submit_here(_insert, n, group=True, hold=0.5, enough=3) for n in range(3)]
        await asyncio.gather(*first)
        whole = loop.time() - started
        second = writer.submit_here(_insert, 3, group=True, hold=3.0, enough=3)  # one of three: waits its hold
        await asyncio.sleep(0.7)  # past the first hold's end: its timer would have released the second by now
        waiting = not second.done()
        await second
        return whole, waiting, loop.time() - started

    try:
        whole, waiting, total = run_async(scenario())
    finally:
        writer.close()
    assert whole < 0.4  # the group was whole: not held its 0.5 s
    assert waiting  # the first hold's timer, cancelled, did not release the second early
    assert total >= 2.9
    assert _stored(engine) == [0, 1, 2, 3]
    engine.dispose()
