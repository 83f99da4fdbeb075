"""The one writer path: every database write runs on this thread, in submission order."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from sqlalchemy.engine import Engine


class Writer:
    """Runs ``fn(conn, *args)`` jobs one at a time, each in its own transaction.

    SQLite allows one writer at a time; funnelling every write through one thread and
    one connection avoids lock contention and makes ingest ordering obvious.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="gradwatch-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable, *args: Any) -> Future:
        """Queue a job; the future resolves to its return value after the commit."""
        future: Future = Future()
        self._jobs.put((fn, args, future))
        return future

    def call(self, fn: Callable, *args: Any, timeout: float = 60.0) -> Any:
        """Submit and wait (for use outside the event loop)."""
        return self.submit(fn, *args).result(timeout)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        with self.engine.connect() as conn:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                fn, args, future = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    with conn.begin():
                        result = fn(conn, *args)
                except BaseException as exc:  # the caller sees it; the writer keeps going
                    future.set_exception(exc)
                else:
                    future.set_result(result)
