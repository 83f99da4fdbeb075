"""Blow-ups at the start of a run, losses not meant to fall, and warnings after a run already blew up:
real PyTorch loops (a nanoGPT-shaped char GPT, a tiny GAN) through the server's rules, and streams."""

from __future__ import annotations

import math

import nanogpt_shaped
import pytest
import torch
from torch import nn
from training import Recorder

from gradwatch.contract import rules as specs
from gradwatch.delivery.hello import check_alerts
from gradwatch_server.health.monitor import Monitor


def kinds(alerts):
    return [(a.kind, a.step) for a in alerts if not a.update]


def test_a_loss_that_rises_several_fold_in_its_first_steps_is_flagged_at_once_with_its_story():
    m, out = Monitor(), []
    for step, (loss, lr) in enumerate(zip([4.22, 9.12, 20.0, 24.8, 12.0], [0.083, 0.167, 0.25, 0.333, 0.417])):
        out += m.observe(step, {"loss": loss, "lr": lr}, {})
    assert kinds(out) == [("loss_divergence", 3)]  # 20.0, 24.8 are 3x and 3.7x the first two: before any window
    text = out[0].message
    assert "rose 5.9x in 3 steps from the start" in text and "LR 0.333 and rising (warmup" in text, text
    # a constant LR, and a warmup that ended before the blow-up, are told as such
    m, out = Monitor(), []
    for step, loss in enumerate([2.3, 2.2, 2.4, 2.5, 2.6, 2.5, 9.0, 9.5]):
        out += m.observe(step, {"loss": loss, "lr": min(0.5, 0.1 * (step + 1))}, {})
    assert "LR 0.5 after a 5-step warmup" in out[0].message, out[0].message
    m, out = Monitor(), []
    for step, loss in enumerate([2.3, 2.4, 7.5, 8.0]):
        out += m.observe(step, {"loss": loss, "lr": 0.5}, {})
    assert "LR 0.5 from the start (constant)" in out[0].message


def test_the_nanogpt_shaped_loop_at_lr_half_warmup_five_no_clip_is_alerted_by_step_eight():
    rec = Recorder()
    losses = nanogpt_shaped.train(rec, lr=0.5, warmup=5, clip=0.0, steps=12, block=32, batch=8)
    found = [a for a in rec.alerts() if not a.update]
    assert found and min(a.step for a in found) <= 8, (losses, kinds(found))
    first = min(found, key=lambda a: a.step)
    assert first.kind in ("loss_divergence", "exploding_gradients", "nan_loss"), kinds(found)


def test_the_nanogpt_shaped_loop_in_its_healthy_configuration_raises_nothing():
    rec = Recorder()
    losses = nanogpt_shaped.train(rec, lr=1e-3, warmup=10, clip=1.0, steps=40, block=32, batch=8)
    assert losses[-1] < losses[0]  # it learns
    assert kinds(rec.alerts()) == []


def test_a_warning_after_the_run_already_blew_up_says_again():
    m, out = Monitor(), []
    for step in range(300):
        loss = 30.0 if step in (2, 3) else 3.0
        out += m.observe(step, {"loss": loss}, {})
        if step % 10 == 0:
            ratio = 0.01 if step < 200 else 0.3  # the update ratio grows late in the run
            out += m.observe(step, {"signals/update_ratio_max": ratio}, {})
    warn = [a for a in out if a.kind == "instability_warning" and not a.update]
    assert warn and "already blew up at step 2" in warn[0].message and "again" in warn[0].message
    assert "comes before divergence" not in warn[0].message


def _gan_stream():
    """(step, scalars): a D loss that rises 7x at step 5 (it may), then update ratios that grow late."""
    out = []
    for step in range(500):
        out.append((step, {"loss_G": 3.0, "loss_D": 0.7 if step < 5 else 5.0}))
        if step >= 200 and step % 10 == 0:
            out.append((step, {"signals/update_ratio_max": 0.01 if step < 400 else 0.3}))
    return out


def test_a_discriminator_loss_that_rises_is_not_taken_for_a_blow_up_on_either_path():
    import numpy as np

    one, many = Monitor(), Monitor()
    expected = [a for step, sc in _gan_stream() for a in one.observe(step, sc, {})]
    warn = [a for a in expected if a.kind == "instability_warning" and not a.update]
    assert warn and "comes before divergence" in warn[0].message and "already blew up" not in warn[0].message
    got, head = [], [(s, sc) for s, sc in _gan_stream() if s < 200]
    for start in range(0, 200, 64):  # losses only: the batch path's bulk check reads them
        steps = np.arange(start, min(start + 64, 200))
        rows = np.arange(len(steps))
        got += many.observe_batch(steps, {k: (rows, np.array([head[s][1][k] for s in steps])) for k in head[0][1]}, {})
    got += [a for step, sc in _gan_stream() if step >= 200 for a in many.observe(step, sc, {})]
    assert [(a.kind, a.step, a.message) for a in got] == [(a.kind, a.step, a.message) for a in expected]


# -- losses that are not meant to fall ------------------------------------------------------------------
def gan(run, steps: int, seed: int) -> None:
    """A tiny 1-D GAN on CPU: D and G losses settle at an equilibrium, they do not fall."""
    torch.manual_seed(seed)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    D = nn.Sequential(nn.Linear(1, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    og, od = (
        torch.optim.Adam(G.parameters(), 2e-3, betas=(0.5, 0.9)),
        torch.optim.Adam(D.parameters(), 2e-3, betas=(0.5, 0.9)),
    )
    bce = nn.BCEWithLogitsLoss()
    for _ in range(steps):
        real, fake = 2.0 + 0.5 * torch.randn(64, 1), G(torch.randn(64, 4))
        loss_d = bce(D(real), torch.ones(64, 1)) + bce(D(fake.detach()), torch.zeros(64, 1))
        od.zero_grad()
        loss_d.backward()
        od.step()
        loss_g = bce(D(fake), torch.ones(64, 1))
        og.zero_grad()
        loss_g.backward()
        og.step()
        run.log({"loss_D": loss_d, "loss_G": loss_g})


@pytest.mark.parametrize("seed", range(4))
def test_a_gans_discriminator_and_generator_losses_raise_no_plateau(seed):
    rec = Recorder()
    gan(rec, 260, seed)
    assert [a for a in rec.alerts() if a.kind in ("loss_plateau", "loss_divergence")] == []


def test_loss_goals_declared_and_by_name():
    th = specs.merged({"goal.loss_D": "fall", "goal.ppl": "none"})
    assert specs.loss_goal("loss_D", th) == "fall"  # declared: watched again
    assert specs.loss_goal("loss_G", th) == specs.loss_goal("train/kl_loss", th) == "none"
    assert specs.loss_goal("entropy_loss", th) == specs.loss_goal("lossD", th) == "none"
    assert specs.loss_goal("loss", th) == specs.loss_goal("val/loss", th) == specs.loss_goal("train_loss", th) == "fall"
    assert specs.loss_goal("d_loss", th, main="d_loss") == "fall"  # the run's declared loss_key always falls
    # a declared "fall" brings the plateau rule back on a GAN's loss: the rule really is off by default
    flat = [(i, {"loss_D": 1.386 + 0.001 * math.sin(i)}) for i in range(220)]
    assert [a.kind for s, v in flat for a in Monitor().observe(s, v, {})] == []
    m = Monitor(th={"goal.loss_D": "fall"})
    assert "loss_plateau" in [a.kind for s, v in flat for a in m.observe(s, v, {})]


def test_a_bad_goal_is_refused_at_init():
    assert check_alerts({"goal.loss_G": "none", "loss_spike.factor": 8}) == {
        "goal.loss_G": "none",
        "loss_spike.factor": 8,
    }
    with pytest.raises(ValueError, match="goal.loss_G"):
        check_alerts({"goal.loss_G": "sideways"})
    with pytest.raises(ValueError, match="names no metric key"):
        specs.validate({"goal.": "none"})


# -- the LR schedule as early warning (server/health/lr_ramp.py) ----------------------------------------------
def _ramp_stream(cap=None, steps=200):
    """An LR raised 4 % a step (capped or not); the loss falls until the LR passes 0.05, then climbs."""
    out = []
    for step in range(steps):
        lr = 1e-3 * 1.04**step
        lr = min(lr, cap) if cap else lr
        loss = 2.0 * math.exp(-step / 30) + 0.05 + (max(0.0, lr - 0.05) * 20 if cap is None else 0.0)
        out.append((step, {"lr": lr, "grad/global_norm": 1.0}))
        out.append((step, {"loss": loss * (1 + 0.02 * math.sin(step))}))
    return out


def test_an_lr_still_rising_while_the_loss_climbs_from_its_best_is_warned_with_the_lr_story():
    m, out = Monitor(), []
    for step, scalars in _ramp_stream():
        out += m.observe(step, scalars, {})
    warn = [a for a in out if a.kind == "instability_warning" and not a.update]
    assert len(warn) == 1, kinds(out)
    text = warn[0].message
    assert "learning rate is still rising" in text and "above its best" in text and "comes before divergence" in text
    assert "Stop raising the learning rate" in text, text
    assert warn[0].step < min(s for s, sc in _ramp_stream() if sc.get("loss", 0) > 20), kinds(out)  # before the blow-up


def test_the_same_ramp_capped_or_a_constant_lr_raises_no_ramp_warning():
    for stream in (_ramp_stream(cap=0.02), [(s, {**sc, "lr": 0.01} if "lr" in sc else sc) for s, sc in _ramp_stream()]):
        m, out = Monitor(), []
        for step, scalars in stream:
            out += m.observe(step, scalars, {})
        assert not [a for a in out if a.kind == "instability_warning" and "learning rate" in a.message], kinds(out)


def test_the_ramp_check_sees_the_same_through_the_batch_path():
    import numpy as np

    stream = _ramp_stream()
    one, many = Monitor(), Monitor()
    expected = [a for step, sc in stream for a in one.observe(step, sc, {})]
    got = []
    for start in range(0, len(stream), 64):
        part = stream[start : start + 64]
        steps = np.array([s for s, _ in part])
        scalars = {}
        for key in ("lr", "grad/global_norm", "loss"):
            rows = [i for i, (_, sc) in enumerate(part) if key in sc]
            scalars[key] = (np.array(rows), np.array([part[i][1][key] for i in rows]))
        got += many.observe_batch(steps, scalars, {})
    assert [(a.kind, a.step, a.message) for a in got] == [(a.kind, a.step, a.message) for a in expected]
