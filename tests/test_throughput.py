"""Step time, data-loader wait and throughput (gradwatch.capture.step_timer) and the ``throughput_drop`` rule."""

from __future__ import annotations

import time

import torch
from torch import nn
from training import Recorder, mlp

from gradwatch.capture.step_timer import DATA_WAIT, SAMPLES, STEP_TIME
from gradwatch.watcher import Watcher
from gradwatch_server.health import monitor as health


def loop(waits, batch_size=32):
    """A real CPU loop whose 'data loader' takes ``waits[i]`` seconds before step i's forward pass."""
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder()
    watcher = Watcher(rec, model, opt, batch_size=batch_size)
    x, y = torch.randn(batch_size, 4), torch.randn(batch_size, 1)
    for wait in waits:
        time.sleep(wait)  # the batch arriving
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.log({"loss": loss.detach()})
    watcher.remove()
    return rec


def perf(rec):
    return {r[1]: r[2] for r in rec.records() if r[0] == "rec" and STEP_TIME in r[2]}


def test_step_time_data_wait_and_samples_per_second_are_recorded():
    rec = loop([0.03] * 6)
    got = perf(rec)
    assert sorted(got) == [1, 2, 3, 4, 5]  # from the second step: a step time needs the previous step's end
    for values in got.values():
        assert 0.03 <= values[DATA_WAIT] <= values[STEP_TIME]
        assert values[SAMPLES] == 32 / values[STEP_TIME]


def test_a_slow_data_loader_is_a_throughput_drop_naming_the_loader():
    rec = loop([0.02] * 90 + [0.08] * 40)
    drops = [a for a in rec.alerts() if a.kind == "throughput_drop"]
    assert len(drops) == 1, [(a.step, a.message) for a in drops]
    assert 90 <= drops[0].step <= 90 + 25 and "data-loader wait" in drops[0].message
    assert drops[0].key == STEP_TIME


def test_a_steady_loop_stays_quiet():
    rec = loop([0.02] * 130)
    assert not [a for a in rec.alerts() if a.kind == "throughput_drop"]


def test_the_rule_on_a_stream_slower_steps_without_data_wait():
    m, alerts = health.Monitor(), []
    for step in range(200):
        t = 0.1 if step < 120 else 0.2
        alerts += m.observe(step, {STEP_TIME: t, DATA_WAIT: 0.001}, {})
    (drop,) = [a for a in alerts if a.kind == "throughput_drop"]
    assert drop.step == 120 + 9  # the median of the last 20 steps turns at the 10th slow one
    assert "fell 33%" in drop.message and "step itself got slower" in drop.message  # (median 0.15 s vs 0.1 s)
    # a 20 % slowdown is under the 30 % line
    m, alerts = health.Monitor(), []
    for step in range(200):
        alerts += m.observe(step, {STEP_TIME: 0.1 if step < 120 else 0.125}, {})
    assert not alerts


def test_watch_without_an_optimizer_records_no_step_time():
    model = nn.Linear(4, 1)
    rec = Recorder()
    Watcher(rec, model)
    model(torch.randn(2, 4)).sum().backward()
    assert not perf(rec)
