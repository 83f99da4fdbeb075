"""Page assets: frontend/ and its subfolders are served under /static/, nothing outside it."""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


def status_of(url: str, path: str) -> tuple[int, str]:
    """Status and content type of a GET sent with the path exactly as written (no client normalising)."""
    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("content-type", "")
    finally:
        conn.close()


def test_lib_and_page_modules_are_served(server):
    for path in ("/static/lib/dom.js", "/static/pages/run.js", "/static/pages/run/xaxis.js", "/static/style.css"):
        status, kind = status_of(server.url, path)
        assert status == 200 and kind.startswith(("application/javascript", "text/css")), path


def test_nothing_outside_frontend_is_served(server):
    for path in (
        "/static/../pyproject.toml",
        "/static/..%2fpyproject.toml",
        "/static/lib/..%2f..%2fpyproject.toml",
        "/static/%2e%2e/%2e%2e/server/app.py",
        "/static/lib/missing.js",
        "/static/lib",
    ):
        assert status_of(server.url, path)[0] == 404, path
