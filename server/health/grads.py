"""Health rules on the gradient as a whole: non-finite values and exploding norms.

Each rule has its per-record check and its numpy bulk check (see rule.py) here, declared in ``RULES``;
the per-layer rules (vanishing, zero, missing) are in layers.py.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from gradwatch.protocol import is_loss_key
from gradwatch_server.health.common import (
    GLOBAL,
    Alert,
    Observation,
    episode,
    fmt,
    going_on,
    has_grads,
    healthy_run,
    names,
)
from gradwatch_server.health.rule import Columns, Rule

_INF = math.inf


def _loss_first_message(alert: Alert, loss_step: int) -> Alert:
    alert.layer = None
    alert.message = (
        f"Gradients are NaN/inf at step {alert.step} because the loss itself went non-finite first (at step "
        f"{loss_step}): every gradient computed from a NaN/inf loss is NaN/inf, so no layer is the origin. "
        "Look at what makes the loss non-finite: log(0) or division by zero in the loss (add an epsilon), a "
        "learning rate too high (the loss diverged before), or NaN in the inputs or targets."
    )
    return alert


def check_nonfinite_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """NaN/inf inside gradients, naming the first parameters (input side) affected, or the loss if it went first."""
    out = []
    losses = [v for k, v in obs.scalars.items() if is_loss_key(k)]
    pending = state.get("pending")
    if pending is not None and (obs.step != pending.step or losses):
        # The loss of a step is usually logged just after its gradients were captured: wait for it.
        state["pending"] = None
        loss_bad = any(not math.isfinite(v) for v in losses)
        out.append(_loss_first_message(pending, obs.step) if obs.step == pending.step and loss_bad else pending)
    if losses:
        state["loss_bad"] = obs.step if any(not math.isfinite(v) for v in losses) else None
    if not has_grads(obs):
        return out
    g = obs.scalars.get(GLOBAL)
    # The global norm is the L2 norm of the layer norms: when it is finite, every layer's is too.
    bad = (
        []
        if g is not None and math.isfinite(g)
        else [n for n, v in zip(obs.layers, obs.norms) if v is not None and not -_INF < v < _INF]
    )
    if not episode(state, bool(bad) or (g is not None and not math.isfinite(g)), th["nonfinite_gradients.cooldown"]):
        return out
    value = g if g is not None else math.nan
    where = f" in {names(bad)}" if bad else ""
    alert = Alert(
        "nonfinite_gradients",
        obs.step,
        value,
        "critical",
        layer=bad[0] if bad else None,
        key=GLOBAL,
        message=(
            f"Gradients contain NaN/inf{where} at step {obs.step}. The first listed parameter is "
            "nearest the input where it starts. Check for log(0), sqrt of negatives, division by "
            "zero or overflow in fp16; lower the learning rate or clip gradients."
        ),
    )
    if state.get("loss_bad") is not None:
        out.append(_loss_first_message(alert, state["loss_bad"]))
    elif losses:
        out.append(alert)
    else:
        state["pending"] = alert
    return out


def check_exploding_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Global grad norm far above its own rolling median (or its first steps'), or past an absolute ceiling."""
    g = obs.scalars.get(GLOBAL)
    if g is None or not math.isfinite(g):
        return []
    history = state.get("history")
    if history is None:
        history = state["history"] = deque(maxlen=int(th["exploding_gradients.window"]))
    early = len(history) < th["exploding_gradients.min_history"]
    factor = th["exploding_gradients.early_factor" if early else "exploding_gradients.factor"]
    baseline = statistics.median(history) if history else None
    history.append(g)
    # The absolute floor: a converged model's norm of 0.0015 is 1,000x a median of 1e-6 and still harmless.
    relative = (
        baseline is not None and baseline > 0 and g > factor * baseline and g > th["exploding_gradients.min_norm"]
    )
    bad = g > th["exploding_gradients.ceiling"] or relative
    opened = episode(state, bad, th["exploding_gradients.cooldown"])
    if going_on(state, bad, opened):
        return [Alert("exploding_gradients", obs.step, g, "warning", "", key=GLOBAL, update=1)]
    if not opened:
        return []
    top = _largest_layer(obs)
    if relative:
        why = f"{g / baseline:,.0f}x its {'first steps' if early else 'recent'} median {fmt(baseline)}"
    else:
        why = f"above the {fmt(th['exploding_gradients.ceiling'])} warning level"
    return [
        Alert(
            "exploding_gradients",
            obs.step,
            g,
            "warning",
            layer=top,
            key=GLOBAL,
            message=(
                f"Global gradient norm {fmt(g)} at step {obs.step} is {why}"
                + (f"; largest in {top}" if top else "")
                + ". Clip gradients (clip_grad_norm_), lower the learning rate or add warmup before the loss goes NaN."
            ),
        )
    ]


def _largest_layer(obs: Observation) -> str | None:
    finite = [(v, n) for n, v in zip(obs.layers, obs.norms) if v is not None and math.isfinite(v)]
    return max(finite)[1] if finite else None


def flush_nonfinite(state: dict) -> list[Alert]:
    """The alert held back for its step's loss, released because the run ended."""
    pending = state.pop("pending", None)
    return [pending] if pending is not None else []


# -- the same rules over a whole batch (numpy) -------------------------------------------------------------
def _grad_rows(n, gnorm, grad) -> np.ndarray:
    """Which records carry gradient information (the rows the gradient rules run on)."""
    has = np.zeros(n, dtype=bool)
    if gnorm is not None:
        has[gnorm[0]] = True
    if grad is not None and grad[2].shape[1] > 0:
        has[grad[1]] = True
    return has


def bulk_nonfinite_gradients(state: dict, cols: Columns) -> bool:
    """No gradient of the batch is NaN/inf and no alert is held: only the last loss's verdict is kept."""
    if state.get("pending") is not None:
        return False
    steps, gnorm, grad = cols.steps, cols.gnorm, cols.grad
    n = len(steps)
    bad = np.zeros(n, dtype=bool)
    if grad is not None:
        _, rows, values, present = grad
        bad[rows] = (present & ~np.isfinite(values)).any(axis=1)
    if gnorm is not None:
        bad[gnorm[0]] = ~np.isfinite(gnorm[1])  # a record's global norm, when there, decides alone
    if bad.any():
        return False
    last, last_bad = -1, False
    for _, rows, vals in cols.losses:
        if len(rows):
            r = int(rows[-1])
            here = bool((~np.isfinite(vals[rows == r])).any())
            if r > last:
                last, last_bad = r, here
            elif r == last:
                last_bad = last_bad or here
    if last >= 0:
        state["loss_bad"] = int(steps[last]) if last_bad else None
    healthy_run(state, int(_grad_rows(n, gnorm, grad).sum()), cols.th["nonfinite_gradients.cooldown"])
    return True


def bulk_exploding_gradients(state: dict, cols: Columns) -> bool:
    """No finite global norm of the batch is past the ceiling or factor x a lower bound of its baseline."""
    th, gnorm = cols.th, cols.gnorm
    if gnorm is None:
        return True
    g = gnorm[1][np.isfinite(gnorm[1])]
    if not len(g):
        return True
    W, mh = int(th["exploding_gradients.window"]), th["exploding_gradients.min_history"]
    history = state.get("history") or ()
    old = np.asarray(list(history), dtype=np.float64)
    if (g > th["exploding_gradients.ceiling"]).any():
        return False
    # A lower bound of each value's baseline (the median of its window): the least value seen so far.
    seen = np.concatenate([old, g])
    low = (
        np.minimum.accumulate(seen)[len(old) - 1 : -1]
        if len(old)
        else np.concatenate([[np.inf], np.minimum.accumulate(g)[:-1]])
    )
    sizes = np.minimum(len(old) + np.arange(len(g)), W)
    factor = np.where(sizes < mh, th["exploding_gradients.early_factor"], th["exploding_gradients.factor"])
    has = sizes > 0
    calm = (low[has] > 0) & (g[has] <= factor[has] * low[has]) | (g[has] <= th["exploding_gradients.min_norm"])
    if not calm.all():
        return False
    if "history" not in state:
        state["history"] = deque(maxlen=W)
    state["history"].extend(g[-W:].tolist())
    healthy_run(state, len(g), th["exploding_gradients.cooldown"])
    return True


RULES = (
    # Not needs_grads: it also follows the losses, to release an alert held for its step's loss.
    Rule(
        "nonfinite",
        "nonfinite_gradients",
        check_nonfinite_gradients,
        bulk_nonfinite_gradients,
        reads=frozenset({GLOBAL}),
        losses=True,
        flush=flush_nonfinite,
    ),
    Rule(
        "exploding",
        "exploding_gradients",
        check_exploding_gradients,
        bulk_exploding_gradients,
        reads=frozenset({GLOBAL}),
        needs_grads=True,
    ),
)
