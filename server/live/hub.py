"""Fan-out of committed data to open browser pages (one asyncio queue per page)."""

from __future__ import annotations

import asyncio
import base64

import numpy as np

from gradwatch import protocol

RUNS_CHANNEL = "runs"
QUEUE_LIMIT = 1000


class Hub:
    """Channels are a run id (its points, alerts, status) or "runs" (the runs list)."""

    def __init__(self):
        self._subs: dict = {}
        self.forward = None  # set with several server processes: also send every message to the others

    def has(self, channel) -> bool:
        """Whether any page listens on ``channel`` (pushes are only built for those)."""
        return bool(self._subs.get(channel))

    def subscribers(self) -> int:
        """Open page feeds, over all channels."""
        return sum(len(queues) for queues in self._subs.values())

    def channels(self) -> int:
        return sum(1 for queues in self._subs.values() if queues)

    def subscribe(self, channel) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(QUEUE_LIMIT)
        self._subs.setdefault(channel, set()).add(queue)
        return queue

    def unsubscribe(self, channel, queue: asyncio.Queue) -> None:
        self._subs.get(channel, set()).discard(queue)

    def publish(self, channel, message: dict) -> None:
        """Deliver to this process's pages, and to the other processes' (fanout.py) when there are any."""
        self.deliver(channel, message)
        if self.forward is not None:
            self.forward(channel, message)

    def deliver(self, channel, message: dict) -> None:
        """Deliver on the event loop; a page too slow to keep up is told to reload its data."""
        for queue in list(self._subs.get(channel, ())):
            try:
                queue.put_nowait(message)
            except asyncio.QueueFull:
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait({"type": "resync"})


LIVE_POINTS_MAX = 5000  # per key and batch; a bigger push tells the page to refetch instead


def points_message(stored: dict) -> dict:
    """A committed batch as the page push: scalars as lists, vectors one base64 float64 row per step."""
    series, vectors = {}, {}
    for key, (kind, steps, walls, column) in stored.items():
        if len(steps) > LIVE_POINTS_MAX:
            return {"series": {}, "vectors": {}, "resync": True}
        if kind == "scalar":
            series[key] = {
                "steps": steps.tolist(),
                "values": _json_floats(column.values[:, 0]),
                "wall_times": walls.tolist(),
            }
        else:
            vectors[key] = {"steps": steps.tolist(), "values": [_vector_row(column, i) for i in range(len(steps))]}
    return {"series": series, "vectors": vectors}


def _json_floats(values: np.ndarray) -> list:
    if np.isfinite(values).all():
        return values.tolist()
    return [protocol.encode_float(v) for v in values.tolist()]


def _vector_row(column, i: int) -> dict:
    out: dict = {"f64": base64.b64encode(np.ascontiguousarray(column.values[i], dtype="<f8").tobytes()).decode()}
    if column.missing is not None and column.missing[i].any():
        out["missing"] = np.flatnonzero(column.missing[i]).tolist()
    return out
