"""The LR range test: sweep the learning rate exponentially, find where the loss falls fastest.

``gradwatch.lr_find(model, optimizer, loader, loss_fn)`` trains for a few hundred steps while the
LR grows from ``start_lr`` to ``end_lr``, streams every step as its own run (``lr``, ``loss`` and
``lr_find/smoothed_loss``), stops once the smoothed loss blows up, then puts the model and the
optimizer back exactly as they were. The suggestion is the LR where the smoothed loss falls
fastest per decade of LR, before its minimum; it is stored as an ``lr_suggestion`` alert (value
and reason) and as ``lr_find/*`` scalars, and the run page draws loss against LR with it marked.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from itertools import cycle

from gradwatch.contract import keys

SKIP_START = 5  # the first points' slopes are mostly noise and EMA warm-up


@dataclass
class LRSuggestion:
    """What ``lr_find`` found.

    Attributes:
        lr: the suggested learning rate (None when the sweep was too short to tell).
        reason: one sentence saying why.
        lrs, losses, smoothed: the sweep, one entry per step.
        run_url: the sweep's page.
    """

    lr: float | None
    reason: str
    lrs: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    smoothed: list = field(default_factory=list)
    run_url: str = ""


def lr_find(
    model,
    optimizer,
    loader,
    loss_fn,
    *,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_steps: int = 200,
    beta: float = 0.95,
    diverge_factor: float = 4.0,
    project: str = "lr_find",
    name: str | None = None,
    **init_kwargs,
) -> LRSuggestion:
    """Run an LR range test and stream it as its own run; the model and optimizer are restored after.

    Args:
        model: the ``torch.nn.Module`` (left exactly as it was: weights, train/eval mode).
        optimizer: its optimizer (state and learning rates restored afterwards).
        loader: an iterable of ``(inputs, targets)`` batches; cycled if shorter than the sweep.
        loss_fn: ``loss_fn(model(inputs), targets)`` -> scalar loss tensor.
        start_lr, end_lr: the sweep's range; the LR grows by a constant factor each step.
        num_steps: steps at most (the sweep stops early once the loss blows up).
        beta: EMA weight of the smoothed loss (debiased).
        diverge_factor: the loss "blows up" when the smoothed loss exceeds this x its minimum.
        project, name, **init_kwargs: for the sweep's run (server, token, tags, ...).

    Returns:
        An ``LRSuggestion`` (``.lr``, ``.reason``, the sweep's points, ``.run_url``).
    """
    import torch

    if not (0 < start_lr < end_lr) or num_steps < 2:
        raise ValueError("lr_find needs 0 < start_lr < end_lr and num_steps >= 2")
    run = _open_run(
        model,
        optimizer,
        project,
        name,
        dict(start_lr=start_lr, end_lr=end_lr, num_steps=num_steps, beta=beta, diverge_factor=diverge_factor),
        init_kwargs,
    )
    saved = (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
        model.training,
        torch.get_rng_state(),
    )
    try:
        lrs, losses, smoothed, diverged_at = _sweep(
            run, model, optimizer, loader, loss_fn, start_lr, end_lr, num_steps, beta, diverge_factor
        )
        found = suggest(lrs, smoothed, diverged_at, diverge_factor)
        _record(run, found, lrs, smoothed, diverged_at)
        result = LRSuggestion(found[0], found[1], lrs, losses, smoothed)
    finally:
        model.load_state_dict(saved[0])
        optimizer.load_state_dict(saved[1])
        model.train(saved[2])
        torch.set_rng_state(saved[3])
        run.finish()
    result.run_url = run.url  # after finish: a sweep faster than the server's first answer knows its page too
    return result


def _open_run(model, optimizer, project, name, sweep: dict, init_kwargs: dict):
    """The sweep's own run (not the current ``gradwatch.run``); a no-op run on ranks other than 0."""
    from gradwatch.integrations.distributed import NoopRun, rank_and_world
    from gradwatch.run import Run

    config = {"lr_find": sweep, "model": type(model).__name__, "optimizer": type(optimizer).__name__}
    rank, world = rank_and_world()
    if world > 1 and rank != 0:
        return NoopRun(project, name, config)
    init_kwargs.setdefault("tags", ["lr_find"])
    return Run(project, name or f"lr-find {type(model).__name__}", config, **init_kwargs)


def _sweep(run, model, optimizer, loader, loss_fn, start_lr, end_lr, num_steps, beta, diverge_factor):
    """Train with a growing LR until num_steps or the blow-up; returns lrs, losses, smoothed, blow-up LR."""
    device = next((p.device for p in model.parameters()), None)
    gamma = (end_lr / start_lr) ** (1.0 / (num_steps - 1))
    lrs, losses, smoothed = [], [], []
    avg, best, diverged_at = 0.0, math.inf, None
    model.train()
    batches = cycle(loader)
    for step in range(num_steps):
        lr = start_lr * gamma**step
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = _to(next(batches), device)
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        avg = beta * avg + (1 - beta) * value
        smooth = avg / (1 - beta ** (step + 1))
        if not math.isfinite(smooth) or smooth > diverge_factor * best:
            diverged_at = lr
            break
        best = min(best, smooth)
        lrs.append(lr), losses.append(value), smoothed.append(smooth)
        run.log({keys.LR: lr, "loss": value, "lr_find/smoothed_loss": smooth}, step=step)
    return lrs, losses, smoothed, diverged_at


def _to(batch, device):
    """(inputs, targets) on the model's device."""
    inputs, targets = batch[0], batch[1]

    def move(t):
        return t.to(device) if hasattr(t, "to") and device is not None else t

    return move(inputs), move(targets)


def suggest(lrs: list, smoothed: list, diverged_at: float | None, diverge_factor: float = 4.0) -> tuple:
    """(suggested LR or None, reason): steepest fall of the smoothed loss per decade of LR, before its minimum."""
    if len(lrs) < SKIP_START + 3:
        return None, (
            f"too few steps ({len(lrs)}) before the loss blew up at lr={diverged_at:.2e}: lower start_lr"
            if diverged_at is not None
            else f"too few steps ({len(lrs)}): raise num_steps"
        )
    low = min(range(len(smoothed)), key=smoothed.__getitem__)
    logs = [math.log10(x) for x in lrs]
    slopes = {
        i: (smoothed[i + 1] - smoothed[i - 1]) / (logs[i + 1] - logs[i - 1])
        for i in range(max(SKIP_START, 1), min(low + 1, len(lrs) - 1))
    }
    if not slopes or min(slopes.values()) >= 0:
        return None, (
            f"the loss did not fall between lr={lrs[0]:.2e} and lr={lrs[-1]:.2e}: try a wider range (lower start_lr)"
        )
    best = min(slopes, key=slopes.get)
    ending = (
        f"it blew up (over {diverge_factor:g}x its minimum) at lr={diverged_at:.2e}"
        if diverged_at is not None
        else f"it had not blown up by lr={lrs[-1]:.2e}"
    )
    reason = (
        f"steepest descent of the smoothed loss at lr={lrs[best]:.2e} (falling {-slopes[best]:.3g} per decade "
        f"of LR); the loss was lowest at lr={lrs[low]:.2e} and {ending}"
    )
    return lrs[best], reason


def _record(run, found: tuple, lrs: list, smoothed: list, diverged_at: float | None) -> None:
    """The suggestion as scalars and as an info alert whose message is the reason."""
    lr, reason = found
    if not lrs:
        return
    last = len(lrs) - 1
    scalars = {"lr_find/min_loss_lr": lrs[min(range(len(smoothed)), key=smoothed.__getitem__)]}
    if diverged_at is not None:
        scalars["lr_find/diverged_lr"] = diverged_at
    if lr is not None:
        scalars["lr_find/suggested_lr"] = lr
    run.log(scalars, step=last)
    if run.recorder is not None:  # None: a NoopRun
        step = lrs.index(lr) if lr is not None else last
        run.recorder.put_event(
            {
                "type": "alert",
                "kind": "lr_suggestion",
                "severity": "info",
                "step": step,
                "key": keys.LR,
                "value": lr,
                "message": (f"Suggested learning rate {lr:.2e}: " if lr is not None else "No learning rate suggested: ")
                + reason,
            }
        )
