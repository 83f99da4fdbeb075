"""Histograms, images, tables and ``run.summary`` of a run, read back (documented in docs/api.md).

Every path sits under ``/api/runs/{run_id}/`` so the run's access rules cover it; an image is served
only through the run it belongs to.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gradwatch_server.storage.media import rows as media
from gradwatch_server.storage.media import summary as run_summary

router = APIRouter()


def _read(request: Request, fn, *args):
    return request.app.state.services.read(fn, *args)


@router.get("/api/runs/{run_id}/media")
def list_media(request: Request, run_id: int) -> list[dict]:
    """Every histogram, image, table and text key of a run: its kind, step count, first and last step."""
    return _read(request, media.list_media, run_id)


@router.get("/api/runs/{run_id}/histograms")
def get_histograms(
    request: Request,
    run_id: int,
    key: str,
    max_steps: int = Query(400, ge=1, le=5000),
    start: int | None = None,
    end: int | None = None,
) -> dict:
    """One histogram key over steps (bins, counts, NaN/inf counts), evenly thinned to ``max_steps``."""
    return _read(request, media.histograms, run_id, key, max_steps, start, end)


@router.get("/api/runs/{run_id}/images")
def get_images(request: Request, run_id: int, key: str, step: int | None = None) -> dict:
    """The images of a key at a step (default the last; else the last logged at or before it), and every step it has."""
    return _read(request, media.images, run_id, key, step)


@router.get("/api/runs/{run_id}/images/{image_id}.png")
def get_image_png(request: Request, run_id: int, image_id: int) -> Response:
    """One image's PNG."""
    body = _read(request, media.image_png, run_id, image_id)
    return Response(body, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})


@router.get("/api/runs/{run_id}/tables")
def get_table(request: Request, run_id: int, key: str, step: int | None = None) -> dict:
    """A table (columns, rows) or text logged under a key at a step (default the last), and every step it has."""
    return _read(request, media.table, run_id, key, step)


@router.get("/api/runs/{run_id}/summary")
def get_summary(request: Request, run_id: int) -> dict:
    """What the script set in ``run.summary`` (W&B's), key -> value."""
    _read(request, media.list_media, run_id)  # 404 for a run that does not exist
    return _read(request, run_summary.of_runs, [run_id]).get(run_id, {})
