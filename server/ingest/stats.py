"""Counters of what the server ingested (read by ``/metrics``)."""

from __future__ import annotations

import threading
import time
from collections import deque

RATE_WINDOW_S = 10.0


class IngestStats:
    """Points and batches committed, and a sliding window for points per second."""

    def __init__(self):
        self.points = 0
        self.batches = 0
        self._recent: deque = deque()  # (monotonic time, points) of the last RATE_WINDOW_S
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def add(self, points: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self.points += points
            self.batches += 1
            self._recent.append((now, points))
            self._trim(now)

    def rate(self, now: float | None = None) -> float:
        """Points per second over the last RATE_WINDOW_S (or since start, when younger)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._trim(now)
            span = min(RATE_WINDOW_S, max(now - self._started, 1e-3))
            return sum(p for _, p in self._recent) / span

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()


def batch_points(result: dict) -> int:
    """Points a committed batch stored (each vector slot counts as one)."""
    return sum(int(column.values.size) for _kind, _steps, _walls, column in (result.get("stored") or {}).values())
