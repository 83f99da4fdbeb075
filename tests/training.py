"""Small real PyTorch training scripts shared by the tests (healthy runs and pathologies)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(widths=(4, 16, 16, 1), act=nn.ReLU) -> nn.Sequential:
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), act()]
    return nn.Sequential(*layers[:-1])


def regression_data(n=256, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(n, 1, generator=g)


def train(run, steps=50, lr=0.05, model=None, opt_cls=torch.optim.SGD, watch=True, loss_fn=None, seed=0):
    """A plain supervised loop that logs loss each step; returns the model."""
    torch.manual_seed(seed)
    model = model or mlp()
    x, y = regression_data(d=model[0].in_features)
    opt = opt_cls(model.parameters(), lr=lr)
    if watch:
        run.watch(model, opt)
    for step in range(steps):
        idx = torch.randint(0, len(x), (32,))
        out = model(x[idx])
        loss = loss_fn(out, y[idx]) if loss_fn else ((out - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    return model


def fit(run, model, opt, x, y, steps):
    """Full-batch MSE steps with watch on; returns the last loss tensor."""
    run.watch(model, opt)
    for _ in range(steps):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    return loss


def train_slowly(server_url, steps, stop, name="live", nan_at=None, config=None, project="browser"):
    """A watched run at ~50 steps/s until ``stop`` is set, for pages watching it live."""
    import time

    import gradwatch

    run = gradwatch.init(project=project, name=name, server=server_url, config=config or {}, flush_interval=0.05)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch(model, opt)
    for step in range(steps):
        if stop.is_set():
            break
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": float("nan") if step == nan_at else loss})
        time.sleep(0.02)
    run.finish()
