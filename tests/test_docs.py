"""Every route of the app is documented in docs/api.md."""

from pathlib import Path

from gradwatch_server.routes import api, ingest_ws, live_ws, pages

API_DOC = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
PAGES = {"/static/{name}", "/static/vendor/plotly.min.js", "/", "/runs/{run_id}", "/compare"}


def test_every_route_is_documented():
    paths = {r.path for m in (api, ingest_ws, live_ws, pages) for r in m.router.routes}
    missing = [p for p in paths - PAGES if f"`{p}`" not in API_DOC]
    assert not missing, f"undocumented routes: {missing}"
    assert len(paths - PAGES) >= 12
    for page in ("/runs/{run_id}", "/compare", "/static/vendor/plotly.min.js"):
        assert page in API_DOC
