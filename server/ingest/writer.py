"""The one writer path: every database write runs on this thread, in submission order."""

from __future__ import annotations

import queue
import threading
import time
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
    """

    def __init__(self, engine: Engine, on_group_failure: Callable[[], None] | None = None):
        self.engine = engine
        self.on_group_failure = on_group_failure
        self._jobs: queue.Queue = queue.Queue()
        self._held = None  # a job taken while collecting a group that did not belong to it
        self.busy_seconds = 0.0  # seconds spent running jobs (read by Pipeline.preferred_gap, any thread)
        self._thread = threading.Thread(target=self._loop, name="gradwatch-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable, *args: Any, group: bool = False) -> Future:
        """Queue a job; the future resolves to its return value after the commit."""
        future: Future = Future()
        self._jobs.put((fn, args, future, group))
        return future

    def depth(self) -> int:
        """Jobs waiting (for metrics and back-pressure)."""
        return self._jobs.qsize()

    def close(self) -> None:
        self._jobs.put(_STOP)
        self._thread.join(timeout=30)

    def _next(self, block: bool = True):
        if self._held is not None:
            job, self._held = self._held, None
            return job
        return self._jobs.get() if block else self._jobs.get_nowait()

    def _loop(self) -> None:
        with self.engine.connect() as conn:
            while True:
                job = self._next()
                if job is _STOP:
                    return
                jobs = [job]
                while job[3] and len(jobs) < GROUP_MAX:
                    try:
                        more = self._next(block=False)
                    except queue.Empty:
                        break
                    if more is _STOP or not more[3]:
                        self._held = more  # run after this group, in order
                        break
                    jobs.append(more)
                # Wall time, not CPU: a writer waiting on fsync or starved of a core is a bottleneck all the same.
                started = time.perf_counter()
                self._run(conn, [j for j in jobs if j[2].set_running_or_notify_cancel()])
                self.busy_seconds += time.perf_counter() - started

    def _run(self, conn, jobs: list) -> None:
        if len(jobs) > 1:
            try:
                with conn.begin():
                    results = [fn(conn, *args) for fn, args, _future, _group in jobs]
            except BaseException:  # run them one by one: only the bad one fails
                if self.on_group_failure is not None:
                    self.on_group_failure()
            else:
                for (_fn, _args, future, _group), result in zip(jobs, results):
                    future.set_result(result)
                return
        for fn, args, future, _group in jobs:
            try:
                with conn.begin():
                    result = fn(conn, *args)
            except BaseException as exc:  # the caller sees it; the writer keeps going
                future.set_exception(exc)
            else:
                future.set_result(result)
