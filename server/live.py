"""Fan-out of committed data to open browser pages (one asyncio queue per page)."""

from __future__ import annotations

import asyncio

RUNS_CHANNEL = "runs"
QUEUE_LIMIT = 1000


class Hub:
    """Channels are a run id (its points, alerts, status) or "runs" (the runs list)."""

    def __init__(self):
        self._subs: dict = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def subscribe(self, channel) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(QUEUE_LIMIT)
        self._subs.setdefault(channel, set()).add(queue)
        return queue

    def unsubscribe(self, channel, queue: asyncio.Queue) -> None:
        self._subs.get(channel, set()).discard(queue)

    def publish(self, channel, message: dict) -> None:
        """Deliver on the event loop; a page too slow to keep up is told to reload its data."""
        for queue in list(self._subs.get(channel, ())):
            try:
                queue.put_nowait(message)
            except asyncio.QueueFull:
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait({"type": "resync"})

    def publish_threadsafe(self, channel, message: dict) -> None:
        """Publish from another thread (the writer)."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.publish, channel, message)
