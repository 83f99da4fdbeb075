"""watch() on the CUDA path, with the one thing this machine lacks (a GPU) faked at torch.cuda."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from training import mlp, regression_data

import gradwatch

GIB = 2**30


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda answers like an 80 GiB device whose reserved memory grows 4 GiB per step."""
    counters = {"step": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(name="Fake GPU", total_memory=80 * GIB)
    )
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: (2 + counters["step"]) * GIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: (4 + 4 * counters["step"]) * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: (3 + counters["step"]) * GIB)
    return counters


def test_cuda_memory_counters_are_recorded_and_pressure_alerts(server, api, fake_gpu):
    from gradwatch.watcher import Watcher

    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = gradwatch.init(project="gpu", name="fake", server=server.url)
    watcher = Watcher(run.recorder, model, opt)  # what run.watch(model, opt) installs
    watcher.device = torch.device("cuda")  # the model is on CPU; its watcher reads the (faked) CUDA counters
    x, y = regression_data()
    for step in range(25):
        fake_gpu["step"] = step
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    watcher.remove()
    run.finish()
    meta = api.get("/api/runs/1")["meta"]
    assert meta["device"].startswith("cuda")  # init() leaves CUDA alone: the capacity comes from the watcher
    keys = api.get("/api/runs/1/keys")
    assert {"memory/cuda_allocated", "memory/cuda_reserved", "memory/cuda_peak", "memory/cuda_total"} <= set(keys)
    assert api.get("/api/runs/1/series?key=memory/cuda_total")["values"] == [80.0 * GIB]  # sent once
    assert "memory/rss" not in keys
    reserved = api.get("/api/runs/1/series?key=memory/cuda_reserved")["values"]
    assert reserved == [float((4 + 4 * s) * GIB) for s in range(25)]
    # 95% of 80 GiB is 76 GiB: reserved reaches 76 GiB at step 18; one alert for the episode.
    alerts = [a for a in api.get("/api/runs/1/alerts") if a["kind"] == "memory_pressure"]
    assert [a["step"] for a in alerts] == [18] and alerts[0]["severity"] in ("warning", "critical")
    state = api.get("/api/runs/1/series?key=memory/optimizer_state")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    n = len(list(model.parameters()))
    # Adam keeps two moments per parameter plus a 4-byte step counter per tensor; nothing before step 1.
    assert state["steps"][:2] == [0, 1] and state["values"][:2] == [0.0, 2 * params + 4 * n]


# -- the trainable set and the layer order, seen by a run that only records what it is given ------------
class FakeRecorder:
    """The five Recorder methods the watcher calls, recording what it hands over (in order)."""

    def __init__(self):
        self.items, self.step = [], 0

    def put_record(self, step, scalars, vectors):
        self.items.append(("rec", step, scalars, vectors))

    def put_layout(self, key, names):
        self.items.append(("layout", key, list(names)))

    def put_event(self, event):
        self.items.append(("event", event))

    def current_step(self):
        return self.step

    def guarded(self, fn):
        fn()

    def layouts(self, key="grad"):
        return [i[2] for i in self.items if i[0] == "layout" and i[1] == key]

    def grad_records(self):
        return [i for i in self.items if i[0] == "rec" and "grad" in i[3]]


def _steps(run, model, opt, n, before_step=None):
    from gradwatch.watcher import Watcher

    watcher = Watcher(run, model, opt)
    x, y = regression_data(d=4)
    for step in range(n):
        if before_step:
            before_step(step)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.step += 1
    watcher.remove()
    return watcher


def test_layers_frozen_after_watch_leave_the_layout_and_are_not_missing():
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = FakeRecorder()

    def freeze_at_3(step):
        if step == 3:
            for p in model[0].parameters():
                p.requires_grad_(False)
            model[0].weight.grad = model[0].bias.grad = None

    _steps(run, model, opt, 6, freeze_at_3)
    all_names = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert run.layouts() == [all_names, all_names[2:]]
    signals = ("update_ratio", "act_rms")  # the layer signals' layouts and records come on their own
    kinds = [
        i[0]
        for i in run.items
        if not (i[1] in signals if i[0] == "layout" else set(i[3]) & set(signals) or "perf/step_time" in i[2])
    ]
    assert kinds.index("layout", 1) == 4  # the new layout comes right before the first record that uses it
    for rec in run.grad_records():
        value, missing, size = rec[3]["grad"]
        assert missing == [] and rec[2]["grad/missing_count"] == 0.0
    assert [rec[3]["grad"][2] for rec in run.grad_records()] == [6, 6, 6, 4, 4, 4]


def test_unfrozen_layers_come_back_without_an_optimizer_too():
    from gradwatch.watcher import Watcher

    model = mlp()
    for p in model[0].parameters():
        p.requires_grad_(False)
    run = FakeRecorder()
    watcher = Watcher(run, model)  # no optimizer: captures after each backward
    x, y = regression_data(d=4)
    for step in range(4):
        if step == 2:
            for p in model[0].parameters():
                p.requires_grad_(True)
        ((model(x) - y) ** 2).mean().backward()
        run.step += 1
    watcher.remove()
    assert [len(names) for names in run.layouts()] == [4, 6]
    assert [rec[3]["grad"][2] for rec in run.grad_records()] == [4, 4, 6, 6]


class _LateEmbedding(nn.Module):
    """A Transformer whose input embedding is registered last (as in pytorch/examples word_language_model)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 1)
        self.decoder = nn.Linear(8, 20)
        self.embed = nn.Embedding(20, 8)

    def forward(self, tokens):
        return self.decoder(self.encoder(self.embed(tokens)))


def test_layer_order_is_the_order_layers_run_not_the_order_they_were_registered():
    from gradwatch.watcher import Watcher

    torch.manual_seed(0)
    model = _LateEmbedding()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = FakeRecorder()
    watcher = Watcher(run, model, opt)
    tokens = torch.randint(0, 20, (4, 5))
    for _ in range(2):
        loss = model(tokens).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    watcher.remove()
    (names,) = run.layouts()
    assert names[0] == "embed.weight" and names[-2:] == ["decoder.weight", "decoder.bias"]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    # MultiheadAttention uses its out_proj's weights itself: they stay beside the attention block.
    attn = [n for n in names if ".self_attn." in n]
    assert names.index(attn[-1]) - names.index(attn[0]) == len(attn) - 1
    assert not watcher.order_handles  # the order is recorded once, then the hooks are gone


def test_without_a_forward_after_watch_the_order_is_registration_order():
    from gradwatch.watcher import Watcher

    model = _LateEmbedding()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model(torch.randint(0, 20, (2, 3))).sum().backward()  # forward and backward before watch()
    run = FakeRecorder()
    watcher = Watcher(run, model, opt)
    opt.step()
    watcher.remove()
    assert run.layouts() == [[n for n, _ in model.named_parameters()]]
