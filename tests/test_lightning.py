"""GradwatchCallback with the real Lightning Trainer on CPU: metrics, gradients, status, NaN stop."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

L = pytest.importorskip("lightning")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import gradwatch  # noqa: E402
from gradwatch.lightning import GradwatchCallback  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations" / "lightning.md"


class Tiny(L.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 8, nan_at: int = -1, fail_at: int = -1):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)  # the same starting weights every run (the tests assert on their gradients)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        self.seen_norms = {}

    def training_step(self, batch, batch_idx):
        if self.global_step == self.hparams.fail_at:
            raise ValueError("bad batch")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if self.global_step >= self.hparams.nan_at >= 0:
            loss = loss * float("nan")
        self.log("train_loss", loss)
        if batch_idx % 2 == 0:
            self.log("sometimes", float(batch_idx))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def on_before_optimizer_step(self, optimizer):
        self.seen_norms[self.global_step] = self.net[0].weight.grad.norm().item()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def loaders():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    return DataLoader(data, batch_size=8), DataLoader(data, batch_size=16)


def trainer(callback, **kwargs):
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        **kwargs,
    )


def series(api, run_id, key):
    return api.get(f"/api/runs/{run_id}/series?key={key}")


def test_fit_streams_config_metrics_and_gradients(server, api):
    model = Tiny()
    callback = GradwatchCallback(project="pl", name="fit", server=server.url, signals_every=1)
    trainer(callback, max_epochs=2).fit(model, *loaders())
    run = api.get("/api/runs")[0]
    assert run["name"] == "fit" and run["status"] == "finished"
    detail = api.get(f"/api/runs/{run['id']}")
    assert detail["config"]["lr"] == 0.05 and detail["config"]["hidden"] == 8
    assert detail["config"]["trainer"]["max_epochs"] == 2
    rid = run["id"]
    assert series(api, rid, "train_loss")["steps"] == list(range(8))  # 4 batches x 2 epochs, one per step
    assert series(api, rid, "sometimes")["steps"] == [0, 2, 4, 6]  # only the steps it was logged at
    assert series(api, rid, "val_loss")["steps"] == [4, 8]  # no sanity-check value; one per epoch
    assert series(api, rid, "epoch")["values"] == [0.0, 1.0]
    keys = api.get(f"/api/runs/{rid}/keys")
    assert {"grad/global_norm", "lr", "grad/net.0.weight", "grad/net.2.bias"} <= set(keys)
    stored = series(api, rid, "grad/net.0.weight")
    assert stored["steps"] == sorted(model.seen_norms)  # captured at each step, before the optimizer
    for step, value in zip(stored["steps"], stored["values"]):
        assert math.isclose(value, model.seen_norms[step], rel_tol=1e-5)
    assert set(series(api, rid, "lr")["values"]) == {0.05}
    # The optimizer reaches the watcher: update ratios, output RMS and the step timer, at Lightning's steps.
    assert {"update_ratio/net.0.weight", "act_rms/net.0", "signals/update_ratio_max", "perf/step_time"} <= set(keys)
    # Lightning steps with a closure: the pre-step hook runs before backward, so every parameter is sampled
    # there (not only those that already have a gradient): the first step of each epoch has its ratio too.
    ratio_steps = series(api, rid, "update_ratio/net.0.weight")["steps"]
    assert set(ratio_steps) <= set(range(8)) and 0 in ratio_steps and len(ratio_steps) >= 7
    assert series(api, rid, "perf/step_time")["steps"] == list(range(1, 8))  # the first step has no previous end
    assert gradwatch.run is not None and gradwatch.run.finished


def test_every_optimizer_is_captured(server, api):
    class Two(Tiny):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.head = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            opt_a, opt_b = self.optimizers()
            loss = torch.nn.functional.mse_loss(self.head(self.net(x)), y)
            opt_a.zero_grad(), opt_b.zero_grad()
            self.manual_backward(loss)
            opt_a.step(), opt_b.step()
            self.log("train_loss", loss)

        def configure_optimizers(self):
            return torch.optim.SGD(self.net.parameters(), lr=0.1), torch.optim.Adam(self.head.parameters(), lr=0.003)

    trainer(GradwatchCallback(project="pl", name="two", server=server.url), max_steps=4, limit_val_batches=0).fit(
        Two(), loaders()[0]
    )
    rid = api.get("/api/runs")[0]["id"]
    # max_steps=4 optimizer steps are 2 batches: 2 training steps (one per batch, not one per optimizer),
    # each with one capture of both nets' fresh gradients.
    assert series(api, rid, "train_loss")["steps"] == [0, 1]
    assert series(api, rid, "grad/global_norm")["steps"] == series(api, rid, "grad/head.weight")["steps"] == [0, 1]
    assert set(series(api, rid, "lr/0")["values"]) == {0.1}
    assert set(series(api, rid, "lr/1")["values"]) == {0.003}
    assert {"grad/net.0.weight", "grad/head.weight"} <= set(api.get(f"/api/runs/{rid}/keys"))
    alerts = [a["kind"] for a in api.get(f"/api/runs/{rid}/alerts")]
    assert "missing_gradients" not in alerts  # every parameter is in one of the optimizers


def test_exception_marks_the_run_failed(server, api):
    with pytest.raises(ValueError, match="bad batch"):
        trainer(GradwatchCallback(project="pl", name="boom", server=server.url), max_epochs=1).fit(
            Tiny(fail_at=2), *loaders()
        )
    run = api.get("/api/runs")[0]
    assert run["status"] == "failed"
    detail = api.get(f"/api/runs/{run['id']}")
    assert detail["error"]["exc_type"] == "ValueError" and "bad batch" in detail["error"]["message"]


def test_on_nan_stop_ends_the_fit_cleanly(server, api):
    t = trainer(GradwatchCallback(project="pl", name="nan", server=server.url, on_nan="stop"), max_epochs=50)
    with pytest.warns(RuntimeWarning, match="NaN"):
        t.fit(Tiny(nan_at=3), loaders()[0])
    assert t.global_step == 4 and t.should_stop  # the NaN step ran, nothing after it
    run = api.get("/api/runs")[0]
    assert run["status"] == "finished" and run["last_step"] == 3
    assert "nan_loss" in [a["kind"] for a in api.get(f"/api/runs/{run['id']}/alerts")]


def test_docs_example_runs(server, api, monkeypatch):
    monkeypatch.setenv("GRADWATCH_SERVER", server.url)
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(code) == 1
    exec(compile(code[0], str(DOC), "exec"), {"__name__": "docs_example"})
    run = api.get("/api/runs")[0]
    assert (run["project"], run["name"], run["status"]) == ("lightning", "regressor", "finished")
    rid = run["id"]
    assert len(series(api, rid, "train_loss")["steps"]) == 12 and series(api, rid, "val_loss")["steps"] == [4, 8, 12]
    assert api.get(f"/api/runs/{rid}")["config"]["hidden"] == 16


def test_norms_are_captured_before_lightning_clips_and_the_clipped_one_beside(server, api):
    model = Tiny(lr=0.5)
    cb = GradwatchCallback(project="pl", name="clip", server=server.url)
    trainer(cb, max_epochs=1, gradient_clip_val=1e-3, limit_val_batches=0).fit(model, loaders()[0])
    rid = api.get("/api/runs")[0]["id"]
    ours, clipped = series(api, rid, "grad/global_norm"), series(api, rid, "grad/global_norm_clipped")
    assert ours["steps"] == clipped["steps"] == [0, 1, 2, 3]
    assert all(v > 1e-2 for v in ours["values"])  # pre-clip: the norm the model produced
    assert clipped["values"] == pytest.approx([1e-3] * 4, rel=1e-2)  # what reached the optimizer
    assert api.get(f"/api/runs/{rid}")["meta"]["loss_key"] == "train_loss"


def test_a_fit_resumed_from_a_checkpoint_continues_the_same_run(server, api, tmp_path):
    train, val = loaders()
    cb = GradwatchCallback(project="pl", name="resumable", server=server.url)
    first = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[cb],
        max_epochs=1,
    )
    first.fit(Tiny(), train, val)
    ckpt = first.checkpoint_callback.best_model_path
    assert ckpt
    # A new process: a fresh callback and trainer, resumed from the checkpoint.
    second = trainer(GradwatchCallback(project="pl", server=server.url), max_epochs=2)
    second.fit(Tiny(), train, val, ckpt_path=ckpt)
    runs = api.get("/api/runs")
    assert len(runs) == 1 and runs[0]["name"] == "resumable" and runs[0]["status"] == "finished"
    assert series(api, runs[0]["id"], "train_loss")["steps"] == list(range(8))  # 4 steps, then 4 more
    assert series(api, runs[0]["id"], "val_loss")["steps"] == [4, 8]
