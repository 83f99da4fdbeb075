"""docs/gradients.md's table, kept in step with the code: each situation it lists runs here on a real CPU
loop, and what the row says is what the server stores (pre-clip norms; the clipped one recorded or absent)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import wait_runs
from torch import nn

import gradwatch

DOC = Path(__file__).resolve().parent.parent / "docs" / "gradients.md"


def table() -> dict:
    """{situation: {column: text}} from the doc's table."""
    text = DOC.read_text().split("<!-- gradients-table:start -->")[1].split("<!-- gradients-table:end -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.strip().splitlines()]
    head, body = rows[0], rows[2:]
    return {row[0].strip("`"): dict(zip(head, row)) for row in body}


def total(params) -> float:
    """The norm of the gradients as they are now (the test's reference, read on the host)."""
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None))


def mlp():
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))


def data():
    return torch.randn(32, 6), torch.randn(32, 1)


def plain(run, steps=6, clip=None, accum=1):
    model, (x, y) = mlp(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    run.watch(model, opt)
    seen = []
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(accum):
            (nn.functional.mse_loss(model(x), y) / accum).backward()
        seen.append(total(model.parameters()))
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        run.log({"loss": 1.0})
    return seen


def amp(run, steps=6):
    model, (x, y) = mlp(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    run.watch(model, opt, scaler=scaler)
    seen = []
    for _ in range(steps):
        opt.zero_grad()
        scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
        seen.append(total(model.parameters()) / scaler.get_scale())
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        scaler.step(opt)
        scaler.update()
        run.log({"loss": 1.0})
    return seen


def closure(run, steps=3):
    model, (x, y) = mlp(), data()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.2, max_iter=4)
    run.watch(model, opt)
    seen = []

    def step():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        seen[-1] = total(model.parameters())  # the closure's last backward of this step counts
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        return loss

    for _ in range(steps):
        seen.append(None)
        opt.step(step)
    return seen


def several(run, steps=5):
    a, b, (x, y) = mlp(), mlp(), data()
    opt_a, opt_b = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (a, b))
    run.watch(a, opt_a, name="A")
    run.watch(b, opt_b, name="B")
    seen = []
    for _ in range(steps):
        norms = []
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            norms.append(total(model.parameters()))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            opt.step()
        seen.append(math.hypot(*norms))
        run.log({"loss": 1.0})
    return seen


def no_optimizer(run, steps=6):
    model, (x, y) = mlp(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    run.watch(model)
    seen = []
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        seen.append(total(model.parameters()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        run.log({"loss": 1.0})
    return seen


SITUATIONS = {
    "plain": plain,
    "clipped": lambda run: plain(run, clip=0.05),
    "amp": amp,
    "accumulation": lambda run: plain(run, accum=3, clip=0.05),
    "closure": closure,
    "several": several,
    "no_optimizer": no_optimizer,
}


def test_the_table_lists_every_situation_the_tests_run():
    assert set(table()) == set(SITUATIONS)


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
def test_each_row_says_what_the_server_stores(server, api, situation):
    torch.manual_seed(0)
    row = table()[situation]
    run = gradwatch.init(project="doc", name=situation, server=server.url)
    seen = SITUATIONS[situation](run)
    run.finish(timeout=10)
    wait_runs(api)
    keys = api.get("/api/runs/1/keys")
    stored = api.get("/api/runs/1/series?key=grad/global_norm")["values"]
    assert stored == pytest.approx(seen, rel=1e-4)  # what backward produced, before any clipping
    assert "after" not in row["`grad/global_norm` and per-layer norms"]  # the doc never says post-clip there
    clipped_column = row["`grad/global_norm_clipped`"]
    assert ("grad/global_norm_clipped" in keys) == clipped_column.startswith("recorded"), clipped_column
