"""Telling open pages what was committed: this process's (hub.py), the other processes' (fanout.py), notifications.

The one place that turns a committed change into pushes. Callers say what changed (a batch's
points and alerts, a run's summary, a deletion) after its transaction committed; this module
builds each push once and hands it to the hub, which encodes it once for every page here and
forwards it to the other server processes on PostgreSQL. A new alert also goes to the notifier
(``notify/``), which pages each incident once on the project's channels and the server-wide ``--webhook``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gradwatch_server.live.fanout import PgFanout, stored_reference
from gradwatch_server.live.hub import RUNS_CHANNEL, Hub, points_message
from gradwatch_server.storage import store

log = logging.getLogger("gradwatch.server")


class Publisher:
    """Pushes for committed changes; ``aread(fn, *args)`` runs a ``store`` read off the event loop."""

    def __init__(self, engine, hub: Hub, aread: Callable[..., Awaitable]):
        self.engine = engine
        self.hub = hub
        self.aread = aread
        self.notifier = None  # notify.dispatcher.Notifier: the channels, --webhook included (set by services)
        self._summaries: dict = {}  # run id -> another change came while its summary was being read
        # Several server processes over one PostgreSQL: pages see what any of them ingests.
        self.fanout = PgFanout(engine, self._from_other_process) if engine.dialect.name == "postgresql" else None

    def start(self, loop) -> None:
        """Begin the cross-process fan-out (it needs the event loop)."""
        if self.fanout is not None:
            self.fanout.start(loop)
            self.hub.forward = self._to_other_processes

    def stop(self) -> None:
        if self.fanout is not None:
            self.fanout.stop()

    # -- what changed -------------------------------------------------------------------------
    def points(self, run_id: int, stored: dict, last_step: int | None) -> None:
        """A committed batch's points (ingest's ``stored``) to the run's pages, here or in other processes."""
        if self.hub.has(run_id):
            self.hub.publish(run_id, points_message(run_id, stored, last_step))
        elif self.fanout is not None and stored:  # no page here: other processes may have one
            ref = stored_reference(run_id, stored, last_step)
            asyncio.ensure_future(asyncio.to_thread(self._notify, run_id, None, ref))

    def alert(self, run_id: int, alert: dict) -> None:
        """A new or updated alert to the run's pages; a new one also to the notifier (it pages incidents)."""
        self.hub.publish(run_id, {"type": "alert", "alert": alert})
        if self.notifier is not None and alert.get("count", 1) == 1:  # a recurrence updates, it does not re-page
            self.notifier.offer(run_id, alert)  # queued, never waited on

    def progress(self, run_id: int, last_step: int | None) -> None:
        """A run's newest step, for the runs list."""
        self.hub.publish(RUNS_CHANNEL, {"type": "progress", "id": run_id, "last_step": last_step})

    async def run_changed(self, run_id: int) -> None:
        """A run's summary (status, name, alert count, ...; never its config) to the runs list and the
        run's pages. At most one read per run is in flight: changes meanwhile are folded into one more."""
        if not (self.hub.has(RUNS_CHANNEL) or self.hub.has(run_id) or self.fanout is not None):
            return  # nobody could see it
        if run_id in self._summaries:
            self._summaries[run_id] = True
            return
        self._summaries[run_id] = False
        try:
            while True:
                summary = await self.aread(store.run_summary, run_id)
                self.hub.publish(RUNS_CHANNEL, {"type": "run", "run": summary})
                self.hub.publish(run_id, {"type": "run", "run": summary})
                if not self._summaries[run_id]:
                    return
                self._summaries[run_id] = False
        except store.NotFound:
            return
        finally:
            del self._summaries[run_id]

    def deleted(self, run_id: int) -> None:
        self.hub.publish(RUNS_CHANNEL, {"type": "deleted", "id": run_id})
        self.hub.publish(run_id, {"type": "deleted", "id": run_id})

    # -- the other server processes (PostgreSQL LISTEN/NOTIFY) ----------------------------------
    def _to_other_processes(self, channel, message: dict, encoded: str | None) -> None:
        asyncio.ensure_future(asyncio.to_thread(self._notify, channel, message, None, encoded))

    def _notify(self, channel, message: dict | None, ref: dict | None = None, encoded: str | None = None) -> None:
        try:
            with self.engine.begin() as conn:
                self.fanout.send(conn, channel, message, ref, encoded)
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
                summary = await self.aread(store.run_summary, ref["run_id"])
                self.hub.deliver(channel, {"type": "run", "run": summary})
            elif ref.get("type") == "points" and ref.get("lo") is not None:
                stored = await self.aread(store.points_between, ref["run_id"], ref["keys"], ref["lo"], ref["hi"])
                self.hub.deliver(channel, points_message(ref["run_id"], stored, ref.get("last_step")))
            else:
                self.hub.deliver(channel, {"type": "resync"})
        except store.NotFound:
            return
