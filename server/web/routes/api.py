"""JSON API over runs, series and alerts (documented in docs/api.md)."""

from __future__ import annotations

import csv
import io
import re
import urllib.parse

from fastapi import APIRouter, Body, HTTPException, Query, Request
from fastapi.responses import Response

from gradwatch.contract import keys
from gradwatch_server.storage import edits, retention, store

router = APIRouter()


def _services(request: Request):
    return request.app.state.services


@router.get("/healthz")
def healthz(request: Request) -> dict:
    """Liveness: the server answers and the database is reachable."""
    _services(request).read(lambda conn: conn.exec_driver_sql("SELECT 1").scalar())
    return {"status": "ok"}


@router.get("/api/runs/{run_id}")
def get_run(request: Request, run_id: int) -> dict:
    """One run with config, metadata, error and diagnosis."""
    return _services(request).read(store.get_run, run_id)


@router.patch("/api/runs/{run_id}")
async def edit_run(request: Request, run_id: int, body: dict = Body(...)) -> dict:
    """Rename, retag or annotate a run: body with any of name, tags, notes."""
    try:
        changes = edits.check_changes(body)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    services = _services(request)
    await services.write(edits.update_run, run_id, changes)
    return await services.aread(store.get_run, run_id)


@router.delete("/api/runs/{run_id}")
async def delete_run(request: Request, run_id: int) -> dict:
    """Delete a run with all its points and alerts (in short slices: a big run does not hold up ingest)."""
    await retention.delete_run_in_slices(_services(request), run_id)  # also tells open pages
    return {"deleted": run_id}


@router.get("/api/runs/{run_id}/keys")
def list_keys(request: Request, run_id: int) -> list[str]:
    """Metric keys of a run; per-layer gradient norms appear as grad/<parameter name>."""
    return _services(request).read(store.list_keys, run_id)


@router.get("/api/runs/{run_id}/series")
def get_series(
    request: Request,
    run_id: int,
    key: str,
    max_points: int | None = Query(None, ge=4),
    start: int | None = None,
    end: int | None = None,
) -> dict:
    """Points of one key by step; with max_points, a min/max envelope that keeps every spike."""
    return _services(request).read(store.get_series, run_id, key, max_points, start, end)


@router.get("/api/runs/{run_id}/series.csv")
def get_series_csv(request: Request, run_id: int, key: str) -> Response:
    """Every point of one key as CSV (step, wall_time, value)."""
    series = _services(request).read(store.get_series, run_id, key)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["step", "wall_time", "value"])
    for row in zip(series["steps"], series["wall_times"], series["values"]):
        writer.writerow(["" if v is None else v for v in row])
    return Response(
        out.getvalue(),
        media_type="text/csv",
        headers={"Content-Disposition": content_disposition(f"run{run_id}-{key.replace('/', '_')}.csv")},
    )


def content_disposition(filename: str) -> str:
    """An attachment header for any file name: HTTP headers are Latin-1, so a key like '损失' or an
    emoji goes in RFC 5987's ``filename*`` (UTF-8, percent-encoded) beside an ASCII fallback."""
    fallback = re.sub(r"[^A-Za-z0-9._-]", "_", filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{urllib.parse.quote(filename, safe='')}"


@router.get("/api/runs/{run_id}/heatmap")
def get_heatmap(
    request: Request,
    run_id: int,
    key: str = keys.GRAD_VECTOR,
    max_steps: int = Query(400, ge=1, le=5000),
    start: int | None = None,
    end: int | None = None,
) -> dict:
    """Per-layer gradient norms as a layer x step matrix (max per step bucket), optionally for a step range."""
    return _services(request).read(store.get_heatmap, run_id, key, max_steps, start, end)


@router.get("/api/runs/{run_id}/alerts")
def get_alerts(request: Request, run_id: int) -> list[dict]:
    """Alerts raised for a run: kind, step, layer, value, severity, message, created_at."""
    return _services(request).read(store.get_alerts, run_id)


@router.get("/api/compare")
def compare(request: Request, ids: str) -> dict:
    """Several runs' configs with the keys whose values differ: ids=1,2,3."""
    runs = [_services(request).read(store.get_run, i) for i in _id_list(ids)]
    return edits.config_diff(runs)


def _id_list(ids: str, limit: int = 200) -> list[int]:
    try:
        out = [int(x) for x in ids.split(",") if x.strip()]
    except ValueError:
        raise HTTPException(400, "ids must be a comma-separated list of run ids") from None
    if len(out) > limit:
        raise HTTPException(400, f"at most {limit} ids at once")
    return out


@router.get("/api/sparklines")
def sparklines(request: Request, ids: str, key: str = "loss", points: int = Query(40, ge=4, le=400)) -> dict:
    """Small envelopes of one key for many runs at once (the runs list's per-row sparkline).

    ``key=loss`` means each run's own loss key (the one it declared, else ``train_loss`` ...), named per run.
    """
    return {"key": key, "runs": _services(request).read(_sparklines, _id_list(ids), key, points)}


def _sparklines(conn, run_ids: list[int], key: str, points: int) -> dict:
    """Every run's envelope on one connection (a pooled connection per run cost ~5 ms each)."""
    own, out = store.loss_keys(conn, run_ids) if key == "loss" else {}, {}
    for run_id in run_ids:
        try:
            used = own.get(run_id) or key
            s = store.get_series(conn, run_id, used, points)
        except store.NotFound:
            out[str(run_id)] = None  # no such run, or it never logged the key: no sparkline, not an error
            continue
        out[str(run_id)] = {"steps": s["steps"], "values": s["values"], "total_points": s["total_points"], "key": used}
    return out
