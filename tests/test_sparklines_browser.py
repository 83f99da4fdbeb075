"""The runs list's loss sparklines in real Chromium: 40 runs of 3,000 points each draw fast, one request."""

from __future__ import annotations

import pytest
import sweep_data

from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings

pytestmark = pytest.mark.browser

RUNS, STEPS = 40, 3000


@pytest.fixture
def sweep_server(tmp_path):
    url = f"sqlite:///{tmp_path / 'spark.db'}"
    sweep_data.make(url, RUNS, steps=STEPS)
    srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=url)).start()
    yield srv
    srv.stop()


def test_sparklines_of_40_runs_of_3000_points_draw_fast_in_one_request(sweep_server, page):
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/api/sparklines" in r.url else None)
    page.goto(sweep_server.url + "/")
    page.wait_for_function(
        "() => { const s = document.querySelectorAll('#runs tbody tr[data-run]');"
        " return s.length && [...s].every(tr => tr.querySelector('.spark polyline')); }",
        timeout=20000,
    )
    drawn_ms = page.evaluate("() => performance.now()")  # since navigation began
    rows = page.eval_on_selector_all("#runs tbody tr[data-run]", "els => els.length")
    points = page.eval_on_selector_all("#runs tbody tr[data-run] .spark svg", "els => els.map(e => +e.dataset.points)")
    req = page.evaluate(
        "() => performance.getEntriesByType('resource').filter(e => e.name.includes('/api/sparklines'))"
        ".map(e => [e.startTime, e.duration])[0]"
    )
    print(
        f"\nsparklines: {rows} rows drawn {drawn_ms:.0f} ms after navigation, {len(requests)} request(s), "
        f"sent at {req[0]:.0f} ms, answered in {req[1]:.0f} ms"
    )
    assert rows == len(points) and all(4 <= p <= 100 for p in points)  # a few points each, not 3,000
    assert len(requests) == 1  # one request for every drawn row
    assert drawn_ms < 2500  # #21 saw > 2.5 s; now 0.3-0.5 s (no 3 s throttle before the first)
    assert not page.js_errors
