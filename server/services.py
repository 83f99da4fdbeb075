"""The server's moving parts in one object: database, writer, live hub, webhook."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from gradwatch_server.ingest import apply as ingest
from gradwatch_server.ingest import hello, run_states
from gradwatch_server.ingest.activity import Activity
from gradwatch_server.ingest.batch import Batch
from gradwatch_server.ingest.stats import IngestStats, batch_points
from gradwatch_server.ingest.writer import Writer
from gradwatch_server.live import hub as live
from gradwatch_server.live.fanout import PgFanout
from gradwatch_server.live.fanout import stored_reference as fanout_reference
from gradwatch_server.live.hub import RUNS_CHANNEL, Hub
from gradwatch_server.live.webhook import WebhookSender, payload
from gradwatch_server.settings import Settings
from gradwatch_server.storage import db, store

log = logging.getLogger("gradwatch.server")


class Services:
    """Everything a route needs; built once per app by ``create_app``."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.engine = db.make_engine(settings.db_url, settings.sqlite_synchronous)
        self.writer = Writer(self.engine, on_group_failure=self._forget_states)
        self.hub = Hub()
        self.webhook = WebhookSender(settings.webhook) if settings.webhook else None
        self.states: dict[int, ingest.RunState] = {}  # touched only on the writer thread
        self.limits = ingest.Limits(max_keys=settings.max_keys_per_run, max_layers=settings.max_layers)
        self.connected: Counter = Counter()
        self.activity = Activity()
        self.ingest_stats = IngestStats()
        self.base_url = ""
        # Several server processes over one PostgreSQL: pages see what any of them ingests.
        self.fanout = (
            PgFanout(self.engine, self._from_other_process) if self.engine.dialect.name == "postgresql" else None
        )

    def start(self, loop) -> None:
        """Begin the background parts that need the event loop (cross-process fan-out)."""
        if self.fanout is not None:
            self.fanout.start(loop)
            self.hub.forward = self._to_other_processes

    def _to_other_processes(self, channel, message: dict) -> None:
        asyncio.ensure_future(asyncio.to_thread(self._notify, channel, message))

    def _notify(self, channel, message: dict | None, ref: dict | None = None) -> None:
        try:
            with self.engine.begin() as conn:
                self.fanout.send(conn, channel, message, ref)
        except Exception as exc:  # a lost push; pages resync on reconnect
            log.warning("gradwatch: could not notify the other server processes: %r", exc)

    def _from_other_process(self, channel, message: dict | None, ref: dict | None) -> None:
        if message is not None:
            self.hub.deliver(channel, message)
        elif ref is not None and self.hub.has(channel):
            asyncio.ensure_future(self._deliver_reference(channel, ref))

    async def _deliver_reference(self, channel, ref: dict) -> None:
        """A message from another process too big for a NOTIFY: read it back, for this process's pages."""
        try:
            if ref.get("type") == "run" and ref.get("run_id") is not None:
                self.hub.deliver(channel, {"type": "run", "run": await self.aread(store.get_run, ref["run_id"])})
            elif ref.get("type") == "points" and ref.get("lo") is not None:
                points = await self.aread(store.points_between, ref["run_id"], ref["keys"], ref["lo"], ref["hi"])
                self.hub.deliver(channel, {"type": "points", "run_id": ref["run_id"], **points})
            else:
                self.hub.deliver(channel, {"type": "resync"})
        except store.NotFound:
            return

    def read(self, fn, *args, **kwargs):
        """Run a read function from ``store`` on a pooled connection (blocking: call off the event loop)."""
        with self.engine.connect() as conn:
            return fn(conn, *args, **kwargs)

    async def aread(self, fn, *args, **kwargs):
        """``read`` on a worker thread, so a slow query never stalls the event loop."""
        return await asyncio.to_thread(self.read, fn, *args, **kwargs)

    async def write(self, fn, *args):
        """Run ``fn(conn, *args)`` on the writer thread; then tell open pages about the run."""
        result = await asyncio.wrap_future(self.writer.submit(self._edit, fn, *args))
        if args and isinstance(args[0], int):
            await self._publish_run(args[0])
        return result

    def _edit(self, conn, fn, run_id, *args):
        self.states.pop(run_id, None)  # a deleted or edited run reloads its writer cache
        return fn(conn, run_id, *args)

    def _forget_states(self) -> None:
        self.states.clear()  # a failed group commit rolled back: every cache may be ahead of the database

    def close(self) -> None:
        if self.fanout is not None:
            self.fanout.stop()
        self.writer.close()
        self.engine.dispose()

    # -- ingest (called by the websocket route) ------------------------------------------
    async def open_run(self, info: dict, resume_from: int | None = None, layouts: dict | None = None) -> dict:
        result = await asyncio.wrap_future(self.writer.submit(self._open, info, resume_from, layouts))
        await self._publish_run(result["run_id"])
        return result

    def _open(self, conn, info: dict, resume_from: int | None, layouts: dict | None) -> dict:
        result = hello.open_run(conn, info, self.settings.alert_overrides, resume_from=resume_from)
        added = hello.ensure_layouts(
            conn, result["run_id"], layouts or {}, self.limits.max_keys, self.limits.max_layers
        )
        if result.get("skipped") or added or not result["created"]:
            self.states.pop(result["run_id"], None)  # its cached seq / keys may be behind the database now
        return result

    def connect(self, run_id: int) -> None:
        self.connected[run_id] += 1

    def disconnect(self, run_id: int) -> None:
        """A connection of the run closed; its bookkeeping goes with the last one (memory stays flat)."""
        self.connected[run_id] -= 1
        if self.connected[run_id] <= 0:
            del self.connected[run_id]

    def submit_batch(self, run_id: int, batch: Batch) -> asyncio.Future:
        """Queue one decoded batch for the writer (group-committed with others waiting)."""
        return asyncio.wrap_future(self.writer.submit(self._apply, run_id, batch, group=True))

    def after_batch(self, run_id: int, result: dict) -> None:
        """Tell open pages (and the webhook) about a committed batch."""
        self.ingest_stats.add(batch_points(result))
        if result["status"] in ("finished", "failed"):
            self.activity.forget(run_id)
        else:
            self.activity.saw(run_id)
        if self.hub.has(run_id):
            points = live.points_message(result["stored"])
            self.hub.publish(
                run_id, {"type": "resync"} if points.get("resync") else {"type": "points", "run_id": run_id, **points}
            )
        elif self.fanout is not None and result["stored"]:  # no page here: other processes may have one
            ref = fanout_reference(run_id, result["stored"])
            asyncio.ensure_future(asyncio.to_thread(self._notify, run_id, None, ref))
        for alert in result["alerts"]:
            self.hub.publish(run_id, {"type": "alert", "alert": alert})
            if self.webhook is not None and alert.get("count", 1) == 1:  # a recurrence updates, it does not re-page
                asyncio.ensure_future(self._post_alert(run_id, alert))
        if result["alerts"] or result["status"] or result.get("resumed"):
            asyncio.ensure_future(self._publish_run(run_id))
        else:
            self.hub.publish(RUNS_CHANNEL, {"type": "progress", "id": run_id, "last_step": result["last_step"]})

    def _apply(self, conn, run_id: int, batch: Batch) -> dict:
        # Checked here, in the batch's own transaction, not per connection: after a reconnect the old
        # and the new connection of a run (maybe on two server processes) may both hold the same
        # batch, and only one may store it (ingest.claim_seq).
        state = self.states.get(run_id)
        if state is None or batch.seq != state.last_seq + 1 or not ingest.claim_seq(conn, run_id, batch.seq):
            committed = ingest.committed_seq(conn, run_id)
            if committed is None:
                self.states.pop(run_id, None)
                return {"deleted": True}
            if batch.seq <= committed:
                return {"duplicate": True}
            if batch.seq != committed + 1:
                return {"expected": committed + 1}
            if not ingest.claim_seq(conn, run_id, batch.seq):  # another process stored it meanwhile
                committed = ingest.committed_seq(conn, run_id) or 0
                return {"duplicate": True} if batch.seq <= committed else {"expected": committed + 1}
            # Our cache was missing or behind (another process stored batches of this run): reload it.
            state = self.states[run_id] = ingest.load_state(conn, run_id)
            state.last_seq = batch.seq - 1
        try:
            result = ingest.apply_batch(conn, state, batch, limits=self.limits)
            if run_id in self.activity.stalled:
                result["resumed"] = run_states.resume_stalled(conn, run_id)
        except BaseException:
            self.states.pop(run_id, None)  # the transaction rolls back; so must the cache
            raise
        if result["status"] in ("finished", "failed"):
            self.states.pop(run_id, None)  # release per-run state when a run ends
        return result

    async def _post_alert(self, run_id: int, alert: dict) -> None:
        try:
            run = await self.aread(store.get_run, run_id)
        except store.NotFound:
            run = None
        brief = {k: run[k] for k in ("id", "project", "name", "status", "last_step")} if run else None
        self.webhook.send(payload(alert, brief, self.base_url))

    async def _publish_run(self, run_id: int) -> None:
        try:
            summary = await self.aread(store.get_run, run_id)
        except store.NotFound:
            return
        self.hub.publish(RUNS_CHANNEL, {"type": "run", "run": summary})
        self.hub.publish(run_id, {"type": "run", "run": summary})

    # -- crash and stall detection -----------------------------------------------------------
    async def watch_for_crashes(self, every: float = 2.0) -> None:
        """Disconnected runs become 'crashed' after crash_timeout; connected ones that stopped
        logging for much longer than their own step interval become 'stalled'. A database error
        is logged and the watch goes on."""
        while True:
            await asyncio.sleep(every)
            try:
                await self._check_runs()
            except Exception as exc:  # the watcher must outlive a bad moment of the database
                log.warning("crash/stall check failed (will retry): %r", exc)

    async def _check_runs(self) -> None:
        now = time.time()
        mine = list(self.connected)
        await asyncio.wrap_future(self.writer.submit(run_states.heartbeat, mine, now))
        crashed = await asyncio.wrap_future(
            self.writer.submit(run_states.mark_crashed, now - self.settings.crash_timeout)
        )
        floor = self.settings.crash_timeout
        stalled = [r for r in mine if r not in self.activity.stalled and self.activity.is_stalled(r, now, floor)]
        if stalled:
            self.activity.stalled.update(stalled)
            await asyncio.wrap_future(self.writer.submit(run_states.mark_stalled, stalled, self.activity.intervals()))
        for run_id in crashed:
            self.activity.forget(run_id)
        for run_id in crashed + stalled:
            await self._publish_run(run_id)
