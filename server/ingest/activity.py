"""When did each run last send data, and how often does it usually: the basis for 'stalled'."""

from __future__ import annotations

import time

STALL_FACTOR = 30  # a run is stalled after this many of its usual intervals without data ...
STALL_CEILING = 3600.0  # ... but never later than an hour


class Activity:
    """Per-run time of the last batch and a moving average of the time between batches."""

    def __init__(self):
        self.last: dict[int, float] = {}
        self.interval: dict[int, float] = {}
        self.stalled: set[int] = set()

    def saw(self, run_id: int, now: float | None = None) -> None:
        now = now or time.time()
        last = self.last.get(run_id)
        if last is not None:
            gap = now - last
            old = self.interval.get(run_id)
            self.interval[run_id] = gap if old is None else 0.9 * old + 0.1 * gap
        self.last[run_id] = now
        self.stalled.discard(run_id)

    def is_stalled(self, run_id: int, now: float, floor: float) -> bool:
        """No data for max(floor, STALL_FACTOR x the run's usual interval) while connected."""
        last = self.last.setdefault(run_id, now)  # unknown (a restart): count from now
        return now - last > self.threshold(run_id, floor)

    def threshold(self, run_id: int, floor: float) -> float:
        return min(STALL_CEILING, max(floor, STALL_FACTOR * self.interval.get(run_id, 0.0)))

    def intervals(self) -> dict[int, float]:
        return dict(self.interval)

    def forget(self, run_id: int) -> None:
        """Release a run's entries (it ended or crashed)."""
        self.last.pop(run_id, None)
        self.interval.pop(run_id, None)
        self.stalled.discard(run_id)
