"""The HTTP API fuzzed against its own OpenAPI schema (schemathesis) on a real server: never a 5xx."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
import schemathesis
from conftest import Api, wait_runs
from fastapi import FastAPI
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from training import train

import gradwatch
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings
from gradwatch_server.web import routes

EXAMPLES = 30  # per operation: ~11 operations, well under a minute on a shared 2-core machine
ODD_KEY = "odd/ключ ✓"  # a real key outside Latin-1
SEEDED_KEYS = ("loss", "grad", "grad/global_norm", ODD_KEY)


def seed_runs(url: str) -> None:
    """Runs 1-4 with real points, per-layer gradients, a NaN and an odd config, for the fuzzer to hit."""
    for i in range(4):
        with gradwatch.init(
            project="fuzz",
            name=f"run {i}",
            server=url,
            config={"lr": 0.05, "nested": {"a": [1, 2]}, "odd key é/✓": None},
        ) as run:
            train(run, steps=30)
            run.log({ODD_KEY: float("nan"), "loss": float("inf")})
    wait_runs(Api(url), 4)


def _schema_of_the_api() -> dict:
    """The JSON API's OpenAPI document, built without a database (test_schema_is_the_servers checks it)."""
    app = FastAPI(title="gradwatch", version="0.1.0")
    for module in routes.JSON_API:
        app.include_router(module.router)
    return app.openapi()


schema = schemathesis.openapi.from_dict(_schema_of_the_api())


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    """One real server with seeded runs for every fuzzed operation (a server per example would be slow)."""
    db = tmp_path_factory.mktemp("fuzz") / "gradwatch.db"
    srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=f"sqlite:///{db}", crash_timeout=30.0)).start()
    seed_runs(srv.url)
    yield srv
    srv.stop()


def test_schema_is_the_servers(fuzz_server):
    assert Api(fuzz_server.url).get("/openapi.json")["paths"] == _schema_of_the_api()["paths"]


@schema.parametrize()
@hsettings(max_examples=EXAMPLES, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_never_answers_5xx(case, fuzz_server):
    aim_at_seeded_data(case)
    response = case.call(base_url=fuzz_server.url, timeout=30)
    assert response.status_code < 500, (case.as_curl_command(), response.status_code, response.text[:500])
    if response.status_code >= 400:
        assert "error" in response.json(), response.text[:500]


def aim_at_seeded_data(case) -> None:
    """Most run ids and half the keys point at seeded runs and their keys, so the fuzzer reaches real data.

    Only run 4 may be deleted: runs 1-3 must outlive the fuzzing for the regression tests below.
    """
    run_id = (case.path_parameters or {}).get("run_id")
    if case.method == "DELETE" and isinstance(run_id, int):
        if abs(run_id) < 1 << 62:  # huge ids stay as drawn (a clear 400); every other delete hits run 4
            case.path_parameters["run_id"] = 4
    elif isinstance(run_id, int) and abs(run_id) < 1 << 62 and run_id % 4 != 3:
        case.path_parameters["run_id"] = 1 + run_id % 3  # huge ids and a quarter of the rest stay as drawn
    key = (case.query or {}).get("key")
    if isinstance(key, str) and len(key) % 2 == 0:
        case.query["key"] = SEEDED_KEYS[len(key) // 2 % len(SEEDED_KEYS)]


# --- nasty inputs, kept as explicit regressions ------------------------------------------------


@pytest.mark.parametrize(
    "method, path, body, status",
    [
        ("GET", "/api/runs/99999999999999999999", None, 400),  # beyond 64-bit
        ("GET", "/api/runs/1/series?key=loss&start=-99999999999999999999", None, 400),
        ("GET", "/api/compare?ids=1,99999999999999999999", None, 400),
        ("GET", "/api/compare?ids=1,x", None, 400),
        ("GET", "/api/runs/1/series?key=%00", None, 404),
        ("GET", "/api/runs?q=%00%25_", None, 200),
        ("GET", "/api/runs?q=%ED%B3%BF", None, 200),  # a lone surrogate, UTF-8-encoded
        ("GET", "/api/runs/1/series?key=loss&start=5&end=1", None, 200),
        ("GET", "/api/runs/1/series?key=loss&max_points=3", None, 422),
        ("PATCH", "/api/runs/1", b'{"notes": NaN}', 400),  # bare NaN is not JSON
        ("PATCH", "/api/runs/1", b'{"tags": [1e999]}', 400),
        ("PATCH", "/api/runs/1", b"[" * 100000, 400),  # deeply nested
        ("PATCH", "/api/runs/1", b'"just a string"', 422),
    ],
)
def test_nasty_input_gets_a_clear_refusal(fuzz_server, method, path, body, status):
    got, answer = (
        Api(fuzz_server.url).request(method, path, None) if body is None else _send(fuzz_server, method, path, body)
    )
    assert got == status, answer
    if status >= 400:
        assert answer["error"]


def test_csv_of_a_key_outside_latin1(fuzz_server):
    status, _ = _send(fuzz_server, "GET", f"/api/runs/1/series.csv?key={quote(ODD_KEY)}", None)
    assert status == 200


def test_lone_surrogate_in_a_new_name(fuzz_server):
    status, answer = _send(fuzz_server, "PATCH", "/api/runs/2", b'{"name": "\\ud800x"}')
    assert status == 400 and answer["error"]


def _send(srv, method: str, path: str, body: bytes | None):
    """A request with this exact body; (status, parsed JSON or text)."""
    req = urllib.request.Request(
        srv.url + path,
        data=body,
        method=method,
        headers={"Content-Type": "application/json"} if body is not None else {},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            data, status = resp.read(), resp.status
    except urllib.error.HTTPError as err:
        data, status = err.read(), err.code
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode("utf-8", "replace")
