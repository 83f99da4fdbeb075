"""Every health rule against real PyTorch training runs: pathologies fire, healthy runs stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradwatch
from training import fit, mlp, regression_data, train


def alerts_of(api, run_id=1):
    return api.get(f"/api/runs/{run_id}/alerts")


def kinds(api, run_id=1):
    return sorted({a["kind"] for a in alerts_of(api, run_id)})


# -- healthy corpus: no alerts ------------------------------------------------------------
def test_healthy_regression_converging_to_tiny_loss(server, api):
    run = gradwatch.init(project="healthy", name="converge", server=server.url)
    x, _ = regression_data()
    model = nn.Linear(4, 1)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])  # noise-free: loss goes to ~0, so do the grads
    loss = fit(run, model, torch.optim.Adam(model.parameters(), lr=0.05), x, y, 400)
    run.finish()
    assert loss.item() < 1e-6
    assert alerts_of(api) == []


def test_healthy_cnn_classifier(server, api):
    torch.manual_seed(0)
    x = torch.randn(128, 1, 12, 12)
    y = (x.mean((1, 2, 3)) > 0).long()
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = gradwatch.init(project="healthy", name="cnn", server=server.url)
    run.watch(model, opt)
    for step in range(120):
        idx = torch.randint(0, 128, (32,))
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    run.finish()
    assert alerts_of(api) == []


def test_healthy_transformer_with_clipping_and_schedule(server, api):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 32), nn.TransformerEncoder(
        nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2), nn.Linear(32, 50))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    run = gradwatch.init(project="healthy", name="transformer", server=server.url)
    run.watch(model, opt)
    for _ in range(100):
        tokens = torch.randint(0, 50, (16, 12))
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 50), tokens.roll(1, 1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        run.log({"loss": loss})
    run.finish()
    assert alerts_of(api) == [], alerts_of(api)


def test_fine_tuning_with_frozen_layers_is_not_missing_gradients(server, api):
    model = mlp()
    for p in model[0].parameters():
        p.requires_grad_(False)
    run = gradwatch.init(project="healthy", name="finetune", server=server.url)
    train(run, steps=60, lr=0.01, model=model, opt_cls=lambda ps, lr: torch.optim.SGD(
        [p for p in ps if p.requires_grad], lr=lr))
    run.finish()
    assert alerts_of(api) == []


# -- pathologies: each fires, once, naming where -------------------------------------------
def test_too_high_learning_rate_warns_before_the_loss_goes_nan(server, api):
    run = gradwatch.init(project="sick", name="lr-too-high", server=server.url)
    train(run, steps=80, lr=2.0)
    run.finish()
    found = {a["kind"]: a for a in alerts_of(api)}
    assert "exploding_gradients" in found and "nan_loss" in found
    assert found["exploding_gradients"]["step"] < found["nan_loss"]["step"]
    loss = api.get("/api/runs/1/series?key=loss")
    first_bad = next(s for s, v in zip(loss["steps"], loss["values"]) if isinstance(v, str))
    assert found["nan_loss"]["step"] == first_bad


def test_sqrt_of_zero_gives_nonfinite_gradients(server, api):
    run = gradwatch.init(project="sick", name="sqrt0", server=server.url)
    train(run, steps=5, loss_fn=lambda out, y: torch.sqrt(((out - y) * 0).pow(2).sum()))
    run.finish()
    found = {a["kind"]: a for a in alerts_of(api)}
    assert found["nonfinite_gradients"]["step"] == 0
    assert found["nonfinite_gradients"]["layer"] == "0.weight"


def test_deep_sigmoid_network_has_vanishing_gradients(server, api):
    torch.manual_seed(0)
    model = mlp(widths=(4,) + (32,) * 14 + (1,), act=nn.Sigmoid)
    run = gradwatch.init(project="sick", name="deep-sigmoid", server=server.url)
    train(run, steps=40, lr=0.1, model=model)
    run.finish()
    found = {a["kind"]: a for a in alerts_of(api)}
    assert list(found) == ["vanishing_gradients"]
    assert found["vanishing_gradients"]["layer"].startswith("0.")


def test_dead_relu_layer_has_zero_gradients(server, api):
    model = mlp()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every first-layer unit is dead: its ReLU never passes gradient
    run = gradwatch.init(project="sick", name="dead-relu", server=server.url)
    train(run, steps=30, lr=0.01, model=model)
    run.finish()
    found = {a["kind"]: a for a in alerts_of(api)}
    assert "zero_gradients" in found and found["zero_gradients"]["layer"] == "0.weight"
    assert "0.bias" in found["zero_gradients"]["message"]


def test_detach_in_forward_gives_missing_gradients(server, api):
    class Cut(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.head = nn.Linear(4, 8), nn.Linear(8, 1)

        def forward(self, x):
            return self.head(torch.relu(self.encoder(x)).detach())

    run = gradwatch.init(project="sick", name="detached", server=server.url)
    model = Cut()
    x, y = regression_data()
    fit(run, model, torch.optim.SGD(model.parameters(), lr=0.01), x, y, 10)
    run.finish()
    found = {a["kind"]: a for a in alerts_of(api)}
    assert list(found) == ["missing_gradients"]
    assert found["missing_gradients"]["layer"] == "encoder.weight" and "encoder" in found["missing_gradients"]["message"]


def test_parameters_left_out_of_the_optimizer(server, api):
    model = mlp()
    run = gradwatch.init(project="sick", name="orphans", server=server.url)
    run.watch(model, torch.optim.SGD(model[4].parameters(), lr=0.01))
    run.log({"loss": 1.0})
    run.finish()
    found = {a["kind"]: a for a in alerts_of(api)}
    assert "0.weight" in found["missing_gradients"]["message"]


def test_corrupted_batch_causes_loss_spike(server, api):
    torch.manual_seed(0)
    x, y = regression_data()
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    run = gradwatch.init(project="sick", name="bad-batch", server=server.url)
    run.watch(model, opt)
    for step in range(120):
        idx = torch.randint(0, 256, (32,))
        target = y[idx] * (100.0 if step == 100 else 1.0)  # one corrupted batch
        loss = ((model(x[idx]) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    run.finish()
    spikes = [a for a in alerts_of(api) if a["kind"] == "loss_spike"]
    assert [a["step"] for a in spikes] == [100]


def test_amp_grad_scaler_skipping_steps(server, api):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    run = gradwatch.init(project="sick", name="amp", server=server.url)
    run.watch(model, opt, scaler=scaler)
    x, y = regression_data()
    for _ in range(12):
        loss = ((model(x) - y) ** 2).mean() * 1e36  # overflows once scaled: every step is skipped
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        run.log({"loss": loss})
    run.finish()
    found = {a["kind"]: a for a in alerts_of(api)}
    assert "amp_overflow" in found
    scale = api.get("/api/runs/1/series?key=amp/scale")["values"]
    assert scale[0] > scale[-1]


@pytest.mark.parametrize("mode", ["raise", "stop"])
def test_on_nan_modes_stop_the_loop(server, api, mode):
    run = gradwatch.init(project="sick", name=f"on-nan-{mode}", server=server.url, on_nan=mode)
    steps_done = 0
    with pytest.raises(gradwatch.TrainingDiverged) if mode == "raise" else _nothing():
        for step in range(100):
            run.log({"loss": torch.tensor(float("nan") if step == 7 else 1.0)})
            steps_done += 1
            if run.should_stop:
                break
    run.finish("failed")
    assert steps_done == (7 if mode == "raise" else 8)
    assert run.diverged[0] == 7
    assert api.get("/api/runs/1")["status"] == "failed"


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_crashing_script_records_exception_and_diagnosis(server, api):
    model = nn.Linear(4, 2)
    with pytest.raises(RuntimeError):
        with gradwatch.init(project="sick", name="shape", server=server.url) as run:
            run.watch(model, torch.optim.SGD(model.parameters(), lr=0.1))
            model(torch.randn(3, 5))
    detail = api.get("/api/runs/1")
    assert detail["status"] == "failed"
    assert detail["error"]["exc_type"] == "RuntimeError"
    assert detail["error"]["diagnosis"]["title"] == "Shape mismatch"
    assert "Traceback" in detail["error"]["traceback"]


def test_out_of_memory_is_an_alert_with_memory_state(server, api):
    model = nn.Linear(4, 2)
    with pytest.raises(torch.OutOfMemoryError):
        with gradwatch.init(project="sick", name="oom", server=server.url) as run:
            run.watch(model, torch.optim.Adam(model.parameters()))
            # No CUDA device here: raise the error PyTorch raises when allocation fails.
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    found = {a["kind"]: a for a in alerts_of(api)}
    assert found["memory_pressure"]["severity"] == "critical"
    assert "params=" in found["memory_pressure"]["message"]
    assert api.get("/api/runs/1")["error"]["diagnosis"]["title"] == "CUDA ran out of memory"
