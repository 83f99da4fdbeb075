"""Page assets: frontend/ and its subfolders are served under /static/, nothing outside it."""

from __future__ import annotations

import gzip
import http.client
import posixpath
import re
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


def get(url: str, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """Status, headers (lower-case names) and raw body of a GET, with no transparent decoding."""
    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_plotly_is_gzipped_for_a_browser_and_revalidated_by_etag(server):
    status, plain_headers, plain = get(server.url, "/static/vendor/plotly.min.js")
    assert status == 200 and "content-encoding" not in plain_headers and len(plain) > 1_000_000
    status, headers, body = get(server.url, "/static/vendor/plotly.min.js", {"Accept-Encoding": "gzip, br"})
    assert status == 200 and headers["content-encoding"] == "gzip" and "max-age" in headers["cache-control"]
    assert len(body) < len(plain) / 2 and gzip.decompress(body) == plain
    again = get(
        server.url, "/static/vendor/plotly.min.js", {"Accept-Encoding": "gzip", "If-None-Match": headers["etag"]}
    )
    assert again[0] == 304 and again[2] == b""


def test_a_page_preloads_every_module_its_script_imports(server):
    """The run page's modules are all fetched at once (no import-level round trips before its first chart)."""
    html = get(server.url, "/runs/1")[2].decode()
    preloaded = set(re.findall(r'<link rel="modulepreload" href="([^"]+)">', html))
    # Every import of every preloaded module is preloaded too, the page's own script among them.
    assert "/static/pages/run.js" in preloaded and "/static/lib/quickchart.js" in preloaded
    for url in preloaded - {"/contract.js"}:
        text = get(server.url, url)[2].decode()
        for spec in re.findall(r'^(?:import|export)\s[^;]*?\bfrom\s+"([^"]+)";', text, re.M):
            target = spec if spec.startswith("/") else posixpath.normpath(posixpath.join(posixpath.dirname(url), spec))
            assert target in preloaded, (url, spec)
    assert '<link rel="preload" as="script" href="/static/vendor/plotly.min.js">' in html
