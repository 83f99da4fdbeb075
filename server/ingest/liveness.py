"""Is each run's training process still there: connections held, heartbeats, and the crash/stall watch."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from gradwatch_server.ingest import run_states
from gradwatch_server.ingest.activity import Activity
from gradwatch_server.ingest.writer import Writer
from gradwatch_server.live.publisher import Publisher

log = logging.getLogger("gradwatch.server")


class Liveness:
    """Counts this process's ingest connections per run and marks runs crashed or stalled."""

    def __init__(self, writer: Writer, publisher: Publisher, activity: Activity, crash_timeout: float):
        self.writer = writer
        self.publisher = publisher
        self.activity = activity
        self.crash_timeout = crash_timeout
        self._connected: Counter = Counter()

    def connect(self, run_id: int) -> None:
        self._connected[run_id] += 1

    def disconnect(self, run_id: int) -> None:
        """A connection of the run closed; its bookkeeping goes with the last one (memory stays flat)."""
        self._connected[run_id] -= 1
        if self._connected[run_id] <= 0:
            del self._connected[run_id]

    def connected_clients(self) -> int:
        """Open ingest connections (training processes) on this server process."""
        return sum(n for n in self._connected.values() if n > 0)

    async def watch(self, every: float = 2.0) -> None:
        """Disconnected runs become 'crashed' after crash_timeout; connected ones that stopped
        logging for much longer than their own step interval become 'stalled'. A database error
        is logged and the watch goes on."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.check()
            except Exception as exc:  # the watcher must outlive a bad moment of the database
                log.warning("crash/stall check failed (will retry): %r", exc)

    async def check(self) -> None:
        """One round: heartbeat our runs, mark the crashed and the stalled, tell pages about them."""
        now = time.time()
        mine = list(self._connected)
        await asyncio.wrap_future(self.writer.submit(run_states.heartbeat, mine, now))
        crashed = await asyncio.wrap_future(self.writer.submit(run_states.mark_crashed, now - self.crash_timeout))
        floor = self.crash_timeout
        stalled = [r for r in mine if r not in self.activity.stalled and self.activity.is_stalled(r, now, floor)]
        if stalled:
            self.activity.stalled.update(stalled)
            await asyncio.wrap_future(self.writer.submit(run_states.mark_stalled, stalled, self.activity.intervals()))
        for run_id in crashed:
            self.activity.forget(run_id)
        for run_id in crashed + stalled:
            await self.publisher.run_changed(run_id)
