"""Prometheus ``/metrics`` for the server itself: ingest rate, connected clients, writer queue, live pages.

Needs ``prometheus_client`` (``pip install prometheus-client``); without it ``/metrics`` answers
501 with the install line. Each app has its own registry (tests start many apps in one process).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gradwatch_server.ingest.stats import RATE_WINDOW_S

router = APIRouter()


def gauges(services) -> dict:
    """The server's live numbers, read from what the services already hold."""
    return {
        "connected_clients": services.liveness.connected_clients(),
        "writer_queue_depth": services.writer.depth(),
        "live_subscribers": services.hub.subscribers(),
        "live_channels": services.hub.channels(),
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
            stats, live = services.ingest_stats, gauges(services)
            yield CounterMetricFamily(
                "gradwatch_points_ingested", "Metric points committed (vector slots count each).", value=stats.points
            )
            yield CounterMetricFamily("gradwatch_batches_ingested", "Client batches committed.", value=stats.batches)
            writer = services.writer
            yield CounterMetricFamily(
                "gradwatch_writer_commits", "Transactions the writer committed.", value=writer.commits
            )
            yield CounterMetricFamily(
                "gradwatch_wal_fsyncs", "Group fsyncs of the SQLite WAL (sqlite_group_fsync_ms).", value=writer.syncs
            )
            yield GaugeMetricFamily(
                "gradwatch_points_per_second",
                f"Points committed per second, last {RATE_WINDOW_S:g} s.",
                value=stats.rate(),
            )
            yield GaugeMetricFamily(
                "gradwatch_connected_clients",
                "Open ingest connections (training processes).",
                value=live["connected_clients"],
            )
            yield GaugeMetricFamily(
                "gradwatch_writer_queue_depth",
                "Jobs waiting for the database writer thread.",
                value=live["writer_queue_depth"],
            )
            yield GaugeMetricFamily(
                "gradwatch_live_subscribers",
                "Open browser pages receiving live pushes.",
                value=live["live_subscribers"],
            )

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
        return JSONResponse(
            {"error": "/metrics needs the prometheus_client package: pip install prometheus-client"}, status_code=501
        )
    registry = _registry(request.app.state.services)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
