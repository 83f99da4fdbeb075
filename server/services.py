"""The composition root: the server's parts built once per app, started, closed, and a few shared helpers.

The parts: the database (``storage.database``), the one writer thread, the ingest pipeline
(``ingest.pipeline``: batches and the per-run cache), liveness (``ingest.liveness``: crash and
stall detection), the live hub and its publisher (``live``: pages here, other processes, webhook).
"""

from __future__ import annotations

import asyncio

from gradwatch_server.ingest.activity import Activity
from gradwatch_server.ingest.apply import Limits
from gradwatch_server.ingest.liveness import Liveness
from gradwatch_server.ingest.media import MediaLimits
from gradwatch_server.ingest.pipeline import Pipeline
from gradwatch_server.ingest.stats import IngestStats
from gradwatch_server.ingest.writer import Writer
from gradwatch_server.live.hub import Hub
from gradwatch_server.live.publisher import Publisher
from gradwatch_server.notify.dispatcher import Notifier
from gradwatch_server.settings import Settings
from gradwatch_server.storage import database


class Services:
    """Everything a route needs; built once per app by ``create_app``."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # The group fsync (docs/storage.md): an ack still means "on disk", one fsync for many commits.
        grouped = settings.sqlite_synchronous == "full" and settings.sqlite_group_fsync_ms > 0
        self.wal_sync = database.wal_sync(settings.db_url) if grouped else None
        synchronous = "normal" if self.wal_sync else settings.sqlite_synchronous
        self.engine = database.make_engine(settings.db_url, synchronous)
        self.writer = Writer(self.engine, sync=self.wal_sync, sync_delay=settings.sqlite_group_fsync_ms / 1e3)
        self.hub = Hub(settings.max_page_bytes)
        self.publisher = Publisher(self.engine, self.hub, self.aread)
        self.notifier = self.publisher.notifier = Notifier(self.engine, self.writer, settings)
        activity = Activity()  # shared: batches record it, the liveness watch reads it
        self.ingest_stats = IngestStats()
        self.liveness = Liveness(self.writer, self.publisher, activity, settings.crash_timeout)
        self.pipeline = Pipeline(
            self.writer,
            self.publisher,
            activity,
            self.ingest_stats,
            Limits(
                max_keys=settings.max_keys_per_run,
                max_layers=settings.max_layers,
                media=MediaLimits(
                    settings.media_max_run_bytes,
                    settings.media_max_item_bytes,
                    settings.media_max_table_rows,
                    settings.media_max_bins,
                    frozenset(settings.announced_features),
                ),
            ),
            settings.alert_overrides,
            links=self.liveness.connected_clients,  # many live runs: each is asked for a longer gap
        )
        # A failed group commit rolled back every batch in it: every cached run state may be ahead.
        self.writer.on_group_failure = self.pipeline.invalidate_all

    def start(self, loop) -> None:
        """Begin the background parts that need the event loop (cross-process fan-out)."""
        self.publisher.start(loop)

    def close(self) -> None:
        self.publisher.stop()
        self.notifier.close()
        self.writer.close()
        if self.wal_sync is not None:
            self.wal_sync.close()
        self.engine.dispose()

    def read(self, fn, *args, **kwargs):
        """Run a read function from ``store`` on a pooled connection (blocking: call off the event loop)."""
        with self.engine.connect() as conn:
            return fn(conn, *args, **kwargs)

    async def aread(self, fn, *args, **kwargs):
        """``read`` on a worker thread, so a slow query never stalls the event loop."""
        return await asyncio.to_thread(self.read, fn, *args, **kwargs)

    async def write(self, fn, *args):
        """Run ``fn(conn, run_id, *rest)`` (an edit, ``storage.edits``) on the writer thread; then tell open
        pages about the run. The run's cached ingest state is dropped in the same job, before the edit."""
        result = await self.writer.submit_here(self._edit, fn, *args)
        synced = self.writer.synced()
        if synced is not None:  # an edit's answer means on disk, like an ack
            await synced
        if args and isinstance(args[0], int):
            await self.publisher.run_changed(args[0])
        return result

    def _edit(self, conn, fn, run_id, *args):
        self.pipeline.invalidate(run_id)  # a deleted or edited run reloads its writer cache
        return fn(conn, run_id, *args)
