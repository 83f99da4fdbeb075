"""The server's moving parts in one object: database, writer, live hub, webhook."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from sqlalchemy import select

from . import db, ingest, store
from .live import RUNS_CHANNEL, Hub
from .settings import Settings
from .webhook import WebhookSender, payload
from .writer import Writer


class Services:
    """Everything a route needs; built once per app by ``create_app``."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.engine = db.make_engine(settings.db_url)
        self.writer = Writer(self.engine)
        self.hub = Hub()
        self.webhook = WebhookSender(settings.webhook) if settings.webhook else None
        self.states: dict[int, ingest.RunState] = {}  # touched only on the writer thread
        self.connected: Counter = Counter()
        self.base_url = ""

    def read(self, fn, *args, **kwargs):
        """Run a read function from ``store`` on a pooled connection."""
        with self.engine.connect() as conn:
            return fn(conn, *args, **kwargs)

    async def write(self, fn, *args):
        """Run ``fn(conn, *args)`` on the writer thread; then tell open pages about the run."""
        result = await asyncio.wrap_future(self.writer.submit(self._edit, fn, *args))
        if args and isinstance(args[0], int):
            self._publish_run(args[0])
        return result

    def _edit(self, conn, fn, run_id, *args):
        self.states.pop(run_id, None)  # a deleted or edited run reloads its writer cache
        return fn(conn, run_id, *args)

    def close(self) -> None:
        self.writer.close()
        self.engine.dispose()

    # -- ingest (called by the websocket route) ------------------------------------------
    async def open_run(self, info: dict, resume_from: int | None = None, layouts: dict | None = None) -> dict:
        result = await asyncio.wrap_future(self.writer.submit(self._open, info, resume_from, layouts))
        self._publish_run(result["run_id"])
        return result

    def _open(self, conn, info: dict, resume_from: int | None, layouts: dict | None) -> dict:
        result = ingest.open_run(conn, info, self.settings.alert_overrides, resume_from=resume_from)
        added = ingest.ensure_layouts(conn, result["run_id"], layouts or {})
        if result.get("skipped") or added:
            self.states.pop(result["run_id"], None)  # its cached seq / keys are behind the database now
        return result

    async def ingest_batch(self, run_id: int, message: dict) -> dict:
        """Commit one batch; returns the live push, or {"duplicate": True} / {"expected": n} untouched."""
        try:
            push = await asyncio.wrap_future(self.writer.submit(self._apply, run_id, message))
        except Exception:
            # The transaction (maybe its commit) failed: the cached state may be ahead of the database.
            self.writer.submit(lambda _conn: self.states.pop(run_id, None))
            raise
        if "duplicate" in push or "expected" in push:
            return push
        self.hub.publish(run_id, {"type": "points", "run_id": run_id, **push})
        for alert in push["alerts"]:
            self.hub.publish(run_id, {"type": "alert", "alert": alert})
            if self.webhook is not None:
                self.webhook.send(payload(alert, self._run_brief(run_id), self.base_url))
        if push["alerts"] or push["status"]:
            self._publish_run(run_id)
        else:
            self.hub.publish(RUNS_CHANNEL, {"type": "progress", "id": run_id, "last_step": push["last_step"]})
        return push

    def _apply(self, conn, run_id: int, message: dict) -> dict:
        state = self.states.get(run_id) or ingest.load_state(conn, run_id)
        self.states[run_id] = state
        # Checked here, on the one writer thread, not per connection: after a reconnect the old and
        # the new connection of a run may both hold the same batch, and only one may store it.
        if message["seq"] <= state.last_seq:
            return {"duplicate": True}
        if message["seq"] != state.last_seq + 1:
            return {"expected": state.last_seq + 1}
        try:
            return ingest.apply_batch(conn, state, message)
        except BaseException:
            self.states.pop(run_id, None)  # the transaction rolls back; so must the cache
            raise

    def _run_brief(self, run_id: int) -> dict | None:
        try:
            run = self.read(store.get_run, run_id)
        except store.NotFound:
            return None
        return {k: run[k] for k in ("id", "project", "name", "status", "last_step")}

    def _publish_run(self, run_id: int) -> None:
        try:
            summary = self.read(store.get_run, run_id)
        except store.NotFound:
            return
        self.hub.publish(RUNS_CHANNEL, {"type": "run", "run": summary})
        self.hub.publish(run_id, {"type": "run", "run": summary})

    # -- crash detection -------------------------------------------------------------------
    async def watch_for_crashes(self, every: float = 2.0) -> None:
        """Runs that stay disconnected past crash_timeout without finishing become 'crashed'."""
        while True:
            await asyncio.sleep(every)
            cutoff = time.time() - self.settings.crash_timeout
            rows = self.read(lambda conn: conn.execute(
                select(db.runs.c.id).where(db.runs.c.status == "running", db.runs.c.updated_at < cutoff)).all())
            stale = [r.id for r in rows if not self.connected[r.id]]
            if stale:
                await asyncio.wrap_future(self.writer.submit(ingest.mark_crashed, stale))
                for run_id in stale:
                    self._publish_run(run_id)
