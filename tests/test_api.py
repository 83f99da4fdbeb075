"""API routes the pages lean on: CSV downloads of any key, sparklines, the favicon."""

from __future__ import annotations

import urllib.parse
import urllib.request

from conftest import Api

import gradwatch


def _run(url: str, name: str, values: dict) -> int:
    run = gradwatch.init(project="api", name=name, server=url)
    for step in range(20):
        run.log({k: v(step) for k, v in values.items()}, step=step)
    run.finish(timeout=30)
    return run.id


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, dict(resp.headers), resp.read()


def test_csv_of_a_key_outside_latin1_downloads_with_its_name(server):
    _run(server.url, "unicode", {"损失": lambda s: 1.0 / (s + 1), "loss 🔥": lambda s: float(s)})
    for key in ("损失", "loss 🔥"):
        status, headers, body = _get(f"{server.url}/api/runs/1/series.csv?key={urllib.parse.quote(key)}")
        assert status == 200
        lines = body.decode().splitlines()
        assert lines[0] == "step,wall_time,value" and len(lines) == 21
        disposition = headers["content-disposition"]
        assert disposition.startswith('attachment; filename="run1-') and disposition.isascii()
        encoded = disposition.split("filename*=UTF-8''")[1]
        assert urllib.parse.unquote(encoded) == f"run1-{key}.csv"


def test_sparklines_give_a_small_envelope_per_run_and_null_for_the_rest(server):
    api = Api(server.url)
    _run(server.url, "a", {"loss": lambda s: 10.0 - s})
    _run(server.url, "b", {"acc": lambda s: s / 20})
    out = api.get("/api/sparklines?ids=1,2,99&key=loss&points=8")
    assert out["key"] == "loss" and set(out["runs"]) == {"1", "2", "99"}
    one = out["runs"]["1"]
    assert one["total_points"] == 20 and len(one["steps"]) <= 8
    assert one["steps"][0] == 0 and one["steps"][-1] == 19 and one["values"][-1] == -9.0  # the latest loss is kept
    assert out["runs"]["2"] is None and out["runs"]["99"] is None
    assert api.request("GET", "/api/sparklines?ids=1,x")[0] == 400
    assert api.request("GET", "/api/sparklines?ids=1&points=2")[0] == 422
    assert api.request("GET", "/api/sparklines?ids=" + ",".join(map(str, range(300))))[0] == 400


def test_favicon_is_served(server):
    status, headers, body = _get(server.url + "/favicon.ico")
    assert status == 200 and headers["content-type"].startswith("image/svg+xml") and b"<svg" in body
