"""Is each run's training process still there: connections held, heartbeats, the crash/stall watch, stragglers."""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections import Counter

from sqlalchemy import select

from gradwatch.contract import keys
from gradwatch_server.health.alerts import AlertBook
from gradwatch_server.health.common import Alert
from gradwatch_server.ingest import run_states
from gradwatch_server.ingest.activity import Activity
from gradwatch_server.ingest.writer import Writer
from gradwatch_server.live.publisher import Publisher
from gradwatch_server.storage import db, ranks

log = logging.getLogger("gradwatch.server")
STRAGGLER_ROUNDS = 5  # look for stragglers every this many rounds of the watch (medians of recent step times)


class Liveness:
    """Counts this process's ingest connections per run and marks runs crashed or stalled."""

    def __init__(self, writer: Writer, publisher: Publisher, activity: Activity, crash_timeout: float):
        self.writer = writer
        self.publisher = publisher
        self.activity = activity
        self.crash_timeout = crash_timeout
        self._connected: Counter = Counter()
        self._clients = 0  # open connections in all: read by every ack (Pipeline.preferred_gap), so kept, not summed
        self._rounds = 0
        self._flagged: dict = {}  # group -> the run id last alerted as its straggler (one alert per change)

    def connect(self, run_id: int) -> None:
        self._connected[run_id] += 1
        self._clients += 1

    def disconnect(self, run_id: int) -> None:
        """A connection of the run closed; its bookkeeping goes with the last one (memory stays flat)."""
        self._connected[run_id] -= 1
        self._clients -= 1
        if self._connected[run_id] <= 0:
            del self._connected[run_id]

    def connected_clients(self) -> int:
        """Open ingest connections (training processes) on this server process."""
        return self._clients

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
        await self.writer.submit_here(run_states.heartbeat, mine, now)
        crashed = await self.writer.submit_here(run_states.mark_crashed, now - self.crash_timeout)
        floor = self.crash_timeout
        stalled = [r for r in mine if r not in self.activity.stalled and self.activity.is_stalled(r, now, floor)]
        if stalled:
            self.activity.stalled.update(stalled)
            await self.writer.submit_here(run_states.mark_stalled, stalled, self.activity.intervals())
        for run_id in crashed:
            self.activity.forget(run_id)
        self._rounds += 1
        slow = []
        if mine and self._rounds % STRAGGLER_ROUNDS == 0:
            slow = await self.writer.submit_here(flag_stragglers, mine, self._flagged, now)
        for run_id in crashed + stalled + slow:
            await self.publisher.run_changed(run_id)


def flag_stragglers(conn, run_ids: list[int], flagged: dict, now: float) -> list[int]:
    """A ``straggler`` alert on the slowest rank of each job these runs belong to, once per job and straggler."""
    metas = conn.execute(select(db.runs.c.id, db.runs.c.meta).where(db.runs.c.id.in_(run_ids)))
    groups = {}
    for row in metas:
        group = json.loads(row.meta or "{}").get("group")
        if isinstance(group, str) and group:
            groups.setdefault(group, row.id)
    alerted = []
    for group, run_id in groups.items():
        job = ranks.get_ranks(conn, run_id)
        slow = next((r for r in job["ranks"] if r["straggler"]), None)
        if slow is None or flagged.get(group) == slow["id"]:
            continue
        flagged[group] = slow["id"]
        alert = straggler_alert(job, slow, _loader_wait(conn, slow["id"]))
        AlertBook.load(conn, slow["id"]).record(conn, alert, now)
        alerted.append(slow["id"])
    for group in [g for g in flagged if g not in groups]:  # jobs gone from here: memory stays flat
        del flagged[group]
    return alerted


def _loader_wait(conn, run_id: int) -> float | None:
    """The run's recent median time inside a torch DataLoader's next() (None when no DataLoader is measured)."""
    c = db.metric_keys.c
    key_id = conn.execute(
        select(c.id).where(c.run_id == run_id, c.key == keys.LOADER_WAIT, c.layers.is_(None))
    ).scalar()
    return ranks.recent_median(conn, key_id)


def straggler_alert(job: dict, slow: dict, loader: float | None = None) -> Alert:
    """The alert a job's straggler gets: its pace against the other ranks', and what its time between steps is.

    Args:
        job: ``storage.ranks.get_ranks``'s answer for the job.
        slow: the straggler's rank entry in it.
        loader: the rank's recent median ``perf/loader_wait`` (None: no DataLoader measured, so none is named).

    Returns:
        The ``straggler`` warning for the straggler's run.
    """
    paces = [r["step_time"] for r in job["ranks"] if r["step_time"] is not None]
    middle = statistics.median(paces)
    waits = [r["data_wait"] for r in job["ranks"] if r["data_wait"] is not None]
    wait, usual = slow["data_wait"], statistics.median(waits) if waits else None
    if wait is not None and usual is not None and wait - usual >= 0.3 * middle:
        how = (
            f"it spends {wait:.3g} s per step before its forward pass against {usual:.3g} s on the other ranks, "
            "and they wait for it at each all-reduce. "
        )
        if loader is not None and loader >= 0.5 * wait:
            how += (
                f"Its DataLoader takes {loader:.3g} s of that: more workers (num_workers), pin_memory, or faster "
                "storage or preprocessing."
            )
        elif loader is not None:
            how += (
                f"Its DataLoader takes only {loader:.3g} s of that: look at what else its loop does between steps "
                "(I/O, logging, a pause, preprocessing outside the loader)."
            )
        else:
            how += (
                "No DataLoader is measured on it, so this is its own code between steps (I/O, logging, a pause, "
                "preprocessing): look there, or at other processes on its machine."
            )
    else:
        how = (
            f"a median step of {slow['step_time']:.3g} s against {middle:.3g} s across the ranks. Its data wait is "
            "not the difference: look at its device (clocks, temperature, other processes) or its share of work."
        )
    return Alert(
        "straggler",
        slow["last_step"],
        slow["step_time"] / middle,
        "warning",
        message=f"Rank {slow['rank']} is the straggler of its job ({len(paces)} ranks): " + how,
    )
