"""The dashboard's static pages and assets, Plotly.js included, all served locally."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, Response

from gradwatch import contract

router = APIRouter()


def frontend_dir() -> Path:
    """Where the frontend/ files are: inside the installed package, or beside server/ in a checkout."""
    here = Path(__file__).resolve().parents[2]  # the gradwatch_server package directory
    for candidate in (here / "frontend", here.parent / "frontend"):
        if (candidate / "index.html").is_file():
            return candidate
    raise RuntimeError("gradwatch frontend files are not installed")


def plotly_js() -> Path:
    """plotly.min.js shipped inside the plotly Python package (no CDN: clusters are air-gapped)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise RuntimeError("the plotly package is not installed: pip install 'gradwatch[server]'")
    return Path(spec.origin).parent / "package_data" / "plotly.min.js"


def _page(name: str) -> FileResponse:
    return FileResponse(frontend_dir() / name, media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    """The runs list."""
    return _page("index.html")


@router.get("/runs/{run_id}", include_in_schema=False)
def run_page(run_id: int) -> FileResponse:
    """One run's live page."""
    return _page("run.html")


@router.get("/compare", include_in_schema=False)
def compare_page() -> FileResponse:
    """Several runs overlaid: /compare?ids=1,2."""
    return _page("compare.html")


@router.get("/inbox", include_in_schema=False)
def inbox_page() -> FileResponse:
    """Incidents across runs, open first: acknowledge, snooze, mute, resolve."""
    return _page("inbox.html")


@router.get("/rules", include_in_schema=False)
def rules_page() -> FileResponse:
    """A project's alert rules: /rules?project=p, replayed on its recent runs before saving."""
    return _page("rules.html")


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> FileResponse:
    """Browsers ask for /favicon.ico on every page; an SVG answers (a 404 was a console error everywhere)."""
    return FileResponse(
        frontend_dir() / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
    )


@router.get("/static/vendor/plotly.min.js", include_in_schema=False)
def plotly() -> FileResponse:
    return FileResponse(plotly_js(), media_type="application/javascript", headers={"Cache-Control": "max-age=86400"})


@router.get("/contract.js", include_in_schema=False)
def contract_js() -> Response:
    """The facts pages share with the server (statuses, alert kinds, float codec), generated from gradwatch.contract."""
    return Response(contract.es_module(), media_type="application/javascript", headers={"Cache-Control": "no-cache"})


ASSET_TYPES = {".js": "application/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".html": "text/html"}


@router.get("/static/{path:path}", include_in_schema=False)
def static(path: str) -> FileResponse:
    """A page asset: frontend/ and its subfolders (lib/ shared modules, pages/ one module per page)."""
    root = frontend_dir().resolve()
    file = (root / path).resolve()
    if not file.is_relative_to(root) or file.suffix not in ASSET_TYPES or not file.is_file():
        raise HTTPException(404, "no such file")
    return FileResponse(file, media_type=ASSET_TYPES[file.suffix], headers={"Cache-Control": "no-cache"})
