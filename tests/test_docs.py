"""Every route of the app is documented in docs/api.md."""

from pathlib import Path

from gradwatch_server.web import routes

API_DOC = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
PAGES = {"/static/{name}", "/static/vendor/plotly.min.js", "/", "/runs/{run_id}", "/compare", "/favicon.ico"}
LOGIN = {"/login", "/login/status"}  # documented in docs/security.md


def test_every_route_is_documented():
    paths = {r.path for m in routes.ALL for r in m.router.routes}
    missing = [p for p in paths - PAGES - LOGIN if f"`{p}`" not in API_DOC]
    assert not missing, f"undocumented routes: {missing}"
    assert len(paths - PAGES) >= 12
    for page in ("/runs/{run_id}", "/compare", "/static/vendor/plotly.min.js"):
        assert page in API_DOC
    security = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    assert all(p in security for p in LOGIN)
