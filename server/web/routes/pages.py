"""The dashboard's static pages and assets, Plotly.js included, all served locally."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import posixpath
import re
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

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


MODULE_SCRIPT = re.compile(r'<script type="module" src="(/static/[^"]+)"')
IMPORT_FROM = re.compile(r'^(?:import|export)\s[^;]*?\bfrom\s+"([^"]+)";', re.M)


def module_closure(entry: str) -> list[str]:
    """The URLs of every module a page module imports, directly or through others (static imports)."""
    root, seen, todo = frontend_dir(), [], [entry]
    while todo:
        url = todo.pop(0)
        if url in seen:
            continue
        seen.append(url)
        file = root / url.removeprefix("/static/")
        if not url.startswith("/static/") or not file.is_file():
            continue  # /contract.js (generated), or a missing file the browser will report
        for spec in IMPORT_FROM.findall(file.read_text(encoding="utf-8")):
            todo.append(
                spec if spec.startswith("/") else posixpath.normpath(posixpath.join(posixpath.dirname(url), spec))
            )
    return seen


def _page(name: str) -> HTMLResponse:
    """A page with a modulepreload link for each module its scripts import: the browser fetches them all at
    once instead of one import level after another (a round trip each), so the first charts come sooner."""
    html = (frontend_dir() / name).read_text(encoding="utf-8")
    modules = dict.fromkeys(u for entry in MODULE_SCRIPT.findall(html) for u in module_closure(entry))
    links = "".join(f'<link rel="modulepreload" href="{url}">\n' for url in modules)
    return HTMLResponse(html.replace("</head>", links + "</head>", 1), headers={"Cache-Control": "no-cache"})


@router.get("/", include_in_schema=False)
def index() -> HTMLResponse:
    """The runs list."""
    return _page("index.html")


@router.get("/runs/{run_id}", include_in_schema=False)
def run_page(run_id: int) -> HTMLResponse:
    """One run's live page."""
    return _page("run.html")


@router.get("/compare", include_in_schema=False)
def compare_page() -> HTMLResponse:
    """Several runs overlaid: /compare?ids=1,2."""
    return _page("compare.html")


@router.get("/inbox", include_in_schema=False)
def inbox_page() -> HTMLResponse:
    """Incidents across runs, open first: acknowledge, snooze, mute, resolve."""
    return _page("inbox.html")


@router.get("/rules", include_in_schema=False)
def rules_page() -> HTMLResponse:
    """A project's alert rules: /rules?project=p, replayed on its recent runs before saving."""
    return _page("rules.html")


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> FileResponse:
    """Browsers ask for /favicon.ico on every page; an SVG answers (a 404 was a console error everywhere)."""
    return FileResponse(
        frontend_dir() / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
    )


@functools.lru_cache(maxsize=1)
def _gzipped(path: str, mtime_ns: int) -> bytes:
    """The file gzipped, once per version of it (plotly.min.js: 4.8 MB to about 1.4 MB)."""
    return gzip.compress(Path(path).read_bytes(), compresslevel=6)


@router.get("/static/vendor/plotly.min.js", include_in_schema=False)
def plotly(request: Request) -> Response:
    """Plotly.js, gzipped for a browser that takes it (a quarter of the bytes over a slow link), with an ETag
    (a revisit within the day reuses the browser's copy, and Chromium's compiled code for it, unasked; later, a 304)."""
    file = plotly_js()
    headers = {"Cache-Control": "max-age=86400", "Vary": "Accept-Encoding"}
    if "gzip" not in request.headers.get("accept-encoding", ""):
        return FileResponse(file, media_type="application/javascript", headers=headers)
    stat = file.stat()
    etag = f'"{stat.st_mtime_ns:x}-{stat.st_size:x}-gzip"'
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers={**headers, "ETag": etag})
    body = _gzipped(str(file), stat.st_mtime_ns)
    return Response(
        body, media_type="application/javascript", headers={**headers, "ETag": etag, "Content-Encoding": "gzip"}
    )


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
