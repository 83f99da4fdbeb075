"""Prometheus ``/metrics`` for the server itself: ingest rate, connected clients, writer queue, live pages.

Needs ``prometheus_client`` (``pip install prometheus-client``); without it ``/metrics`` answers
501 with the install line. Each app has its own registry (tests start many apps in one process).
"""

from __future__ import annotations

import threading
import time
from collections import deque

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

router = APIRouter()
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


def stats_of(services) -> IngestStats:
    """The services' ingest counters, created on first use."""
    stats = getattr(services, "ingest_stats", None)
    if stats is None:
        stats = services.ingest_stats = IngestStats()
    return stats


def count_batch(services, result: dict) -> None:
    """Count one committed batch's points (called from ``Services.after_batch``); never raises."""
    try:
        stored = result.get("stored") or {}
        stats_of(services).add(sum(int(column.values.size) for _kind, _steps, _walls, column in stored.values()))
    except Exception:  # noqa: BLE001 - counting must never break ingest
        pass


def gauges(services) -> dict:
    """The server's live numbers, read from what the services already hold."""
    subs = getattr(services.hub, "_subs", {})
    return {
        "connected_clients": sum(n for n in services.connected.values() if n > 0),
        "writer_queue_depth": services.writer.depth(),
        "live_subscribers": sum(len(queues) for queues in list(subs.values())),
        "live_channels": sum(1 for queues in list(subs.values()) if queues),
    }


def _registry(services):
    """One registry per app, with a collector that reads the services at scrape time."""
    registry = getattr(services, "prometheus_registry", None)
    if registry is not None:
        return registry
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self):
            stats, live = stats_of(services), gauges(services)
            yield CounterMetricFamily("gradwatch_points_ingested", "Metric points committed (vector slots count each).",
                                      value=stats.points)
            yield CounterMetricFamily("gradwatch_batches_ingested", "Client batches committed.", value=stats.batches)
            yield GaugeMetricFamily("gradwatch_points_per_second", f"Points committed per second, last {RATE_WINDOW_S:g} s.",
                                    value=stats.rate())
            yield GaugeMetricFamily("gradwatch_connected_clients", "Open ingest connections (training processes).",
                                    value=live["connected_clients"])
            yield GaugeMetricFamily("gradwatch_writer_queue_depth", "Jobs waiting for the database writer thread.",
                                    value=live["writer_queue_depth"])
            yield GaugeMetricFamily("gradwatch_live_subscribers", "Open browser pages receiving live pushes.",
                                    value=live["live_subscribers"])

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    services.prometheus_registry = registry
    return registry


@router.get("/metrics", include_in_schema=False)  # Prometheus text, not the JSON API
def metrics(request: Request) -> Response:
    """Prometheus text exposition of the server's own metrics."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    except ImportError:
        return JSONResponse({"error": "/metrics needs the prometheus_client package: pip install prometheus-client"},
                            status_code=501)
    registry = _registry(request.app.state.services)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
