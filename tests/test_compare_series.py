"""``/api/compare/series``: many runs aligned on one grid, grouped by a config key with bands and counts."""

from __future__ import annotations

import math
import urllib.parse

import numpy as np
import pytest
import sweep_data
from conftest import Api

import gradwatch
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings
from gradwatch_server.web.routes.compare_api import aggregate, align


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('cmp') / 'g.db'}"
    sweep_data.make(url, 60, steps=50)
    srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=url)).start()
    yield srv, Api(srv.url)
    srv.stop()


def series(api: Api, **params):
    return api.request("GET", "/api/compare/series?" + urllib.parse.urlencode(params))


def test_grouped_by_a_config_key_with_counts_and_bands(swept):
    _srv, api = swept
    code, out = series(api, project="sweep", group="lr", key="val/loss", points=25)
    assert code == 200 and out["group"] == "lr" and out["band"] == "std"
    assert [g["value"] for g in out["groups"]] == list(sweep_data.LRS)  # numeric groups in order
    assert [g["count"] for g in out["groups"]] == [12] * 5 and len(out["runs"]) == 60
    assert len(out["xs"]) == 25 and out["xs"][0] == pytest.approx(49 / 25 / 2)
    for g in out["groups"]:
        assert all(lo <= y <= hi for lo, y, hi in zip(g["lo"], g["y"], g["hi"]))
        assert g["n"] == [12] * 25 and len(g["run_ids"]) == 12
    best = min(out["groups"], key=lambda g: g["y"][-1])
    assert best["value"] == 1e-3  # the generated sweep is best at lr 1e-3
    code, med = series(api, project="sweep", group="optimizer", key="val/loss", agg="median", band="minmax")
    assert [g["label"] for g in med["groups"]] == ["adam", "adamw", "sgd"]
    assert all(g["lo"][0] < g["hi"][0] for g in med["groups"])


def test_ids_ungrouped_other_metric_as_x_and_bad_requests(swept):
    _srv, api = swept
    code, out = series(api, ids="3,1,2,999", key="loss", x="tokens", band="sem")
    assert code == 200 and [r["id"] for r in out["runs"]] == [3, 1, 2] and out["band"] == "none"
    assert [g["label"] for g in out["groups"]] == [r["name"] for r in out["runs"]]
    assert out["xs"][-1] > 100_000  # tokens, not steps
    assert series(api, project="sweep", where="config.lr <", key="loss")[0] == 400
    assert series(api, ids="1,x", key="loss")[0] == 400
    assert series(api, ids="1", key="loss", band="wide")[0] == 422
    code, none = series(api, ids="1,2", key="nope")
    assert code == 200 and none["groups"] == [] and none["missing"] == [1, 2]


def test_align_and_aggregate_keep_nan_out_and_fill_inside_a_runs_range():
    a = (np.arange(0, 10, dtype=float), np.arange(0, 10, dtype=float))
    b = (np.array([0.0, 8.0]), np.array([math.nan, 4.0]))  # a NaN point is skipped, not averaged in
    xs, m = align([a, b], 5)
    assert len(xs) == 5 and np.allclose(m[0], [0.5, 2.5, 4.5, 6.5, 8.5])
    assert np.isnan(m[1][:4]).all() and m[1][4] == 4.0
    centre, lo, hi, n = aggregate(m, "mean", "minmax")
    assert n.tolist() == [1, 1, 1, 1, 2] and centre[4] == pytest.approx(6.25) and (lo[4], hi[4]) == (4.0, 8.5)


def test_real_runs_with_nan_and_inf_through_the_client(server):
    for i in range(3):
        run = gradwatch.init(project="p", name=f"r{i}", server=server.url, config={"wd": [0.0, 0.1][i % 2]})
        for step in range(20):
            v = math.inf if (i == 2 and step == 5) else math.nan if (i == 1 and step == 3) else 1.0 + step + i
            run.log({"loss": v}, step=step)
        run.finish(timeout=30)
    code, out = series(Api(server.url), project="p", group="wd", key="loss", points=20)
    assert code == 200 and [g["count"] for g in out["groups"]] == [2, 1]
    zero = out["groups"][0]  # runs 0 and 2: run 2's inf at step 5 makes that bin's mean inf
    assert zero["y"][5] == "Infinity" and zero["y"][4] == pytest.approx(5.0 + 1)
