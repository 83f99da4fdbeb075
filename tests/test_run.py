"""init() checks its arguments at once; the run says where it is (or where its data goes)."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from conftest import wait_runs

import gradwatch


def test_numpy_values_in_alerts_tags_and_config_are_converted(server, api):
    run = gradwatch.init(
        project="r",
        name="np",
        server=server.url,
        alerts={"exploding_gradients.ceiling": np.float64(500)},
        tags=[np.str_("a"), "b"],
        config={"lr": np.float32(0.5), "layers": np.int64(3)},
    )
    run.log({"loss": 1.0})
    run.finish(timeout=10)
    got = api.get("/api/runs/1")
    assert got["tags"] == ["a", "b"] and got["config"] == {"lr": 0.5, "layers": 3}


@pytest.mark.parametrize("alerts", [{"loss_spike.window": -1}, {"no_such.rule": 1}, {"loss_spike.window": "big"}])
def test_bad_thresholds_are_refused_by_init(alerts):
    with pytest.raises(ValueError):
        gradwatch.init(project="r", alerts=alerts, server="http://127.0.0.1:1")


def test_bad_tags_are_refused_by_init():
    with pytest.raises(TypeError):
        gradwatch.init(project="r", tags="not-a-list", server="http://127.0.0.1:1")


def test_run_page_url_is_printed_once_and_run_url_points_at_it(server, api, capfd):
    run = gradwatch.init(project="r", name="url", server=server.url)
    wait_runs(api)
    for i in range(10):
        run.log({"loss": float(i)})
    run.finish(timeout=10)
    assert run.id == 1 and run.url == f"{server.url}/runs/1"
    err = capfd.readouterr().err
    assert err.count(f"gradwatch: run 1 → {server.url}/runs/1") == 1


def test_unreachable_server_is_said_once_with_where_the_data_goes(tmp_path, capfd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = gradwatch.init(project="r", name="down", server=f"http://127.0.0.1:{port}", spool_dir=str(tmp_path / "d"))
    for i in range(50):
        run.log({"loss": float(i)})
    run.finish(timeout=5)
    err = capfd.readouterr().err
    assert err.count("cannot reach the server") == 1 and str(tmp_path / "d") in err
    assert "token" not in (tmp_path / "d" / "run.json").read_text()


def test_log_after_finish_and_bad_input_never_raise(tmp_path):
    run = gradwatch.init(project="r", server="http://127.0.0.1:1")
    run.log({"loss": object()})
    run.log("not a dict")
    run.finish(timeout=1)
    run.log({"loss": 1.0})
