"""Fan-out of committed data to open browser pages (one asyncio queue per page, of text encoded once)."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import deque

import numpy as np

from gradwatch import protocol

log = logging.getLogger("gradwatch.server")
RUNS_CHANNEL = "runs"
QUEUE_LIMIT = 1000  # messages one page may have waiting
PAGE_BYTES = 8 << 20  # default bytes one page may have waiting (the max_page_bytes setting)


def encode(message: dict) -> str:
    """A push as the text every page receives: strict, compact JSON (non-finite floats travel as strings)."""
    return protocol.dumps(message)


RESYNC = encode({"type": "resync"})


class Feed:
    """One page's pushes waiting to be sent, bounded in count and bytes: a page that falls behind
    either is dropped to a single ``resync`` (it reloads its data) instead of holding ever more."""

    def __init__(self, budget: int = PAGE_BYTES):
        self.budget = budget
        self.items: deque = deque()
        self.bytes = 0
        self.resyncs = 0  # how often this page fell behind (tests, diagnostics)
        self._ready = asyncio.Event()

    def put(self, text: str) -> None:
        if len(self.items) >= QUEUE_LIMIT or self.bytes + len(text) > self.budget:
            self.items.clear()
            self.bytes, text = 0, RESYNC
            self.resyncs += 1
        self.items.append(text)
        self.bytes += len(text)
        self._ready.set()

    async def get(self) -> str:
        while not self.items:
            self._ready.clear()
            await self._ready.wait()
        return self.get_nowait()

    def get_nowait(self) -> str:
        """The oldest waiting push; IndexError when none waits."""
        text = self.items.popleft()
        self.bytes -= len(text)
        return text

    def qsize(self) -> int:
        return len(self.items)


class Hub:
    """Channels are a run id (its points, alerts, status) or "runs" (the runs list).

    A message is encoded to text once per publish, however many pages listen: each page's queue
    holds the same string, and its websocket sends it as is.
    """

    def __init__(self, page_bytes: int = PAGE_BYTES):
        self.page_bytes = page_bytes
        self._subs: dict = {}
        # Set with several server processes: forward(channel, message, text) also sends every
        # message to the others (text: the encoded message, None when no page here listens).
        self.forward = None

    def has(self, channel) -> bool:
        """Whether any page listens on ``channel`` (pushes are only built for those)."""
        return bool(self._subs.get(channel))

    def subscribers(self) -> int:
        """Open page feeds, over all channels."""
        return sum(len(queues) for queues in self._subs.values())

    def channels(self) -> int:
        return sum(1 for queues in self._subs.values() if queues)

    def subscribe(self, channel) -> Feed:
        """A page's feed of pushes on ``channel``, each already encoded text."""
        queue = Feed(self.page_bytes)
        self._subs.setdefault(channel, set()).add(queue)
        return queue

    def unsubscribe(self, channel, queue: Feed) -> None:
        self._subs.get(channel, set()).discard(queue)

    def publish(self, channel, message: dict) -> None:
        """Deliver to this process's pages, and to the other processes' (fanout.py) when there are any."""
        text = self._encoded(message) if self.has(channel) else None
        if text is not None:
            self.deliver_text(channel, text)
        if self.forward is not None:
            self.forward(channel, message, text)

    def deliver(self, channel, message: dict) -> None:
        """Deliver a message (from another process) to this process's pages only."""
        if self.has(channel):
            self.deliver_text(channel, self._encoded(message))

    def deliver_text(self, channel, text: str) -> None:
        """Deliver encoded text on the event loop; a page too slow to keep up is told to reload its data."""
        for queue in list(self._subs.get(channel, ())):
            queue.put(text)

    @staticmethod
    def _encoded(message: dict) -> str:
        try:
            return encode(message)
        except (TypeError, ValueError) as exc:  # never let one bad push fail an ingest: pages reload instead
            log.warning("gradwatch: a live push could not be encoded (%r); pages resync", exc)
            return RESYNC


LIVE_POINTS_MAX = 5000  # per key and batch; a bigger push tells the page to refetch instead


def points_message(run_id: int, stored: dict, last_step: int | None) -> dict:
    """A committed batch as the page push (docs/api.md): scalars as lists, vectors one base64 float64 row
    per step, and the run's newest step; ``{"type": "resync"}`` when a key holds too many points."""
    series, vectors = {}, {}
    for key, (kind, steps, walls, column) in stored.items():
        if len(steps) > LIVE_POINTS_MAX:
            return {"type": "resync"}
        if kind == "scalar":
            series[key] = {
                "steps": steps.tolist(),
                "values": _json_floats(column.values[:, 0]),
                "wall_times": walls.tolist(),
            }
        else:
            vectors[key] = {"steps": steps.tolist(), "values": _vector_rows(column)}
    return {"type": "points", "run_id": run_id, "series": series, "vectors": vectors, "last_step": last_step}


def _json_floats(values: np.ndarray) -> list:
    if np.isfinite(values).all():
        return values.tolist()
    return [protocol.encode_float(v) for v in values.tolist()]


def _vector_rows(column) -> list[dict]:
    """Each step's row as {"f64": base64 little-endian float64[, "missing": [slots]]}: one conversion
    of the whole column, then a slice of its bytes per row."""
    raw = np.ascontiguousarray(column.values, dtype="<f8").tobytes()
    width = column.values.shape[1] * 8
    rows = [{"f64": base64.b64encode(raw[i : i + width]).decode()} for i in range(0, len(raw), width)]
    if column.missing is not None:
        for i in np.flatnonzero(column.missing.any(axis=1)).tolist():
            rows[i]["missing"] = np.flatnonzero(column.missing[i]).tolist()
    return rows
