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


def _mlp_loop(run, steps, *, clip=None, eval_every=None, lr=0.1):
    """A real PyTorch loop as the pytorch/examples write it: step, then log; eval metrics between steps."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    run.watch(model, opt)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        run.log({"loss": loss})
        if eval_every and (i + 1) % eval_every == 0:
            run.log({"val_loss": loss.item() * 1.1})
    return model


def test_log_without_step_belongs_to_the_latest_optimizer_step(server, api):
    run = gradwatch.init(project="r", name="steps", server=server.url)
    _mlp_loop(run, 12, eval_every=4)
    run.finish(timeout=10)
    wait_runs(api)
    rid = api.get("/api/runs")[0]["id"]
    series = lambda key: api.get(f"/api/runs/{rid}/series?key={key}")["steps"]  # noqa: E731
    assert series("loss") == list(range(12))  # not shifted by the eval metrics logged between steps
    assert series("val_loss") == [3, 7, 11]
    assert series("grad/global_norm") == list(range(12))  # the capture of step k sits beside its loss


def test_a_declared_loss_key_travels_in_the_meta_and_is_checked_for_nan(server, api):
    run = gradwatch.init(project="r", name="lk", server=server.url, loss_key="nll", on_nan="stop")
    run.log({"nll": 1.0})
    run.log({"nll": float("nan")})
    assert run.should_stop  # the declared key is watched like any loss
    run.finish(timeout=10)
    wait_runs(api)
    got = api.get(f"/api/runs/{api.get('/api/runs')[0]['id']}")
    assert got["meta"]["loss_key"] == "nll"


def test_clipping_every_gradient_to_zero_raises_an_alert(server, api):
    run = gradwatch.init(project="r", name="clip0", server=server.url)
    _mlp_loop(run, 30, clip=0.0)
    run.finish(timeout=10)
    wait_runs(api)
    rid = api.get("/api/runs")[0]["id"]
    norms = api.get(f"/api/runs/{rid}/series?key=grad/global_norm")["values"]
    assert len(norms) == 30 and min(norms) > 0  # what backward produced, before the clipping
    clipped = api.get(f"/api/runs/{rid}/series?key=grad/global_norm_clipped")
    assert clipped["steps"] == list(range(30)) and set(clipped["values"]) == {0.0}  # what reached the weights
    assert set(api.get(f"/api/runs/{rid}/series?key=grad/clip_threshold")["values"]) == {0.0}
    alerts = api.get(f"/api/runs/{rid}/alerts")
    assert any(a["kind"] == "zero_gradients" and a["severity"] == "critical" for a in alerts), alerts


def test_the_runs_list_loss_is_each_runs_own_loss_key(server, api):
    plain = gradwatch.init(project="r", name="train_loss", server=server.url)  # a usual name, not declared
    for i in range(5):
        plain.log({"train_loss": 5.0 - i, "val_loss": 9.0})
    plain.finish(timeout=10)
    declared = gradwatch.init(project="r", name="nll", server=server.url, loss_key="nll")
    for i in range(3):
        declared.log({"nll": 1.0 + i, "loss_scale": 7.0})
    declared.finish(timeout=10)
    out = api.get("/api/sparklines?ids=1,2&key=loss&points=8")["runs"]
    assert out["1"]["key"] == "train_loss" and out["1"]["values"][-1] == 1.0
    assert out["2"]["key"] == "nll" and out["2"]["values"] == [1.0, 2.0, 3.0]


def test_a_run_continues_in_another_process_by_its_id(server, api):
    first = gradwatch.init(project="r", name="long", server=server.url, id="exp-1")
    _mlp_loop(first, 5)
    first.finish(timeout=10)
    # A new process (a restarted job): the same id continues the same server run, steps going on.
    again = gradwatch.init(project="r", server=server.url, id="exp-1", resume="must")
    assert again.resumed and again.name == "long"
    _mlp_loop(again, 3)
    again.log({"val_loss": 0.5})
    again.finish(timeout=10)
    runs = api.get("/api/runs")
    assert len(runs) == 1 and runs[0]["status"] == "finished"
    steps = api.get(f"/api/runs/{runs[0]['id']}/series?key=loss")["steps"]
    assert steps == list(range(8))  # 0-4 from the first process, 5-7 from the second
    assert api.get(f"/api/runs/{runs[0]['id']}/series?key=val_loss")["steps"] == [7]
    # By the server's run id too; and "must" with nothing to continue says so.
    third = gradwatch.init(project="r", server=server.url, resume=runs[0]["id"])
    assert third.uid == "exp-1"
    third.finish(timeout=10)
    with pytest.raises(ValueError, match="nothing to resume"):
        gradwatch.init(project="r", server=server.url, id="never-ran", resume="must")


def test_watch_without_an_optimizer_reads_gradients_before_the_scripts_clipping(server, api):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = gradwatch.init(project="r", name="preclip", server=server.url, alerts={"loss_plateau.patience": 40})
    run.watch(model)  # no optimizer: captured when backward ends
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    seen = []
    for _ in range(45):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        seen.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.0)))  # zeroes every update
        opt.step()
        run.log({"loss": loss})
    run.finish(timeout=10)
    wait_runs(api)
    rid = api.get("/api/runs")[0]["id"]
    norms = api.get(f"/api/runs/{rid}/series?key=grad/global_norm")["values"]
    assert norms == pytest.approx(seen, rel=1e-4) and min(norms) > 0  # the pre-clip norms
    # The weights never move, so the loss never falls: the plateau rule says so.
    kinds = {a["kind"] for a in api.get(f"/api/runs/{rid}/alerts")}
    assert "loss_plateau" in kinds
