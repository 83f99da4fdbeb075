"""The one writer path: every database write runs on this thread, in submission order."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sqlalchemy.engine import Engine

_STOP = object()
GROUP_MAX = 64  # batches committed together at most (one commit, one fsync, for all of them)


class Writer:
    """Runs ``fn(conn, *args)`` jobs one at a time, each in its own transaction.

    SQLite allows one writer at a time; funnelling every write through one thread and
    one connection avoids lock contention and makes ingest ordering obvious. Jobs submitted
    with ``group=True`` that are waiting together share one transaction (group commit): under
    load the commit cost is paid once per group instead of once per batch. If a group fails,
    its jobs are run again one by one, so one bad job cannot fail the others.

    With ``sync`` (the group fsync, ``storage.database.wal_sync``: SQLite commits without syncing),
    the writer calls it at most ``sync_delay`` seconds after a commit, once for every commit since;
    ``synced`` tells a caller when what it saw committed is on disk (an ack waits for it).
    """

    def __init__(
        self,
        engine: Engine,
        on_group_failure: Callable[[], None] | None = None,
        sync: Callable[[], None] | None = None,
        sync_delay: float = 0.0,
    ):
        self.engine = engine
        self.on_group_failure = on_group_failure
        self.sync, self.sync_delay = sync, sync_delay
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # the C queue: a put and a get cost less
        self._ready: deque = deque()  # jobs taken off the queue, to run next (a released run, one left out of a group)
        self._holding: list = []  # jobs an event loop holds back, to queue together (submit_here's ``hold``)
        self._hold_loop = None  # the loop whose timer releases them
        self._hold_timer: asyncio.TimerHandle | None = None  # that timer
        self._sync_now = False  # running held jobs: their commit is synced at once (``_loop``)
        self.busy_seconds = 0.0  # seconds spent running jobs (read by Pipeline.preferred_gap, any thread)
        # Commits made and commits known on disk (written on this thread; read under the lock by synced()).
        self._lock = threading.Lock()
        self.commits = self.synced_commits = 0
        self.syncs = 0  # group fsyncs done (for tests and metrics)
        self._waiters: list = []  # (commits needed, asyncio future, its loop), resolved by _sync
        self._due: float | None = None  # when the commits not yet synced must be synced
        self._thread = threading.Thread(target=self._loop, name="gradwatch-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable, *args: Any, group: bool = False) -> Future:
        """Queue a job; the future resolves to its return value after the commit."""
        future: Future = Future()
        self._jobs.put((fn, args, future, group))
        return future

    def submit_here(
        self, fn: Callable, *args: Any, group: bool = False, hold: float = 0.0, enough: int = 0
    ) -> asyncio.Future:
        """``submit`` from an event loop: a future of this loop, resolved with every other one of its loop
        that the same commit settled, in one wake-up of the loop (not one ``call_soon_threadsafe`` each).

        ``hold``: queue the job at most this many seconds later, with every job submitted meanwhile (held
        or not: they keep their order), so the writer takes them as one group and runs them back to back.
        ``enough``: queue them as soon as this many are held (the group the caller waits for is there),
        when the hold is this loop's.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = (fn, args, (future, loop), group)
        if self._holding and self._hold_loop.is_closed():  # its timer will never run: release them now
            self._release()
        if not self._holding and hold <= 0:
            self._jobs.put(job)
            return future
        if not self._holding:  # the first of a hold: its timer releases them
            self._hold_loop = loop
            self._hold_timer = loop.call_later(hold, self._release)
        self._holding.append(job)
        if enough and len(self._holding) >= enough and self._hold_loop is loop:
            self._hold_timer.cancel()  # (on its own loop) else it would cut short the next hold
            self._release()
        return future

    def _release(self) -> None:
        """Queue the held jobs as one item (the writer takes them all at one wake-up, in order)."""
        jobs, self._holding = self._holding, []
        if jobs:
            self._jobs.put(jobs)

    def synced(self) -> asyncio.Future | None:
        """None when every commit made so far is on disk; else a future of this loop resolved once it is.

        Call it after a job's future resolved: its commit is then counted. Without ``sync`` (SQLite
        syncing each commit itself, PostgreSQL) a commit is on disk when its job resolves: None.
        """
        if self.sync is None:
            return None
        with self._lock:
            if self.synced_commits >= self.commits:
                return None
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            self._waiters.append((self.commits, waiter, loop))
        return waiter

    def held(self) -> int:
        """Jobs an event loop holds back now (``submit_here``'s ``hold``), for tests and diagnostics."""
        return len(self._holding)

    def depth(self) -> int:
        """Jobs waiting (for metrics and back-pressure)."""
        return self._jobs.qsize() + len(self._holding) + len(self._ready)

    def close(self) -> None:
        self._release()  # held jobs still run (their loop may be gone: nobody waits for them then)
        self._jobs.put(_STOP)
        self._thread.join(timeout=30)

    def _next(self, block: bool = True):
        if not self._ready:
            item = self._take(block)
            if type(item) is not list:
                return item
            self._ready.extend(item)  # released together (``_release``)
            self._sync_now = True
        return self._ready.popleft()

    def _take(self, block: bool):
        """The next item off the queue: a job, a list of jobs, or _STOP."""
        if not block:
            return self._jobs.get_nowait()
        while self._due is not None:  # commits wait for their fsync: wait for a job only until it is due
            wait = self._due - time.perf_counter()
            if wait <= 0:
                self._settle(self._sync())  # a failed one is due again soon
                continue
            try:
                return self._jobs.get(timeout=wait)
            except queue.Empty:
                continue
        return self._jobs.get()

    def _loop(self) -> None:
        with self.engine.connect() as conn:
            if self.sync is not None:
                self._committed()  # what the migrations committed at start is synced too
            while True:
                job = self._next()
                if job is _STOP:
                    if self._due is not None:
                        self._settle(self._sync())
                    return
                jobs = [job]
                while job[3] and len(jobs) < GROUP_MAX:
                    try:
                        more = self._next(block=False)
                    except queue.Empty:
                        break
                    if more is _STOP or not more[3]:
                        self._ready.appendleft(more)  # run after this group, in order
                        break
                    jobs.append(more)
                # Wall time, not CPU: a writer waiting on fsync or starved of a core is a bottleneck all the same.
                started = time.perf_counter()
                outcomes = self._run(conn, [j for j in jobs if _runnable(j[2])])
                if self._sync_now and not self._ready:
                    # Held jobs came a tick apart: no later commit would share their fsync. Synced before
                    # their futures resolve, their acks need no second wake-up of the loop (``synced``: None).
                    self._sync_now = False
                    if self._due is not None:
                        outcomes += self._sync()
                self._settle(outcomes)
                self.busy_seconds += time.perf_counter() - started

    def _committed(self) -> None:
        """Count a commit (before its futures resolve, so a caller's ``synced`` covers it)."""
        with self._lock:
            self.commits += 1
        if self.sync is not None and self._due is None:
            self._due = time.perf_counter() + self.sync_delay

    def _sync(self) -> list:
        """One fsync for every commit so far; returns the outcomes of the waiters it covers (for ``_settle``)."""
        self._due = None
        with self._lock:
            target = self.commits
        error = None
        try:
            self.sync()
        except Exception as exc:  # nothing it covers may be acked as on disk; the writer keeps going
            error = exc if isinstance(exc, OSError) else OSError(f"the WAL fsync failed: {exc!r}")
        self.syncs += 1
        if error is not None:
            self._due = time.perf_counter() + max(self.sync_delay, 0.1)  # try again: later acks wait for it
        with self._lock:
            if error is None:
                self.synced_commits = target
            done = [w for w in self._waiters if w[0] <= target]
            self._waiters = [w for w in self._waiters if w[0] > target]
        return [((waiter, loop), error is not None, error) for _need, waiter, loop in done]

    def _run(self, conn, jobs: list) -> list:
        """Run jobs, as one group when there are several; returns (future, failed, result or exception) of each."""
        if len(jobs) > 1:
            try:
                with conn.begin():
                    results = [fn(conn, *args) for fn, args, _future, _group in jobs]
            except BaseException:  # run them one by one: only the bad one fails
                if self.on_group_failure is not None:
                    self.on_group_failure()
            else:
                self._committed()
                return [(future, False, result) for (_fn, _args, future, _group), result in zip(jobs, results)]
        outcomes = []
        for fn, args, future, _group in jobs:
            try:
                with conn.begin():
                    result = fn(conn, *args)
            except BaseException as exc:  # the caller sees it; the writer keeps going
                outcomes.append((future, True, exc))
            else:
                self._committed()
                outcomes.append((future, False, result))
        return outcomes

    @staticmethod
    def _settle(outcomes: list) -> None:
        """Resolve futures: a thread's at once, an event loop's in one ``call_soon_threadsafe`` per loop."""
        by_loop: dict = {}
        for future, failed, value in outcomes:
            if not isinstance(future, Future):
                by_loop.setdefault(future[1], []).append((future[0], failed, value))
            elif failed:
                future.set_exception(value)
            else:
                future.set_result(value)
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_here, settled)
            except RuntimeError:  # that loop is closed: nobody waits any more
                pass


def _runnable(future) -> bool:
    """Whether a job's caller still wants it run (a cancelled future's job is skipped)."""
    return future.set_running_or_notify_cancel() if isinstance(future, Future) else not future[0].cancelled()


def _settle_here(settled: list) -> None:
    """On the futures' loop: their jobs (or the fsync they waited for) are done, or failed."""
    for future, failed, value in settled:
        if future.done():
            continue
        if failed:
            future.set_exception(value)
        else:
            future.set_result(value)
