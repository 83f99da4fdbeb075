"""The W&B surface: a script written for W&B runs with only the import changed (``import gradwatch as wandb``),
against a real server, offline, and disabled with no server at all; docs/wandb.md kept in step with the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gradwatch
from gradwatch import Api
from gradwatch.compat import init_args
from gradwatch.compat.config import Config
from gradwatch.compat.watch_args import translate

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "wandb_style.py"
DOC = (ROOT / "docs" / "wandb.md").read_text()


def table(name: str) -> list[tuple[str, str]]:
    body = DOC.split(f"<!-- {name}:start -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]
    rows = [line.split("|")[1:3] for line in body.strip().splitlines()[2:]]
    return [(a.strip(), b.strip()) for a, b in rows]


def test_docs_calls_table_matches_the_module():
    calls = table("wandb-calls")
    assert {status for _, status in calls} <= {"supported", "partial", "ignored"}
    for call, _status in calls:
        name = call.strip("`")
        assert hasattr(gradwatch, name), f"docs/wandb.md lists {name} but gradwatch has no such name"
    documented = {c.strip("`") for c, _ in calls}
    wandb_names = set(gradwatch.__all__[gradwatch.__all__.index("config") :]) | {"init", "log", "watch", "finish"}
    assert wandb_names <= documented, wandb_names - documented


def test_docs_init_table_matches_the_argument_split():
    args = {a.strip("`") for cell, _ in table("wandb-init") for a in re.findall(r"`(\w+)`", cell)}
    handled = set(init_args.META) | set(init_args.IGNORED) | {"notes", "mode"}
    assert handled <= args, handled - args
    for name in args - handled:
        assert name in gradwatch.RUN_OPTIONS or name in ("project", "name", "config"), name


def run_script(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


def test_a_wandb_script_runs_against_a_real_server_and_everything_is_there(server, tmp_path):
    done = run_script({"GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL_DIR": str(tmp_path / "spool")})
    assert done.returncode == 0, done.stderr[-3000:]
    ignored = [line for line in done.stderr.splitlines() if "init() ignores" in line]
    assert len(ignored) == 1 and "some_future_argument" in ignored[0] and "settings" in ignored[0]
    (run,) = Api(server.url).runs(where='group == "sweep-a" and job_type == "train"')
    assert run.status == "finished" and run.tags == ["baseline"]
    assert run.config["model"] == {"width": 16, "depth": 2} and run.config["lr"] == 0.05  # from argparse
    assert (run.config["batch"], run.config["optimizer"], run.config["seed"]) == (32, "sgd", 0)  # live updates
    assert run.run_summary["best_val"] == 0.25 and run.run_summary["final_loss"] > 0
    assert Api(server.url).runs(where="summary.best_val < 0.5")[0].id == run.id
    assert not Api(server.url).runs(where="summary.best_val > 0.5")
    kinds = {m["key"]: m["kind"] for m in run.media()}
    assert (
        kinds["grads"]
        == kinds["weights_np"]
        == kinds["gradients/0.weight"]
        == kinds["parameters/2.bias"]
        == "histogram"
    )
    assert (kinds["samples"], kinds["predictions"], kinds["note"]) == ("image", "table", "text")
    watched = run.histograms("gradients/0.weight")
    assert len(watched) == 4 and all(sum(h["counts"]) == 8 * 16 for h in watched)  # log_freq=3 of 12 passes
    images = run.images("samples", step=9)  # 4 steps an epoch, and its own step
    assert [i.get("caption") for i in images] == ["epoch 1", None] and images[0]["png"][:4] == b"\x89PNG"
    predictions = run.table("predictions")
    assert predictions["columns"] == ["step", "prediction", "label"] and len(predictions["rows"]) == 12
    assert run.table("note", step=4)["text"] == "epoch 0 done"
    history = run.history(["train/loss", "extra/b/c", "val/loss"])
    assert history["train/loss"].count() == 12 and history["val/loss"].count() == 3
    assert history["extra/b/c"].dropna().eq(2.0).all()
    assert history.attrs["summary"]["best_val"] == 0.25
    # log(commit=False) merged into the next call: the loss and the histogram share each step
    grads = {h["step"] for h in run.histograms("grads")}
    assert set(history["train/loss"].dropna().index) == grads
    detail = run.api.get(f"/api/runs/{run.id}")
    assert detail["meta"]["entity"] == "my-team" and detail["meta"]["metrics"]["val/*"]["step_metric"] == "epoch"
    alerts = run.api.get(f"/api/runs/{run.id}/alerts")
    assert [(a["kind"], a["severity"]) for a in alerts if a["kind"] == "script_alert"] == [("script_alert", "info")]


def test_disabled_mode_runs_with_no_server_and_writes_nothing(tmp_path):
    env = {
        "GRADWATCH_MODE": "disabled",
        "GRADWATCH_SERVER": "http://127.0.0.1:9",
        "GRADWATCH_SPOOL_DIR": str(tmp_path / "s"),
    }
    env["HOME"] = str(tmp_path / "home")  # ~/.cache/gradwatch/runs would be written by a run that is not disabled
    done = run_script(env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cannot reach" not in done.stderr and not (tmp_path / "s").exists() and not (tmp_path / "home").exists()


def test_offline_mode_spools_and_gradwatch_sync_delivers(server, tmp_path):
    spool = tmp_path / "spool"
    env = {"GRADWATCH_MODE": "offline", "GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL_DIR": str(spool)}
    done = run_script(env, "--steps", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gradwatch sync" in done.stderr and not Api(server.url).runs()  # nothing left the machine
    synced = subprocess.run(
        [sys.executable, "-m", "gradwatch_server.cli", "sync", str(spool), "--server", server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert synced.returncode == 0, synced.stderr
    (run,) = Api(server.url).runs()
    assert run.status == "finished" and {m["kind"] for m in run.media()} == {"histogram", "image", "table", "text"}


def test_log_commit_false_merges_into_the_next_step(tmp_path):
    run = gradwatch.init(project="w", server="http://127.0.0.1:9", mode="offline", spool_dir=str(tmp_path / "s"))
    sent = []
    run.recorder.put_record = lambda step, scalars, vectors, wall=None: sent.append((step, dict(scalars)))
    run.log({"a": 1.0}, commit=False)
    run.log({"b": 2.0}, commit=False)
    run.log({"c": 3.0})
    run.log({"d": 4.0})
    run.log({"e": 5.0}, step=10, commit=False)
    run.log({"f": 6.0}, step=11)  # a later step: what step 10 held goes first
    run.log({"g": 7.0}, commit=False)
    run.finish()  # finish sends what is still held
    assert sent == [
        (0, {"a": 1.0, "b": 2.0, "c": 3.0}),
        (1, {"d": 4.0}),
        (10, {"e": 5.0}),
        (11, {"f": 6.0}),
        (12, {"g": 7.0}),
    ]


def test_config_is_a_dict_with_attributes_kept_live():
    changes = []
    config = Config({"lr": 0.1, "model": {"depth": 2}}, on_change=changes.append)
    config.batch = 8
    config["seed"] = 1
    config.update({"lr": 0.2}, allow_val_change=True)
    config.setdefaults({"lr": 9, "wd": 0.0})
    assert config.lr == 0.2 and config.model["depth"] == 2 and dict(config)["wd"] == 0.0
    assert changes == [{"batch": 8}, {"seed": 1}, {"lr": 0.2}, {"wd": 0.0}]
    with pytest.raises(AttributeError):
        config.missing  # noqa: B018


def test_unknown_init_arguments_are_one_line_not_an_error(capsys):
    run = gradwatch.init(project="w", mode="disabled", entity="e", magic=True, brand_new=1)
    assert gradwatch.run is run and gradwatch.config is run.config
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "brand_new" in err[0] and "magic" in err[0] and "entity" not in err[0]
    gradwatch.log({"x": 1.0}, commit=False)
    gradwatch.alert("t", "x")
    gradwatch.define_metric("x", summary="max")
    run.log_artifact(gradwatch.Artifact("a"))
    gradwatch.finish(exit_code=1)
    assert run.finished


def test_watch_reads_wandb_arguments_in_either_form():
    model, opt = torch.nn.Linear(2, 1), None
    criterion = torch.nn.MSELoss()
    assert translate(criterion, "all", 1, {}) == (None, None, 1, "all", None)  # watch(model, criterion, "all")
    assert translate(None, None, 1, {"log": "parameters", "log_freq": 50}) == (None, None, 1, "parameters", 50)
    assert translate(None, None, 1, {"log_freq": 10})[3] == "gradients"  # W&B's default log
    assert translate(None, None, 1, {"log": None, "log_freq": 10})[3] is None
    assert translate(None, None, 5, {})[3] is None  # gradwatch's own watch(): no histograms unless asked
    with pytest.raises(TypeError):
        translate(None, None, 1, {"evrey": 10})  # a typo is still an error, as before
    del model, opt
